"""What the extender's cache keeps of a node and of a pod.

:func:`decode_node` and :func:`decode_pod` turn API objects (plain dicts,
as the API serves them) into :class:`NodeEntry` and :class:`PodEntry`, and
:func:`decode_host` any live pod into what it asks of its node's host
(:data:`HostUse`, pods of every scheduler: they share the host); they
never raise on what a node or a pod owner wrote: a device that cannot be
read is left out of its node, a node whose registration cannot be read at
all offers nothing, and a live pod whose allocation cannot be read gives an
entry with ``problem`` set (its node then takes nothing more: its usage is
unknown). These are the reference decoders: the list's typed decoder
(:mod:`amdgpu_virt.k8s.scheduler.cache.pages`) gives the same entries.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.fit import host as fithost
from amdgpu_virt.k8s.fit import view as fitview
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

DONE_PHASES = ('Succeeded', 'Failed')


@dataclasses.dataclass(frozen=True)
class NodeEntry:
    """What a node registers: its usable AMD devices, or why none; and
    what its host offers pods (``status.allocatable``; None: unknown)."""

    name: str
    devices: tuple[hami.DeviceInfo, ...]
    problem: str | None = None
    allocatable: fithost.HostAmount | None = None


#: what a live pod asks of a host: the node it is bound to (``''``: none
#: yet) and its CPU and memory request (None: unreadable)
HostUse = tuple[str, fithost.HostAmount | None]


@dataclasses.dataclass(frozen=True)
class PodEntry:
    """A live pod holding (or about to hold) AMD GPUs of a node."""

    key: str
    node: str
    devices: hami.PodDevices
    cu_masks: Mapping[str, int] | None = None
    problem: str | None = None
    resource_version: int | None = None
    value: str = ''


_new = object.__new__


def _live_pod(key: str, node: str, devices: hami.PodDevices,
              cu_masks: Mapping[str, int] | None, rv: int | None,
              value: str) -> PodEntry:
    """``PodEntry(key, node, devices, cu_masks, None, rv, value)``, made
    without the frozen dataclass's ``object.__setattr__`` per field (a list
    makes one per pod): the same instance, field for field (a test
    checks)."""
    entry = _new(PodEntry)
    fields = entry.__dict__
    fields['key'] = key
    fields['node'] = node
    fields['devices'] = devices
    fields['cu_masks'] = cu_masks
    fields['problem'] = None
    fields['resource_version'] = rv
    fields['value'] = value
    return entry


def rv_of(value: Any) -> int | None:
    """A resourceVersion as a number (None: absent or not a number)."""
    if type(value) is str and value.isdecimal() and len(value) <= 18:
        return int(value)   # what the API serves: decimal digits
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _rv(obj: Mapping[str, Any]) -> int | None:
    return rv_of((obj.get('metadata') or {}).get('resourceVersion'))


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get('metadata') or {}
    return '%s/%s' % (meta.get('namespace', ''), meta.get('name', ''))


def decode_node(obj: Mapping[str, Any],
                resource: str = hami.RESOURCE_GPU) -> NodeEntry:
    """A node's usable AMD devices; never raises on bad annotations."""
    meta = obj.get('metadata') or {}
    name = str(meta.get('name', ''))
    annotations = meta.get('annotations') or {}
    value = annotations.get(hami.NODE_REGISTER) \
        if isinstance(annotations, Mapping) else None
    status = obj.get('status') or {}
    allocatable = fithost.node_allocatable(status)
    if not isinstance(value, str):
        return NodeEntry(name, (), None, allocatable)
    capacity = (status.get('capacity') or {}).get(resource)
    return node_entry(name, value, capacity, resource, allocatable)


def node_inputs(obj: Mapping[str, Any],
                resource: str = hami.RESOURCE_GPU) -> tuple[Any, ...]:
    """What :func:`decode_node` reads of ``obj``: equal inputs give equal
    entries (a node's other changes, such as its lock, need no decoding
    again)."""
    meta = obj.get('metadata') or {}
    annotations = meta.get('annotations') or {}
    status = obj.get('status') or {}
    if not isinstance(status, Mapping):
        status = {}
    capacity = status.get('capacity') or {}
    allocatable = status.get('allocatable') or {}
    return (meta.get('name'), annotations.get(hami.NODE_REGISTER)
            if isinstance(annotations, Mapping) else None,
            capacity.get(resource) if isinstance(capacity, Mapping)
            else capacity,
            (allocatable.get('cpu'), allocatable.get('memory'))
            if isinstance(allocatable, Mapping) else allocatable)


def node_entry(name: str, value: str, capacity: Any,
               resource: str = hami.RESOURCE_GPU,
               allocatable: fithost.HostAmount | None = None) -> NodeEntry:
    """The entry of node ``name`` registering ``value``, with this
    capacity of ``resource`` (None: not reported) and this host
    ``allocatable``."""
    if capacity is not None and str(capacity) == '0':
        return NodeEntry(name, (), 'node reports %s capacity 0 (device '
                         'plugin down or every GPU unhealthy)' % resource,
                         allocatable)
    try:
        devices = hami.decode_node_register(value)
    except exception.HamiProtocolError as err:
        salvaged = _salvage(name, value)
        if salvaged is None:
            LOG.warning('node %s: %s unreadable, offering nothing: %s',
                        name, hami.NODE_REGISTER, err)
            return NodeEntry(name, (), 'unreadable %s: %s' % (
                hami.NODE_REGISTER, err), allocatable)
        devices = salvaged
    usable = []
    seen: set[str] = set()
    for device in devices:
        problem = fitview.usable_device(device)
        if problem is None and device.id.lower() in seen:
            problem = 'registered twice'
        if problem:
            LOG.warning('node %s: device %r of %s skipped: %s', name,
                        device.id, hami.NODE_REGISTER, problem)
            continue
        seen.add(device.id.lower())
        usable.append(device)
    return NodeEntry(name, tuple(usable), None, allocatable)


def _salvage(name: str, value: str) -> tuple[hami.DeviceInfo, ...] | None:
    """The readable entries of a JSON registration with bad ones."""
    try:
        entries = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entries, list):
        return None
    devices: list[hami.DeviceInfo] = []
    for number, entry in enumerate(entries):
        try:
            devices.extend(hami.decode_node_register(json.dumps([entry])))
        except (exception.HamiProtocolError, TypeError, ValueError) as bad:
            LOG.warning('node %s: device %d of %s skipped: %s', name,
                        number, hami.NODE_REGISTER, bad)
    return tuple(devices)


def decode_pod(obj: Mapping[str, Any]) -> PodEntry | None:
    """The GPUs a live pod holds, or None when it holds none.

    A bad allocation annotation gives an entry with ``problem`` set (its
    node then takes nothing more); it never raises.
    """
    meta = obj.get('metadata') or {}
    annotations = meta.get('annotations') or {}
    if not isinstance(annotations, Mapping):
        return None
    key_name = hami.DEVICES_ALLOCATED
    value = annotations.get(key_name)
    if value is None:
        key_name = hami.DEVICES_TO_ALLOCATE
        value = annotations.get(key_name)
    if value is None:
        return None
    spec = obj.get('spec') or {}
    node = spec.get('nodeName') or annotations.get(hami.VGPU_NODE)
    if not node or (obj.get('status') or {}).get('phase') in DONE_PHASES:
        return None
    return pod_entry(pod_key(obj), str(node), key_name, value,
                     annotations.get(hami.CU_ALLOCATED), _rv(obj))


def decode_host(obj: Mapping[str, Any]) -> HostUse | None:
    """What a live pod asks of its node's host, or None when it has
    finished (any pod, whatever its scheduler; never raises)."""
    status = obj.get('status') or {}
    if not isinstance(status, Mapping) or \
            status.get('phase') in DONE_PHASES:
        return None
    spec = obj.get('spec') or {}
    if not isinstance(spec, Mapping):
        return '', None
    node = spec.get('nodeName')
    return (node if isinstance(node, str) else '',
            fithost.pod_request(spec))


def pod_entry(key: str, node: str, key_name: str, value: Any,
              cu_value: Any, rv: int | None) -> PodEntry:
    """The entry of live pod ``key`` on ``node`` whose annotation
    ``key_name`` holds ``value`` (and ``hami.io/amd-cu-allocated``
    ``cu_value``): its devices, or a problem when they cannot be read."""
    if not cu_value and type(value) is str:
        # most pods: one device, no stored ranges
        devices = hami.decode_one_device(value)
        if devices is not None:
            return _live_pod(key, node, devices, None, rv, value)
    try:
        if not isinstance(value, str):
            raise exception.HamiProtocolError(key=key_name, value=value,
                                              reason='not a string')
        devices = hami.decode_pod_devices(value, key_name)
        masks = None
        if cu_value:
            masks = hami.decode_cu_allocated(str(cu_value))
    except exception.HamiProtocolError as err:
        LOG.warning('pod %s: %s; node %s takes no more GPU pods until it '
                    'is fixed or gone', key, err, node)
        return PodEntry(key, node, (), None,
                        'pod %s carries an unreadable annotation (%s); '
                        'nothing more is placed on this node until it is '
                        'fixed or gone' % (key, err), rv, '')
    return _live_pod(key, node, devices, masks, rv, value)
