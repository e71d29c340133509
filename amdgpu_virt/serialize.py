"""Plain data (JSON/YAML) from and to the frozen model dataclasses.

:func:`to_data` turns a dataclass into dicts, lists, strings, numbers,
booleans and None; :func:`from_data` rebuilds it from its type hints, so
``from_data(type(obj), to_data(obj)) == obj`` for every model object.
Conventions: a :class:`~amdgpu_virt.model.PciAddress` is its string
(``0000:85:00.0``), an enum its value, a tuple a list. Errors name the
field path (``gpus[2].vfs[0].address``) and what was wrong.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from amdgpu_virt import exception
from amdgpu_virt.model import PciAddress

_T = TypeVar('_T')


def to_data(obj: Any) -> Any:
    """``obj`` as plain data (see the module docstring)."""
    if isinstance(obj, PciAddress):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {field.name: to_data(getattr(obj, field.name))
                for field in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_data(item) for item in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError('cannot serialize %r' % (obj,))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fail(path: str, reason: str) -> typing.NoReturn:
    raise exception.InvalidData(field=path or '(top level)', reason=reason)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + '...'


def from_data(cls: type[_T], data: Any, path: str = '') -> _T:
    """Rebuild a ``cls`` instance from plain ``data``.

    :raises InvalidData: naming the field path and the problem.
    """
    result: _T = _convert(cls, data, path)
    return result


def _convert(hint: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(hint)
        if data is None and type(None) in options:
            return None
        real = [o for o in options if o is not type(None)]
        errors = []
        for option in real:
            try:
                return _convert(option, data, path)
            except exception.InvalidData as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        _fail(path, 'expected one of %s, got %s' % (
            ', '.join(_name(o) for o in options), _describe(data)))
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(data, (list, tuple)):
            _fail(path, 'expected a list, got %s' % _describe(data))
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], item, '%s[%d]' % (path, i))
                         for i, item in enumerate(data))
        if len(args) != len(data):
            _fail(path, 'expected a list of %d items, got %d' % (
                len(args), len(data)))
        pairs = enumerate(zip(args, data, strict=True))
        return tuple(_convert(arg, item, '%s[%d]' % (path, i))
                     for i, (arg, item) in pairs)
    if hint is Any:
        return data
    if hint is PciAddress:
        if not isinstance(data, str):
            _fail(path, 'expected a PCI address string, got %s'
                  % _describe(data))
        try:
            return PciAddress.parse(data)
        except exception.InvalidPciAddress as err:
            _fail(path, str(err))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for member in hint:
            if member.value == data:
                return member
        _fail(path, '%s is not one of %s' % (
            _describe(data), ', '.join(str(m.value) for m in hint)))
    if hint is bool:
        if not isinstance(data, bool):
            _fail(path, 'expected true or false, got %s' % _describe(data))
        return data
    if hint is int:
        if isinstance(data, bool) or not isinstance(data, int):
            _fail(path, 'expected an integer, got %s' % _describe(data))
        return data
    if hint is str:
        if not isinstance(data, str):
            _fail(path, 'expected a string, got %s' % _describe(data))
        return data
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(hint, data, path)
    raise TypeError('%s: cannot deserialize type %r' % (path, hint))


def _dataclass(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        _fail(path, 'expected a mapping (%s), got %s' % (
            cls.__name__, _describe(data)))
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(key) for key in data if key not in fields)
    if unknown:
        _fail(path, 'unknown key(s) %s; allowed: %s' % (
            ', '.join(unknown), ', '.join(fields)))
    values = {}
    for name, field in fields.items():
        where = '%s.%s' % (path, name) if path else name
        if name not in data:
            if (field.default is dataclasses.MISSING
                    and field.default_factory is dataclasses.MISSING):
                _fail(where, 'required')
            continue
        values[name] = _convert(hints[name], data[name], where)
    try:
        return cls(**values)
    except exception.AmdgpuVirtError as err:
        _fail(path, str(err))


def _name(hint: Any) -> str:
    if hint is type(None):
        return 'null'
    if hint is PciAddress:
        return 'a PCI address'
    return getattr(hint, '__name__', str(hint))
