"""Node registration (``hami.io/node-amd-register``): HAMi's DeviceInfo,
as Go's JSON encoder writes it, and the legacy colon format."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import msgspec

from amdgpu_virt.sharing.hami.common import _check_text
from amdgpu_virt.sharing.hami.common import _fail
from amdgpu_virt.sharing.hami.common import _GO_BOOLS
from amdgpu_virt.sharing.hami.common import _go_int
from amdgpu_virt.sharing.hami.common import _go_json
from amdgpu_virt.sharing.hami.common import _INT32_MAX
from amdgpu_virt.sharing.hami.common import _INT32_MIN
from amdgpu_virt.sharing.hami.common import _json_constant
from amdgpu_virt.sharing.hami.common import _UINT_MAX
from amdgpu_virt.sharing.hami.names import CUSTOMINFO_CU_PER_WGP
from amdgpu_virt.sharing.hami.names import DEFAULT_MODE
from amdgpu_virt.sharing.hami.names import NODE_REGISTER


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One GPU of a node registration (HAMi's ``DeviceInfo``).

    Field names follow the JSON names. ``custominfo`` is a free map
    (e.g. ``{"pciBDF": "0000:83:00.0"}``); it does not take part in
    hashing.
    """

    id: str = ''
    index: int = 0
    count: int = 0
    devmem: int = 0
    devcore: int = 0
    type: str = ''
    numa: int = 0
    mode: str = ''
    health: bool = False
    devicevendor: str = ''
    custominfo: Mapping[str, Any] = dataclasses.field(
        default_factory=dict, hash=False)

    @property
    def cu_unit(self) -> int:
        """CUs allocated together, from ``custominfo.cuPerWGP`` (else 1)."""
        value = self.custominfo.get(CUSTOMINFO_CU_PER_WGP)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and 1 < value <= _INT32_MAX and value == int(value):
            return int(value)
        return 1


#: (JSON name, kind) in the order of HAMi's Go struct, which is the order
#: Go's encoder writes them.
_DEVICE_FIELDS: tuple[tuple[str, str], ...] = (
    ('id', 'str'), ('index', 'uint'), ('count', 'int32'),
    ('devmem', 'int32'), ('devcore', 'int32'), ('type', 'str'),
    ('numa', 'int'), ('mode', 'str'), ('health', 'bool'),
    ('devicevendor', 'str'), ('custominfo', 'map'),
)
_FIELD_KIND = dict(_DEVICE_FIELDS)
_FIELD_BY_FOLD = {name.casefold(): name for name, _kind in _DEVICE_FIELDS}


def _loads(key: str, value: str) -> Any:
    try:
        return json.loads(value, parse_constant=_json_constant)
    except (ValueError, RecursionError) as exc:
        _fail(key, value, 'not JSON: %s' % exc)


#: Go's zero values and integer ranges per field kind
_ZERO: dict[str, Any] = {'str': '', 'bool': False}
_INT64_MAX = (1 << 63) - 1
_RANGE = {'uint': (0, _UINT_MAX), 'int32': (_INT32_MIN, _INT32_MAX),
          'int': (-(1 << 63), _INT64_MAX)}


def _decode_field(key: str, value: str, where: str, name: str,
                  raw: Any) -> Any:
    kind = _FIELD_KIND[name]
    if raw is None:   # Go leaves the zero value for null
        return {} if kind == 'map' else _ZERO.get(kind, 0)
    if kind == 'str':
        if not isinstance(raw, str):
            _fail(key, value, '%s field %s: expected a string, got %r'
                  % (where, name, raw))
        return raw
    if kind == 'bool':
        if not isinstance(raw, bool):
            _fail(key, value, '%s field %s: expected true or false, got %r'
                  % (where, name, raw))
        return raw
    if kind == 'map':
        if not isinstance(raw, dict) or \
                not all(isinstance(k, str) for k in raw):
            _fail(key, value, '%s field %s: expected an object, got %r'
                  % (where, name, raw))
        return raw
    if not isinstance(raw, int) or isinstance(raw, bool):
        _fail(key, value, '%s field %s: expected an integer, got %r'
              % (where, name, raw))
    low, high = _RANGE[kind]
    if not low <= raw <= high:
        _fail(key, value, '%s field %s: %d is outside %d..%d'
              % (where, name, raw, low, high))
    return raw


def _typed_field(name: str, kind: str) -> tuple[str, Any, Any]:
    """(name, type, default) of a field for the typed decoder: the Go
    type's own values only (no null: that takes the full decoder)."""
    if kind == 'map':
        return name, dict[str, Any], msgspec.field(default_factory=dict)
    if kind in _RANGE:
        low, high = _RANGE[kind]
        # bounds past int64 are not supported: larger values take the
        # full decoder
        return name, Annotated[int, msgspec.Meta(
            ge=low, le=min(high, _INT64_MAX))], 0
    return name, {'str': str, 'bool': bool}[kind], _ZERO[kind]


#: a registration entry as HAMi writes it: the exact field names, each of
#: its Go type and range; anything else (another spelling of a name, an
#: unknown field, null, a value out of range) fails it, and the value is
#: decoded again by the full decoder, which says what is wrong
_TypedDevice = msgspec.defstruct(
    '_TypedDevice', [_typed_field(name, kind)
                     for name, kind in _DEVICE_FIELDS],
    forbid_unknown_fields=True)
_TYPED = msgspec.json.Decoder(list[_TypedDevice])  # type: ignore[valid-type]


def _decode_typed(value: str) -> tuple[DeviceInfo, ...] | None:
    """The devices of a registration written the way HAMi writes it, in
    one pass; None when the full decoder has to read it."""
    try:
        entries = _TYPED.decode(value)
    except (msgspec.MsgspecError, UnicodeError, RecursionError):
        return None
    # the typed fields are DeviceInfo's (same names, every one set)
    return tuple(msgspec.convert(entries, list[DeviceInfo],
                                 from_attributes=True))


def decode_node_register(value: str, key: str = NODE_REGISTER
                         ) -> tuple[DeviceInfo, ...]:
    """Decode a node registration: a JSON array of DeviceInfo, or the
    legacy colon format when the value is not JSON-looking.

    JSON keys match field names case-insensitively and unknown keys are
    ignored (as Go's decoder does); no field is required; ``null`` decodes
    to no devices.

    :raises HamiProtocolError: bad JSON, not an array of objects, or a
        field of the wrong type or range (named with the device index).
    """
    stripped = value.strip()
    if stripped.startswith('['):
        typed = _decode_typed(value)
        if typed is not None:
            return typed
    elif not stripped.startswith(('{', 'null')):
        return decode_node_devices_legacy(value, key)
    data = _loads(key, value)
    if data is None:
        return ()
    if not isinstance(data, list):
        _fail(key, value, 'expected a JSON array of devices, got %s'
              % type(data).__name__)
    devices = []
    for number, entry in enumerate(data):
        where = 'device %d' % number
        if entry is None:
            _fail(key, value, '%s is null' % where)
        if not isinstance(entry, dict):
            _fail(key, value, '%s: expected an object, got %r'
                  % (where, entry))
        fields: dict[str, Any] = {}
        for raw_name, raw in entry.items():
            name = raw_name if raw_name in _FIELD_KIND else \
                _FIELD_BY_FOLD.get(raw_name.casefold())
            if name is None:
                continue
            fields[name] = _decode_field(key, value, where, name, raw)
        devices.append(DeviceInfo(**fields))
    return tuple(devices)


def _sorted_map(data: Any) -> Any:
    """Go writes map keys sorted."""
    if isinstance(data, Mapping):
        return {k: _sorted_map(data[k]) for k in sorted(data)}
    if isinstance(data, (list, tuple)):
        return [_sorted_map(v) for v in data]
    return data


def device_to_json(device: DeviceInfo) -> dict[str, Any]:
    """The JSON object Go writes for ``device`` (zero fields left out)."""
    result: dict[str, Any] = {}
    for name, _kind in _DEVICE_FIELDS:
        field_value = getattr(device, name)
        if field_value in ('', 0, False, None) or \
                (name == 'custominfo' and not field_value):
            continue
        result[name] = _sorted_map(field_value) if name == 'custominfo' \
            else field_value
    return result


def encode_node_register(devices: Iterable[DeviceInfo]) -> str:
    """Encode a node registration as HAMi's Go encoder writes it."""
    return _go_json([device_to_json(device) for device in devices])


def decode_node_devices_legacy(value: str, key: str = NODE_REGISTER
                               ) -> tuple[DeviceInfo, ...]:
    """Decode the legacy colon format.

    ``ID,Count,Devmem,Devcore,Type,Numa,Health[,Index,Mode]:`` per device;
    7 fields mean index 0 and mode ``hami-core``. ``:`` and ``::`` are no
    devices.

    :raises HamiProtocolError: no ``:`` at all, a device without ``,``, a
        device with neither 7 nor 9 fields, or a bad number or boolean.
    """
    if ':' not in value:
        _fail(key, value, 'missing the ":" device separator')
    devices = []
    for number, segment in enumerate(value.split(':')):
        if not segment:
            continue
        where = 'device %d %r' % (number, segment)
        if ',' not in segment:
            _fail(key, value, '%s: missing the "," field separator' % where)
        items = segment.split(',')
        if len(items) not in (7, 9):
            _fail(key, value, '%s: %d fields, expected 7 or 9'
                  % (where, len(items)))
        health = _GO_BOOLS.get(items[6])
        if health is None:
            _fail(key, value, '%s field health: %r is not a boolean'
                  % (where, items[6]))
        index = 0
        mode = DEFAULT_MODE
        if len(items) == 9:
            index = _go_int(key, value, where, 'index', items[7], 0,
                            (1 << 63) - 1)
            mode = items[8]
        devices.append(DeviceInfo(
            id=items[0],
            count=_go_int(key, value, where, 'count', items[1],
                          _INT32_MIN, _INT32_MAX),
            devmem=_go_int(key, value, where, 'devmem', items[2],
                           _INT32_MIN, _INT32_MAX),
            devcore=_go_int(key, value, where, 'devcore', items[3],
                            _INT32_MIN, _INT32_MAX),
            type=items[4],
            numa=_go_int(key, value, where, 'numa', items[5],
                         -(1 << 63), (1 << 63) - 1),
            health=health, index=index, mode=mode))
    return tuple(devices)


def encode_node_devices_legacy(devices: Iterable[DeviceInfo],
                               short: bool = False,
                               key: str = NODE_REGISTER) -> str:
    """Encode the legacy colon format.

    :param short: write 7 fields per device (only for index 0 and mode
        ``hami-core``, which a 7-field entry implies); HAMi writes 9.
    :raises HamiProtocolError: an id, type or mode containing ``,`` or
        ``:``, or ``short`` with a device the 7 fields cannot describe.
    """
    parts = []
    for device in devices:
        for what, text in (('id', device.id), ('type', device.type),
                           ('mode', device.mode)):
            _check_text(key, 'device %s %s' % (device.id, what), text, ',:')
        fields = [device.id, str(device.count), str(device.devmem),
                  str(device.devcore), device.type, str(device.numa),
                  'true' if device.health else 'false']
        if short:
            if device.index or device.mode not in ('', DEFAULT_MODE):
                _fail(key, device.id, 'index %d and mode %r need the '
                      '9-field form' % (device.index, device.mode))
        else:
            fields += [str(device.index), device.mode]
        parts.append(','.join(fields) + ':')
    return ''.join(parts)
