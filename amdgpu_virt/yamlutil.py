"""YAML and JSON parsing of untrusted text, within bounds.

PyYAML keeps the last of two equal keys silently; for a ledger that would
turn "this GPU has two roles" into "this GPU has the second role", so every
file the project reads goes through :func:`load` (or :func:`load_file`),
which refuses duplicate keys. It also refuses, with an error naming the
source and the line, what would make a small file cost unbounded time or
memory once loaded:

* aliases and merge keys (``<<``) that expand to more than
  :data:`MAX_NODES` nodes (the "billion laughs" and merge bombs: the
  loader shares aliased objects, but every consumer walks them expanded),
  and recursive aliases;
* nesting deeper than :data:`MAX_DEPTH`, textual or through aliases;
* integers (or plain scalars that look like numbers) with more than
  :data:`MAX_INT_DIGITS` characters.

:func:`load_json` applies the same depth bound to JSON (whose parser
otherwise fails with a ``RecursionError`` or builds documents that every
recursive consumer then fails on). Files are read with
:func:`amdgpu_virt.fileutil.read_text` (regular files only, size-capped).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import yaml

from amdgpu_virt import exception
from amdgpu_virt import fileutil

#: most nodes a document may expand to (aliases and merges counted)
MAX_NODES = 500_000
#: deepest nesting of mappings and sequences
MAX_DEPTH = 100
#: longest integer scalar (characters, sign and underscores included)
MAX_INT_DIGITS = 64


class _TooCostly(yaml.YAMLError):
    pass


_NUMERIC_START = frozenset('0123456789+-.')
_MERGE_TAG = 'tag:yaml.org,2002:merge'
#: nesting the text may seem to have for libyaml to compose it (its
#: composer recurses in C: a deep enough document overflows the stack)
_PRESCAN_DEPTH = 1000
_LINE_START = re.compile(r'^[ \t]*(?:[-?:][ \t]+)*', re.MULTILINE)


class _Checks:
    """What both loaders add to PyYAML's safe loading."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        # the implicit int/float/sexagesimal patterns backtrack in
        # quadratic time on a long run of digits
        if kind is yaml.ScalarNode and implicit[0] and \
                len(value) > MAX_INT_DIGITS and value[:1] in _NUMERIC_START:
            raise _TooCostly('a plain scalar of %d characters that looks '
                             'like a number (at most %d)'
                             % (len(value), MAX_INT_DIGITS))
        return super().resolve(kind, value, implicit)  # type: ignore


class _StrictLoader(_Checks, yaml.SafeLoader):
    """Pure Python, when PyYAML was built without libyaml."""

    _depth = 0

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # bound ``[[[[...`` in the scanner: its look-ahead for simple keys
        # costs quadratic time in the flow depth, before composing starts
        super().fetch_flow_collection_start(token_class)
        if self.flow_level > MAX_DEPTH:
            raise yaml.scanner.ScannerError(
                None, None, 'nested deeper than %d levels' % MAX_DEPTH,
                self.get_mark())

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, 'nested deeper than %d levels' % MAX_DEPTH,
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_FastLoader: Any = None
if getattr(yaml, '__with_libyaml__', False):
    class _FastLoader(_Checks, yaml.CSafeLoader):  # type: ignore[no-redef]
        """libyaml's parser: several times faster than PyYAML's."""


def _shallow(text: str) -> bool:
    """Whether ``text`` certainly nests less than :data:`_PRESCAN_DEPTH`
    deep, so that libyaml may compose it: fewer flow brackets than that in
    all, and no line whose indentation and block indicators reach it.
    (C-speed string scans; otherwise the pure Python loader, which
    bounds the depth as it goes, takes the text.)
    """
    if text.count('[') + text.count('{') >= _PRESCAN_DEPTH:
        return False
    return max(map(len, _LINE_START.findall(text)),
               default=0) < _PRESCAN_DEPTH


def _construct_mapping(loader: Any, node: yaml.MappingNode,
                       deep: bool = False) -> dict[Any, Any]:
    # the mapping's own keys must be unique; keys merged in with ``<<``
    # may be overridden by them, as YAML's merge key means
    seen: dict[Any, Any] = {}
    for key_node, _value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:   # an unhashable key: let PyYAML say so
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                'while constructing a mapping', node.start_mark,
                'found duplicate key %r' % (key,), key_node.start_mark)
        seen[key] = True
    loader.flatten_mapping(node)
    result: dict[Any, Any] = loader.construct_mapping(node, deep=deep)
    return result


def _construct_int(loader: Any, node: yaml.ScalarNode) -> int:
    value = loader.construct_scalar(node)
    if len(value) > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, 'an integer of %d characters (at most %d)'
            % (len(value), MAX_INT_DIGITS), node.start_mark)
    result: int = yaml.constructor.SafeConstructor.construct_yaml_int(
        loader, node)
    return result


for _loader in filter(None, (_StrictLoader, _FastLoader)):
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                            _construct_mapping)
    _loader.add_constructor('tag:yaml.org,2002:int', _construct_int)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph whose expansion is too large, too deep or
    infinite; linear in the distinct nodes.

    :raises yaml.MarkedYAMLError: naming the node.
    """
    sizes: dict[int, tuple[int, int]] = {}   # id -> (nodes, depth)
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            parts = [sizes[id(child)] for child in _children(node)]
            count = 1 + sum(p[0] for p in parts)
            depth = 1 + max((p[1] for p in parts), default=0)
            if count > MAX_NODES:
                raise yaml.composer.ComposerError(
                    None, None, 'aliases expand to more than %d nodes'
                    % MAX_NODES, node.start_mark)
            if depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, 'aliases nest deeper than %d levels'
                    % MAX_DEPTH, node.start_mark)
            sizes[key] = (count, depth)
            continue
        if key in sizes:
            continue
        if key in active:
            raise yaml.composer.ComposerError(
                None, None, 'a recursive alias', node.start_mark)
        active.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node)
                     if id(child) not in sizes)


def load(text: str, source: str) -> Any:
    """Parse YAML (or JSON) ``text``; ``source`` names it in errors.

    :raises AmdgpuVirtError: with the source, line and column.
    """
    loader = None
    try:
        if _FastLoader is not None and _shallow(text):
            loader = _FastLoader(text)
        else:
            loader = _StrictLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
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
    except (ValueError, TypeError, RecursionError) as err:
        # what a constructor of the safe loader may raise on odd scalars
        # (a float or a timestamp out of range, an unhashable key)
        raise exception.AmdgpuVirtError(
            '%s is not usable YAML: %s' % (source, err)) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_json(text: str, source: str,
              object_pairs_hook: Callable[[list[tuple[str, Any]]], Any]
              | None = None) -> Any:
    """Parse JSON ``text``, nested at most :data:`MAX_DEPTH` deep.

    :raises AmdgpuVirtError: not JSON, an integer beyond Python's limit,
        or too deep, naming ``source``.
    """
    try:
        document = json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise exception.AmdgpuVirtError(
            '%s is not usable JSON: nested deeper than %d levels'
            % (source, MAX_DEPTH)) from None
    except ValueError as err:
        raise exception.AmdgpuVirtError(
            '%s is not valid JSON: %s' % (source, err)) from None
    # the mappings and lists only (a large document is mostly scalars):
    # the depth of a value is that of its innermost collection
    nested = (dict, list, tuple)
    stack = [(document, 1)] if isinstance(document, nested) else []
    while stack:
        value, depth = stack.pop()
        items = value.values() if isinstance(value, dict) else value
        children = [v for v in items if isinstance(v, nested)]
        if children and depth >= MAX_DEPTH:
            raise exception.AmdgpuVirtError(
                '%s is not usable JSON: nested deeper than %d levels'
                % (source, MAX_DEPTH))
        stack.extend((v, depth + 1) for v in children)
    return document


def load_file(path: str, what: str = 'file') -> Any:
    """Read and parse the YAML (or JSON) file ``path``.

    :param what: what the file is (``fleet file``, ``ledger``...), so that
        an error says which input was wrong.
    :raises FileInputError: the file is missing, not a regular file, too
        large or not UTF-8.
    :raises AmdgpuVirtError: it is not YAML, or too costly (see above).
    """
    text = fileutil.read_text(path, what)
    if text is None:
        raise exception.FileInputError(what=what, path=path,
                                       reason='no such file')
    return load(text, '%s %s' % (what, path))


#: a PCI address (``0000:05:00.0``, ``05:00.0``) or a glob of one
_PCI_LIKE = re.compile(r'^[0-9a-fA-F]{0,4}:?[0-9a-fA-F*]{2}:[0-9a-fA-F*]{2}'
                       r'\.[0-7*]$')


class _Dumper(yaml.SafeDumper):
    """Safe dumping; PCI addresses always quoted."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # YAML 1.1 reads an unquoted 0000:05:00.0 as a base-60 number: quote
    # every address, so that a hand edit copying one keeps its quotes
    if _PCI_LIKE.match(value):
        return dumper.represent_scalar('tag:yaml.org,2002:str', value,
                                       style="'")
    return dumper.represent_str(value)


_Dumper.add_representer(str, _represent_str)


def dump(data: Any) -> str:
    """``data`` as YAML (keys in their order, block style, every PCI
    address quoted)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False,
                     default_flow_style=False)
