"""YAML helpers: a safe loader that rejects duplicate keys.

PyYAML keeps the last of two equal keys silently; for a ledger that would
turn "this GPU has two roles" into "this GPU has the second role", so every
file the project reads goes through :func:`load`.
"""

from __future__ import annotations

from typing import Any

import yaml

from amdgpu_virt import exception


class _StrictLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode,
                       deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, _value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                'while constructing a mapping', node.start_mark,
                'found duplicate key %r' % (key,), key_node.start_mark)
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(text: str, source: str) -> Any:
    """Parse YAML (or JSON) ``text``; ``source`` names it in errors.

    :raises AmdgpuVirtError: with the source, line and column.
    """
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506
    except yaml.MarkedYAMLError as err:
        # PyYAML's own text names the stream "<unicode string>" and spans
        # several lines; say the line and column of the fault on one.
        mark = err.problem_mark or err.context_mark
        where = ('' if mark is None else ' at line %d, column %d' % (
            mark.line + 1, mark.column + 1))
        what = '; '.join(part for part in (err.context, err.problem)
                         if part)
        raise exception.AmdgpuVirtError('%s is not valid YAML%s: %s' % (
            source, where, what or err)) from None
    except yaml.YAMLError as err:
        raise exception.AmdgpuVirtError(
            '%s is not valid YAML: %s' % (source, err)) from None


def load_file(path: str, what: str = 'file') -> Any:
    """Read and parse the YAML (or JSON) file ``path``.

    :param what: what the file is (``fleet file``, ``ledger``...), so that
        an error says which input was wrong.
    :raises AmdgpuVirtError: the file cannot be read or is not YAML.
    """
    try:
        with open(path, encoding='utf-8') as handle:
            text = handle.read()
    except OSError as err:
        raise exception.AmdgpuVirtError(
            'cannot read %s %s: %s' % (what, path, err.strerror)) from None
    return load(text, '%s %s' % (what, path))


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
