"""Pod allocation (``hami.io/amd-devices-to-allocate`` and
``hami.io/amd-devices-allocated``) and per-pod CU ranges
(``hami.io/amd-cu-allocated``), with :func:`rebuild_allocators` that turns
those of a node's live pods back into one CU allocator per GPU."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing.hami.common import _check_text
from amdgpu_virt.sharing.hami.common import _fail
from amdgpu_virt.sharing.hami.common import _go_int
from amdgpu_virt.sharing.hami.common import _go_json
from amdgpu_virt.sharing.hami.common import _INT32_MAX
from amdgpu_virt.sharing.hami.common import _json_constant
from amdgpu_virt.sharing.hami.names import CU_ALLOCATED
from amdgpu_virt.sharing.hami.names import DEVICES_ALLOCATED
from amdgpu_virt.sharing.hami.names import NODE_REGISTER
from amdgpu_virt.sharing.hami.register import DeviceInfo


@dataclasses.dataclass(frozen=True)
class ContainerDevice:
    """One GPU given to one container: ``UUID,Type,UsedMemMiB,UsedCUs``."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int


#: Devices per container, init containers first, then containers.
PodDevices = tuple[tuple[ContainerDevice, ...], ...]

_new = object.__new__


def _device(uuid: str, kind: str, usedmem: int,
            usedcores: int) -> ContainerDevice:
    """``ContainerDevice(uuid, kind, usedmem, usedcores)``, made without
    the frozen dataclass's ``object.__setattr__`` per field (a list makes
    one per pod): the same instance, field for field (a test checks)."""
    device = _new(ContainerDevice)
    fields = device.__dict__
    fields['uuid'] = uuid
    fields['type'] = kind
    fields['usedmem'] = usedmem
    fields['usedcores'] = usedcores
    return device


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


#: what follows a device's UUID in a value of one container with one
#: device whose counts have at most 9 digits (so within 32 bits): what
#: most pods carry
_ONE_DEVICE_TAIL = re.compile(r'([^,:;]+),([0-9]{1,9}),([0-9]{1,9}):?;?')
#: (type, memory, CUs) per such tail: pods of one size on one GPU model
#: carry the same tail after different UUIDs. Bounded: cleared when full,
#: and a tail longer than this is read each time
_TAILS: dict[str, tuple[str, int, int]] = {}
_TAIL_ENTRIES = 4096
_TAIL_CHARS = 128


def decode_one_device(value: str) -> PodDevices | None:
    """What :func:`decode_pod_devices` gives for a value of one container
    with one device whose counts have at most 9 digits (what most pods
    carry): ``UUID,Type,UsedMemMiB,UsedCUs`` with an optional final ``:``
    and ``;``; None for any other value (valid or not), which
    :func:`decode_pod_devices` then reads.

    The part after the UUID is read once per distinct text (see
    :data:`_TAILS`); the UUID is checked on every call.
    """
    uuid, _sep, tail = value.partition(',')
    fields = _TAILS.get(tail)
    if fields is None:
        one = _ONE_DEVICE_TAIL.fullmatch(tail)
        if one is None:
            return None
        kind, mem, cores = one.groups()
        fields = (kind, int(mem), int(cores))
        if len(tail) <= _TAIL_CHARS:
            if len(_TAILS) >= _TAIL_ENTRIES:
                _TAILS.clear()
            _TAILS[tail] = fields
    if not uuid or ':' in uuid or ';' in uuid:
        return None
    # _device's way, one call fewer (a list makes one per pod)
    device = _new(ContainerDevice)
    known = device.__dict__
    known['uuid'] = uuid
    known['type'], known['usedmem'], known['usedcores'] = fields
    return ((device,),)


def _decode_pod_devices(value: str, key: str) -> PodDevices:
    one = decode_one_device(value)
    if one is not None:
        return one
    return _decode_containers(value, key)


def _decode_containers(value: str, key: str) -> PodDevices:
    """Any number of containers and devices, field by field."""
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
