"""Codecs of HAMi's AMD protocol (annotation values), pure Python.

HAMi's scheduler, webhook and AMD device plugin talk through annotations on
nodes and pods. Everything here turns those values into typed frozen
dataclasses and back, byte for byte as HAMi writes them, so that either
side of a cluster may be HAMi's or ours:

* node registration (``hami.io/node-amd-register``): a JSON array of
  DeviceInfo written the way Go's ``encoding/json`` writes HAMi's struct
  (fields in struct order, ``omitempty``); decoding accepts present and
  absent zero fields alike and never requires a field. The legacy colon
  format (``ID,Count,Devmem,Devcore,Type,Numa,Health[,Index,Mode]:``) is
  decoded and encoded too;
* pod allocation (``hami.io/amd-devices-to-allocate`` and
  ``hami.io/amd-devices-allocated``): ``UUID,Type,Mem,Cores:`` per device,
  ``;`` after each container (init containers first), empty containers
  kept;
* node lock (``hami.io/mutex.lock``): ``<RFC 3339>,<namespace>,<pod>`` or a
  bare time;
* handshake and bind phase values, unix-second times;
* per-pod CU ranges (``hami.io/amd-cu-allocated``):
  ``{"<uuid>": "<ID list>"}``, and :func:`rebuild_allocators` that turns
  those of all live pods back into one :class:`CuAllocator` per GPU,
  failing closed on overlaps.

Every decoder raises :class:`~amdgpu_virt.exception.HamiProtocolError`
naming the annotation key, the value and what is wrong; nothing here talks
to Kubernetes.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import cumask

# --- resource names ----------------------------------------------------------

#: Number of physical GPUs (pod limit).
RESOURCE_GPU = 'amd.com/gpu'
#: MiB per GPU; 0 or absent = the whole card's memory.
RESOURCE_GPUMEM = 'amd.com/gpumem'
#: Percent of the GPU's CUs, 1..100; absent = 100.
RESOURCE_GPUCORES = 'amd.com/gpucores'
#: The three, in HAMi's order (count, memory, cores).
RESOURCES = (RESOURCE_GPU, RESOURCE_GPUMEM, RESOURCE_GPUCORES)

# --- node annotations --------------------------------------------------------

NODE_REGISTER = 'hami.io/node-amd-register'
NODE_LOCK = 'hami.io/mutex.lock'

# --- pod annotations ---------------------------------------------------------

DEVICES_TO_ALLOCATE = 'hami.io/amd-devices-to-allocate'
DEVICES_ALLOCATED = 'hami.io/amd-devices-allocated'
CU_ALLOCATED = 'hami.io/amd-cu-allocated'
#: Node chosen by the filter (also a pod label).
VGPU_NODE = 'hami.io/vgpu-node'
#: Unix seconds of the filter decision.
VGPU_TIME = 'hami.io/vgpu-time'
BIND_PHASE = 'hami.io/bind-phase'
#: Unix seconds of the bind.
BIND_TIME = 'hami.io/bind-time'
USE_GPUTYPE = 'amd.com/use-gputype'
NOUSE_GPUTYPE = 'amd.com/nouse-gputype'
USE_GPU_UUID = 'amd.com/use-gpu-uuid'
NOUSE_GPU_UUID = 'amd.com/nouse-gpu-uuid'
NODE_SCHEDULER_POLICY = 'hami.io/node-scheduler-policy'
GPU_SCHEDULER_POLICY = 'hami.io/gpu-scheduler-policy'
#: Label (and its value) that makes HAMi's webhook skip an object. The
#: label is set by the pod's owner, so our webhook deliberately ignores it:
#: admission exemptions are by namespace only (an administrator's choice).
WEBHOOK_LABEL = 'hami.io/webhook'
WEBHOOK_IGNORE = 'ignore'
#: Pod annotations that record an allocation: only the scheduler and the
#: device plugin write them (a pod owner who could would claim GPUs it was
#: never given or make its CUs look free).
ALLOCATION_ANNOTATIONS = (DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED,
                          CU_ALLOCATED, VGPU_NODE, VGPU_TIME, BIND_PHASE,
                          BIND_TIME)

NODE_SCHEDULER_POLICIES = ('binpack', 'spread')
DEFAULT_NODE_SCHEDULER_POLICY = 'binpack'
GPU_SCHEDULER_POLICIES = ('binpack', 'spread', 'topology-aware', 'mutex',
                          'numa')
DEFAULT_GPU_SCHEDULER_POLICY = 'spread'

# --- container environment (device plugin Allocate) --------------------------

ENV_ROCR_VISIBLE_DEVICES = 'ROCR_VISIBLE_DEVICES'
ENV_HIP_VISIBLE_DEVICES = 'HIP_VISIBLE_DEVICES'
ENV_HSA_CU_MASK = cumask.HSA_CU_MASK
#: Per container-local GPU i: ``HIP_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``.
ENV_HIP_DEVICE_MEMORY_LIMIT = 'HIP_DEVICE_MEMORY_LIMIT'
ENV_LD_AUDIT = 'LD_AUDIT'
LD_AUDIT_LIBRARY = '/usr/local/vgpu/libamvgpu.so'
ENV_ROC_GLOBAL_CU_MASK = cumask.ROC_GLOBAL_CU_MASK
#: Environment the device plugin sets (or that would override what it
#: sets): a container setting one itself could escape its CU mask or
#: memory limit, or see other GPUs.
PLUGIN_ENV = (ENV_HSA_CU_MASK, ENV_ROC_GLOBAL_CU_MASK,
              ENV_ROCR_VISIBLE_DEVICES, ENV_LD_AUDIT)
#: ... and every variable starting with one of these.
PLUGIN_ENV_PREFIXES = (ENV_HIP_DEVICE_MEMORY_LIMIT,)

# --- defaults ----------------------------------------------------------------

#: ``count`` HAMi's AMD plugin registers: max pods sharing one GPU.
DEFAULT_SHARE_COUNT = 10
#: ``mode`` of a legacy 7-field registration entry.
DEFAULT_MODE = 'hami-core'
#: Older HAMi schedulers matched AMD devices by this word in ``type``
#: (current ones take every device of ``hami.io/node-amd-register`` as AMD,
#: whatever its type, and so does our extender); the node agent still puts
#: it in the types it registers, for the older ones.
AMD_TYPE_WORD = 'amd'
NODE_LOCK_TIMEOUT = datetime.timedelta(minutes=5)
#: Key of ``custominfo`` with the CUs allocated together (RDNA WGPs).
CUSTOMINFO_CU_PER_WGP = 'cuPerWGP'
CUSTOMINFO_PCI_BDF = 'pciBDF'

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_UINT_MAX = (1 << 64) - 1
_INT_RE = re.compile(r'[+-]?[0-9]+\Z')
_GO_BOOLS = {'1': True, 't': True, 'T': True, 'TRUE': True, 'true': True,
             'True': True, '0': False, 'f': False, 'F': False,
             'FALSE': False, 'false': False, 'False': False}


def _fail(key: str, value: str, reason: str) -> NoReturn:
    raise exception.HamiProtocolError(key=key, value=value, reason=reason)


# --- resources ---------------------------------------------------------------

def is_plugin_env(name: str) -> bool:
    """True for an environment variable only the device plugin may set."""
    return name in PLUGIN_ENV or name.startswith(PLUGIN_ENV_PREFIXES)


def plugin_env_clash(prefix: str) -> str | None:
    """The device plugin's variable that ``envFrom`` with this ``prefix``
    could set (every key of a ConfigMap or Secret becomes
    ``prefix + key``), or None when none can.
    """
    for name in PLUGIN_ENV:
        if name.startswith(prefix):
            return name
    for start in PLUGIN_ENV_PREFIXES:
        if start.startswith(prefix) or prefix.startswith(start):
            return start + '*'
    return None


def parse_percent(value: Any, field: str = RESOURCE_GPUCORES) -> int:
    """A whole percentage of a GPU's CUs, 1..100: the one validation of
    ``amd.com/gpucores``, of ``compute: 25%`` in a workload spec and of a
    pod's stated intent.

    :param value: an int, or a string of decimal digits (a Kubernetes
        quantity such as ``"25"``; ``"25%"`` is accepted too).
    :param field: names the field in the error.
    :raises HamiProtocolError: not a whole number in 1..100 (HAMi's
        webhook rejects such pods; fractions such as ``12.5`` are refused,
        not rounded).
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith('%'):
            text = text[:-1].strip()
        if text.isascii() and text.lstrip('+').isdigit() and len(text) < 5:
            number = int(text)
    if number is None or not 1 <= number <= 100:
        _fail(field, str(value),
              'must be an integer percentage between 1 and 100')
    return number


def percent_to_cus(percent: int, devcore: int, unit: int = 1) -> int:
    """CUs for ``amd.com/gpucores: <percent>`` on a GPU of ``devcore`` CUs.

    ``floor(percent * devcore / 100)`` clamped to ``[1, devcore]``, then
    rounded up to whole ``unit`` s (RDNA WGPs, ``custominfo.cuPerWGP``),
    as HAMi's AMD scheduler counts them (its device plugin hands out whole
    WGPs, so booking fewer would let the node look freer than it is).
    On a 304-CU MI300X: 1 -> 3, 25 -> 76, 33 -> 100, 50 -> 152, 100 -> 304.
    The one conversion: the extender, the webhook and workload specs all
    call it.

    :raises HamiProtocolError: percent outside 1..100 (HAMi's webhook
        rejects such pods) or a GPU without CUs.
    """
    if isinstance(percent, bool) or not isinstance(percent, int) or \
            not 1 <= percent <= 100:
        _fail(RESOURCE_GPUCORES, str(percent),
              'must be an integer percentage between 1 and 100')
    if devcore <= 0 or unit <= 0:
        _fail(RESOURCE_GPUCORES, str(percent),
              'the GPU reports %d CUs in units of %d' % (devcore, unit))
    cus = min(max(devcore * percent // 100, 1), devcore)
    if unit > 1:
        cus = min(-(-cus // unit) * unit, devcore)
    return cus


def cus_to_percent(cus: int, devcore: int, unit: int = 1) -> int:
    """The smallest whole percentage whose :func:`percent_to_cus` gives at
    least ``cus`` CUs on a GPU of ``devcore`` CUs.

    :raises HamiProtocolError: ``cus`` outside 1..devcore.
    """
    if not 1 <= cus <= devcore:
        _fail(RESOURCE_GPUCORES, str(cus),
              '%d CUs do not fit a GPU of %d CUs' % (cus, devcore))
    percent = max(1, -(-cus * 100 // devcore))
    while percent_to_cus(percent, devcore, unit) < cus:   # at most once
        percent += 1
    return percent


# --- node registration: DeviceInfo -------------------------------------------

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


def _json_constant(name: str) -> Any:
    raise ValueError('%s is not JSON' % name)


def _loads(key: str, value: str) -> Any:
    try:
        return json.loads(value, parse_constant=_json_constant)
    except (ValueError, RecursionError) as exc:
        _fail(key, value, 'not JSON: %s' % exc)


#: Go's zero values and integer ranges per field kind
_ZERO: dict[str, Any] = {'str': '', 'bool': False}
_RANGE = {'uint': (0, _UINT_MAX), 'int32': (_INT32_MIN, _INT32_MAX),
          'int': (-(1 << 63), (1 << 63) - 1)}


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
    if not stripped.startswith(('[', '{', 'null')):
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


def _go_json(data: Any) -> str:
    """Compact JSON with the escapes Go's encoder adds (``<>&``, line and
    paragraph separators)."""
    text = json.dumps(data, separators=(',', ':'), ensure_ascii=False)
    for char, escape in (('&', '\\u0026'), ('<', '\\u003c'),
                         ('>', '\\u003e'), ('\u2028', '\\u2028'),
                         ('\u2029', '\\u2029')):
        text = text.replace(char, escape)
    return text


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


def _go_int(key: str, value: str, where: str, name: str, text: str,
            low: int, high: int) -> int:
    if not _INT_RE.match(text):
        _fail(key, value, '%s field %s: %r is not an integer'
              % (where, name, text))
    if len(text.lstrip('+-').lstrip('0')) > 20:
        _fail(key, value, '%s field %s: %s is out of range'
              % (where, name, text))
    number = int(text)
    if not low <= number <= high:
        _fail(key, value, '%s field %s: %d is outside %d..%d'
              % (where, name, number, low, high))
    return number


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


def _check_text(key: str, what: str, text: str, forbidden: str) -> None:
    bad = [c for c in forbidden if c in text]
    if bad:
        _fail(key, text, '%s cannot contain %r' % (what, bad[0]))


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


# --- pod allocation ----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ContainerDevice:
    """One GPU given to one container: ``UUID,Type,UsedMemMiB,UsedCUs``."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int


#: Devices per container, init containers first, then containers.
PodDevices = tuple[tuple[ContainerDevice, ...], ...]


def decode_pod_devices(value: str, key: str = DEVICES_ALLOCATED
                       ) -> PodDevices:
    """Decode ``hami.io/amd-devices-(to-)allocate(d)``.

    ``;`` ends each container (a missing final ``;`` is tolerated); empty
    containers are kept so that indexes match the pod's containers. HAMi's
    own decoder also returns one empty container after the final ``;``;
    this one does not. Fields beyond the fourth are ignored, as HAMi does.

    :raises HamiProtocolError: a device without ``,``, with fewer than 4
        fields, an empty UUID or type, or a memory or CU count that is not
        a non-negative 32-bit integer.
    """
    if not value:
        return ()
    if len(value) <= _MEMO_CHARS:
        return _decode_pod_devices_memo(value, key)
    return _decode_pod_devices(value, key)


#: pod device strings up to this long are memoised (pods of one job and
#: shape carry the same string; the bound keeps crafted long ones out)
_MEMO_CHARS = 512


def _decode_pod_devices(value: str, key: str) -> PodDevices:
    chunks = value.split(';')
    if chunks[-1] == '':
        chunks.pop()
    containers = []
    for number, chunk in enumerate(chunks):
        devices = []
        for segment in chunk.split(':'):
            if not segment:
                continue
            items = segment.split(',')
            if len(items) < 4 or not items[0] or not items[1]:
                _bad_device(key, value, number, segment, items)
            devices.append(ContainerDevice(
                uuid=items[0], type=items[1],
                usedmem=_u32(key, value, number, segment, 'memory',
                             items[2]),
                usedcores=_u32(key, value, number, segment, 'cores',
                               items[3])))
        containers.append(tuple(devices))
    return tuple(containers)


# the result is immutable; an error is raised again, never cached
_decode_pod_devices_memo = functools.lru_cache(maxsize=8192)(
    _decode_pod_devices)


def _bad_device(key: str, value: str, number: int, segment: str,
                items: list[str]) -> NoReturn:
    where = 'container %d device %r' % (number, segment)
    if len(items) == 1:
        _fail(key, value, '%s: missing the "," field separator' % where)
    if len(items) < 4:
        _fail(key, value, '%s: %d fields, expected UUID,Type,Mem,'
              'Cores' % (where, len(items)))
    if not items[0]:
        _fail(key, value, '%s: empty UUID' % where)
    _fail(key, value, '%s: empty type' % where)


def _u32(key: str, value: str, number: int, segment: str, name: str,
         text: str) -> int:
    """A non-negative 32-bit count; plain ASCII digits take the short way,
    anything else the strict parser (same answers, same errors)."""
    if text.isascii() and text.isdigit() and len(text) <= 10:
        count = int(text)
        if count <= _INT32_MAX:
            return count
    return _go_int(key, value, 'container %d device %r' % (number, segment),
                   name, text, 0, _INT32_MAX)


def encode_pod_devices(containers: Iterable[Iterable[ContainerDevice]],
                       key: str = DEVICES_ALLOCATED) -> str:
    """Encode pod devices as HAMi's scheduler writes them.

    :raises HamiProtocolError: an empty UUID or type, one containing
        ``,``, ``:`` or ``;``, or a negative or too large number.
    """
    result = []
    for container in containers:
        for device in container:
            for what, text in (('UUID', device.uuid),
                               ('type', device.type)):
                if not text:
                    _fail(key, repr(device), 'empty device %s' % what)
                _check_text(key, 'device %s' % what, text, ',:;')
            for what, number in (('memory', device.usedmem),
                                 ('cores', device.usedcores)):
                if not 0 <= number <= _INT32_MAX:
                    _fail(key, repr(device), '%s %d is outside 0..%d'
                          % (what, number, _INT32_MAX))
            result.append('%s,%s,%d,%d:' % (device.uuid, device.type,
                                           device.usedmem, device.usedcores))
        result.append(';')
    return ''.join(result)


# --- node lock ---------------------------------------------------------------

_RFC3339_RE = re.compile(
    r'([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})'
    r'(?:\.([0-9]{1,9}))?(Z|[+-][0-9]{2}:[0-9]{2})\Z')


def parse_rfc3339(text: str, key: str = NODE_LOCK,
                  value: str | None = None) -> datetime.datetime:
    """Parse an RFC 3339 time as Go's ``time.RFC3339`` layout reads it.

    :returns: an aware datetime (microsecond precision).
    :raises HamiProtocolError: not such a time.
    """
    match = _RFC3339_RE.match(text)
    if not match:
        _fail(key, text if value is None else value,
              '%r is not an RFC 3339 time such as 2026-01-02T15:04:05Z'
              % text)
    year, month, day, hour, minute, second = (
        int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    fraction = match.group(7) or ''
    zone = match.group(8)
    if zone == 'Z':
        tz = datetime.UTC
    else:
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        offset = datetime.timedelta(hours=hours, minutes=minutes)
        if hours > 23 or minutes > 59:
            _fail(key, text if value is None else value,
                  'time zone %s out of range' % zone)
        tz = datetime.timezone(-offset if zone[0] == '-' else offset)
    try:
        return datetime.datetime(
            year, month, day, hour, minute, second,
            int((fraction + '000000')[:6]), tzinfo=tz)
    except ValueError as exc:
        _fail(key, text if value is None else value,
              '%r is not a valid time: %s' % (text, exc))


def format_rfc3339(when: datetime.datetime) -> str:
    """Write ``when`` as Go's ``time.RFC3339`` layout does (seconds
    precision, ``Z`` for a zero offset).

    :raises HamiProtocolError: a naive datetime (its zone is unknown).
    """
    offset = when.utcoffset()
    if offset is None:
        _fail(NODE_LOCK, when.isoformat(),
              'a lock time needs a time zone')
    text = when.strftime('%Y-%m-%dT%H:%M:%S')
    if not offset:
        return text + 'Z'
    minutes = int(offset.total_seconds()) // 60
    sign = '-' if minutes < 0 else '+'
    minutes = abs(minutes)
    return '%s%s%02d:%02d' % (text, sign, minutes // 60, minutes % 60)


@dataclasses.dataclass(frozen=True)
class NodeLock:
    """Value of ``hami.io/mutex.lock``: when and by which pod.

    ``namespace`` and ``pod`` are None for the legacy bare-time form.
    """

    time: datetime.datetime
    namespace: str | None = None
    pod: str | None = None

    def expired(self, now: datetime.datetime,
                timeout: datetime.timedelta = NODE_LOCK_TIMEOUT) -> bool:
        """True once more than ``timeout`` has passed since the lock."""
        return now - self.time > timeout

    def held_by(self, namespace: str, pod: str) -> bool:
        return self.namespace == namespace and self.pod == pod

    def encode(self) -> str:
        return encode_node_lock(self)


def decode_node_lock(value: str, key: str = NODE_LOCK) -> NodeLock:
    """Decode ``<RFC3339>,<namespace>,<pod>`` or a bare RFC 3339 time.

    :raises HamiProtocolError: not 1 or 3 fields, a bad time, or an empty
        namespace or pod name.
    """
    if ',' not in value:
        return NodeLock(time=parse_rfc3339(value, key, value))
    parts = value.split(',')
    if len(parts) != 3:
        _fail(key, value, '%d fields, expected <time>,<namespace>,<pod> or '
              'a bare time' % len(parts))
    when = parse_rfc3339(parts[0], key, value)
    if not parts[1] or not parts[2]:
        _fail(key, value, 'empty namespace or pod name')
    return NodeLock(time=when, namespace=parts[1], pod=parts[2])


def encode_node_lock(lock: NodeLock) -> str:
    """Encode a node lock value (bare time when it has no pod).

    :raises HamiProtocolError: only one of namespace and pod, or one
        containing ``,``.
    """
    when = format_rfc3339(lock.time)
    if lock.namespace is None and lock.pod is None:
        return when
    if not lock.namespace or not lock.pod:
        _fail(NODE_LOCK, repr(lock), 'needs both a namespace and a pod')
    for text in (lock.namespace, lock.pod):
        _check_text(NODE_LOCK, 'a namespace or pod name', text, ',')
    return '%s,%s,%s' % (when, lock.namespace, lock.pod)


# --- handshake, bind phase, times --------------------------------------------

class HandshakeState(str, enum.Enum):
    """States of HAMi's node handshake annotations (other vendors; the AMD
    path judges health by the node's ``amd.com/gpu`` capacity)."""

    REQUESTING = 'Requesting'
    REPORTED = 'Reported'
    DELETED = 'Deleted'


#: Go's ``time.DateTime`` layout, in the writer's local time.
_HANDSHAKE_TIME = '%Y-%m-%d %H:%M:%S'
_HANDSHAKE_RE = re.compile(
    r'[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\Z')


@dataclasses.dataclass(frozen=True)
class Handshake:
    """``<State>_<YYYY-MM-DD HH:MM:SS>`` (naive local time)."""

    state: HandshakeState
    time: datetime.datetime

    def encode(self) -> str:
        return '%s_%s' % (self.state.value,
                          self.time.strftime(_HANDSHAKE_TIME))


def decode_handshake(value: str, key: str = 'hami.io/node-handshake'
                     ) -> Handshake:
    """Decode a handshake value such as ``Requesting_2026-01-02 15:04:05``.

    :raises HamiProtocolError: unknown state or bad time.
    """
    state, sep, when = value.partition('_')
    try:
        parsed_state = HandshakeState(state)
    except ValueError:
        _fail(key, value, 'state %r is none of %s' % (
            state, ', '.join(s.value for s in HandshakeState)))
    if not sep or not _HANDSHAKE_RE.match(when):
        _fail(key, value, 'expected <State>_YYYY-MM-DD HH:MM:SS')
    try:
        parsed = datetime.datetime.strptime(when, _HANDSHAKE_TIME)
    except ValueError as exc:
        _fail(key, value, 'bad time: %s' % exc)
    return Handshake(state=parsed_state, time=parsed)


class BindPhase(str, enum.Enum):
    """Values of ``hami.io/bind-phase``."""

    ALLOCATING = 'allocating'
    SUCCESS = 'success'
    FAILED = 'failed'


def decode_bind_phase(value: str, key: str = BIND_PHASE) -> BindPhase:
    """:raises HamiProtocolError: not one of the three phases."""
    try:
        return BindPhase(value)
    except ValueError:
        _fail(key, value, 'expected one of %s'
              % ', '.join(p.value for p in BindPhase))


def decode_unix_time(value: str, key: str = BIND_TIME) -> int:
    """Decode unix seconds (``hami.io/bind-time``, ``hami.io/vgpu-time``).

    :raises HamiProtocolError: not a non-negative decimal integer.
    """
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        _fail(key, value, 'expected unix seconds (decimal digits)')
    return int(value)


def encode_unix_time(seconds: int | float) -> str:
    return str(int(seconds))


# --- CU ranges of a pod ------------------------------------------------------

def decode_cu_allocated(value: str, key: str = CU_ALLOCATED
                        ) -> dict[str, int]:
    """Decode ``hami.io/amd-cu-allocated``: ``{"<uuid>": "<ID list>"}``.

    :returns: GPU uuid -> CU bitmap.
    :raises HamiProtocolError: not a JSON object of strings, a repeated
        uuid, or a bad ID list (empty, repeated or inverted ids).
    """
    try:
        data = json.loads(value, object_pairs_hook=_pairs,
                          parse_constant=_json_constant)
    except (ValueError, RecursionError) as exc:
        _fail(key, value, 'not JSON: %s' % exc)
    if not isinstance(data, _Pairs):
        _fail(key, value, 'expected a JSON object {"<uuid>": "<ID list>"}')
    result: dict[str, int] = {}
    for uuid, ids in data:
        if uuid in result:
            _fail(key, value, 'GPU %s is listed twice' % uuid)
        if not uuid:
            _fail(key, value, 'empty GPU uuid')
        if not isinstance(ids, str):
            _fail(key, value, 'GPU %s: expected an ID list string, got %r'
                  % (uuid, ids))
        try:
            result[uuid] = cumask.parse_id_list(ids, variable=key)
        except exception.MaskSyntaxError as exc:
            _fail(key, value, 'GPU %s: %s' % (uuid, exc.kwargs['reason']
                                              or exc))
    return result


class _Pairs(list):
    """A JSON object kept as its (key, value) pairs."""


def _pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    return _Pairs(pairs)


def encode_cu_allocated(cus: Mapping[str, int | Iterable[int]]) -> str:
    """Encode ``hami.io/amd-cu-allocated`` (keys sorted, as Go writes a
    map).

    :param cus: GPU uuid -> CU bitmap or CU ids.
    :raises SharingError: a GPU with no CU.
    """
    return _go_json({uuid: cumask.format_id_list(cus[uuid])
                     for uuid in sorted(cus)})


def gpu_shapes(devices: Iterable[DeviceInfo],
               key: str = NODE_REGISTER) -> dict[str, tuple[int, int]]:
    """GPU id -> (CUs, allocation unit) of registered devices, the input
    of :func:`rebuild_allocators`.

    :raises HamiProtocolError: a device without id or CUs, or an id twice.
    """
    shapes: dict[str, tuple[int, int]] = {}
    for device in devices:
        if not device.id or device.devcore <= 0:
            _fail(key, repr(device), 'a shared GPU needs an id and CUs')
        if device.devcore > allocator.MAX_CUS:
            _fail(key, repr(device), '%d CUs is beyond %d'
                  % (device.devcore, allocator.MAX_CUS))
        if device.id in shapes:
            _fail(key, device.id, 'GPU %s is registered twice' % device.id)
        unit = device.cu_unit
        if device.devcore % unit:
            _fail(key, repr(device), '%d CUs are not whole units of %d'
                  % (device.devcore, unit))
        shapes[device.id] = (device.devcore, unit)
    return shapes


def rebuild_allocators(
        gpus: Mapping[str, tuple[int, int]],
        pods: Iterable[tuple[str, str]],
        strategy: allocator.CuStrategy | None = None,
        factory: Callable[..., allocator.CuAllocator] | None = None,
        key: str = CU_ALLOCATED) -> dict[str, allocator.CuAllocator]:
    """Rebuild CU occupancy of a node from its live pods' annotations.

    :param gpus: GPU uuid -> (CU count, allocation unit).
    :param pods: (owner, ``hami.io/amd-cu-allocated`` value) of each live
        pod (the caller leaves out Succeeded and Failed pods).
    :param strategy: strategy of the new allocators.
    :param factory: builds an allocator (default :class:`CuAllocator`).
    :returns: GPU uuid -> allocator holding every pod's CUs.
    :raises HamiProtocolError: a bad value, or a GPU the node does not have.
    :raises AllocationConflict: two pods claim the same CU (naming both) or
        an owner is listed twice.
    :raises SharingError: a CU beyond the GPU's CU count.
    """
    make = factory or allocator.CuAllocator
    result = {uuid: make(uuid, total, unit=unit, strategy=strategy)
              for uuid, (total, unit) in gpus.items()}
    for owner, value in pods:
        for uuid, mask in decode_cu_allocated(value, key).items():
            if uuid not in result:
                _fail(key, value, 'pod %s holds CUs of GPU %s, which this '
                      'node does not have (known: %s)'
                      % (owner, uuid, ', '.join(sorted(result)) or 'none'))
            result[uuid].claim_mask(owner, mask)
    return result


#: Pod labels that record an allocation (HAMi's scheduler labels a pod
#: with the node it chose, for selecting a node's pods): written, like
#: :data:`ALLOCATION_ANNOTATIONS`, only by the project's service accounts.
ALLOCATION_LABELS = (VGPU_NODE,)
