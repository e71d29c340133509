"""The allocation record: which pod holds which GPU, CUs and MiB of a node.

The record is the truth the extender and the device plugin share; pod
annotations (``hami.io/*``) are only a mirror of it for HAMi tools. It
lives in one ConfigMap per node in the project's namespace
(:func:`configmap_name`), which only the scheduler's service account may
write, and it is replaced as a whole with a ``resourceVersion``
precondition (see :mod:`amdgpu_virt.k8s.record.store`), so two writers
never both win.

This module is pure: it encodes and decodes the record's content, checks
it strictly (types, bounds, no unknown fields, no over-commit), and adds
or removes one pod's grants. A grant carries the concrete CU ranges the
extender chose; the device plugin serves exactly those.

The ConfigMap's ``data``::

    allocations: {"node": "n1", "pods": {"<pod uid>": {
        "namespace": "team", "name": "job", "time": 1764600000,
        "containers": [[{"gpu": "<uuid>", "mem": 4096, "cus": "0-37"}],
                       []]}}}

``containers`` follows the HAMi container order (init containers, then
containers). ``cus`` is a CU id list; a grant of every CU of the GPU is
a whole GPU, which no other pod may share.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any
from typing import NoReturn

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami

PREFIX = 'amdgpu-virt-alloc-'
DATA_KEY = 'allocations'
COMPONENT_LABEL = 'app.kubernetes.io/component'
COMPONENT = 'allocation-record'
#: bounds that keep a crafted record cheap to read
MAX_BYTES = 900 * 1024
MAX_PODS = 4096
MAX_CONTAINERS = 64
MAX_GPUS = 64
MAX_MIB = (1 << 31) - 1

_NAME = re.compile(r'^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')
_UID = re.compile(r'^[A-Za-z0-9-]{1,64}$')
_GPU = re.compile(r'^[A-Za-z0-9._:-]{1,128}$')
_MAX_NAME = 253


def configmap_name(node: str) -> str:
    """``amdgpu-virt-alloc-<node>``; a node name too long for that is cut
    and suffixed with a hash of the whole name (deterministic)."""
    name = PREFIX + node
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return '%s%s-%s' % (PREFIX, node[:_MAX_NAME - len(PREFIX) - 17].rstrip(
        '-.'), digest)


@dataclasses.dataclass(frozen=True)
class Grant:
    """One GPU of one container: its memory and CUs (a bitmap)."""

    gpu: str
    mem: int
    cus: int


@dataclasses.dataclass(frozen=True)
class PodGrants:
    """What one pod holds on the node.

    :ivar time: when the extender booked it (UNIX seconds).
    :ivar containers: grants per container, HAMi container order.
    """

    uid: str
    namespace: str
    name: str
    time: int
    containers: tuple[tuple[Grant, ...], ...]

    @property
    def key(self) -> str:
        return '%s/%s' % (self.namespace, self.name)

    def describe(self) -> str:
        return 'pod %s (uid %s)' % (self.key, self.uid)

    def masks(self) -> dict[str, int]:
        """CUs per GPU over all containers (the ``hami.io/amd-cu-allocated``
        mirror)."""
        result: dict[str, int] = {}
        for container in self.containers:
            for grant in container:
                result[grant.gpu] = result.get(grant.gpu, 0) | grant.cus
        return result


@dataclasses.dataclass(frozen=True)
class Record:
    """The allocation record of one node."""

    node: str
    pods: Mapping[str, PodGrants] = dataclasses.field(default_factory=dict)

    def find(self, namespace: str, name: str) -> PodGrants | None:
        for grants in self.pods.values():
            if grants.namespace == namespace and grants.name == name:
                return grants
        return None


@dataclasses.dataclass(frozen=True)
class Capacity:
    """One registered GPU: slots, MiB and CUs (from its registration)."""

    slots: int
    mem: int
    cus: int
    unit: int = 1


def capacity_of(devices: Iterable[hami.DeviceInfo]) -> dict[str, Capacity]:
    """Capacity per GPU (lower-case id) of a node registration."""
    return {d.id.lower(): Capacity(d.count, d.devmem, d.devcore, d.cu_unit)
            for d in devices}


# --- codec -------------------------------------------------------------------

def _fail(where: str, field: str, reason: str) -> NoReturn:
    raise exception.AllocationRecordError(record=where, reason='%s: %s' % (
        field, reason))


def _int(where: str, field: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or \
            not low <= value <= high:
        _fail(where, field, 'not an integer in %d..%d: %r' % (
            low, high, value if not isinstance(value, str) else value[:40]))
    return int(value)


def _str(where: str, field: str, value: Any, pattern: re.Pattern[str]
         ) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        _fail(where, field, 'not a valid name: %r' % (
            value[:80] if isinstance(value, str) else type(value).__name__))
    return str(value)


def _keys(where: str, field: str, obj: Any, allowed: set[str]) -> None:
    if not isinstance(obj, dict):
        _fail(where, field, 'not an object')
    unknown = set(obj) - allowed
    if unknown:
        _fail(where, field, 'unknown field %r' % sorted(unknown)[0][:40])
    missing = allowed - set(obj)
    if missing:
        _fail(where, field, 'missing %r' % sorted(missing)[0])


def _grant(where: str, field: str, obj: Any) -> Grant:
    _keys(where, field, obj, {'gpu', 'mem', 'cus'})
    gpu = _str(where, field + '.gpu', obj['gpu'], _GPU).lower()
    mem = _int(where, field + '.mem', obj['mem'], 0, MAX_MIB)
    text = obj['cus']
    if not isinstance(text, str) or len(text) > 4096:
        _fail(where, field + '.cus', 'not a CU list')
    try:
        cus = cumask.parse_id_list(text, '%s %s.cus' % (where, field))
    except exception.MaskSyntaxError as err:
        _fail(where, field + '.cus', str(err))
    return Grant(gpu, mem, cus)


def decode(text: str, node: str, where: str | None = None) -> Record:
    """The record of ``node`` from its ConfigMap's ``allocations`` value.

    :raises AllocationRecordError: naming the record and the field: not
        JSON, a wrong node, an unknown or missing field, a value out of
        bounds, more than the bounds allow.
    """
    where = where or configmap_name(node)
    if not isinstance(text, str):
        _fail(where, DATA_KEY, 'not a string')
    if len(text) > MAX_BYTES:
        _fail(where, DATA_KEY, 'larger than %d bytes' % MAX_BYTES)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        _fail(where, DATA_KEY, 'not JSON: %s' % err)
    _keys(where, DATA_KEY, data, {'node', 'pods'})
    if data['node'] != node:
        _fail(where, 'node', 'the record is for node %r, not %r' % (
            str(data['node'])[:80], node))
    pods = data['pods']
    if not isinstance(pods, dict) or len(pods) > MAX_PODS:
        _fail(where, 'pods', 'not an object of at most %d pods' % MAX_PODS)
    result: dict[str, PodGrants] = {}
    for uid, entry in pods.items():
        field = 'pods[%s]' % str(uid)[:64]
        _str(where, field, uid, _UID)
        _keys(where, field, entry, {'namespace', 'name', 'time',
                                    'containers'})
        containers = entry['containers']
        if not isinstance(containers, list) or \
                len(containers) > MAX_CONTAINERS:
            _fail(where, field + '.containers',
                  'not a list of at most %d containers' % MAX_CONTAINERS)
        decoded = []
        for number, container in enumerate(containers):
            here = '%s.containers[%d]' % (field, number)
            if not isinstance(container, list) or len(container) > MAX_GPUS:
                _fail(where, here, 'not a list of at most %d GPUs'
                      % MAX_GPUS)
            grants = tuple(_grant(where, '%s[%d]' % (here, n), g)
                           for n, g in enumerate(container))
            if len({g.gpu for g in grants}) != len(grants):
                _fail(where, here, 'a GPU is listed twice')
            decoded.append(grants)
        result[uid] = PodGrants(
            uid, _str(where, field + '.namespace', entry['namespace'],
                      _NAME),
            _str(where, field + '.name', entry['name'], _NAME),
            _int(where, field + '.time', entry['time'], 0, 1 << 40),
            tuple(decoded))
    return Record(node, result)


def encode(record: Record) -> str:
    """The ``allocations`` value (sorted keys: equal records, equal text)."""
    pods = {}
    for uid, grants in record.pods.items():
        pods[uid] = {
            'namespace': grants.namespace, 'name': grants.name,
            'time': grants.time, 'containers': [
                [{'gpu': g.gpu, 'mem': g.mem,
                  'cus': cumask.format_id_list(g.cus)}
                 for g in container] for container in grants.containers]}
    return json.dumps({'node': record.node, 'pods': pods}, sort_keys=True,
                      separators=(',', ':'))


# --- checks and changes ------------------------------------------------------

def check(record: Record, capacity: Mapping[str, Capacity],
          where: str | None = None) -> None:
    """Fail closed on an over-committed record.

    Every grant must name a GPU of ``capacity`` and stay within its CUs;
    CU ranges never overlap; a GPU's slots and memory are not exceeded;
    a whole GPU (every CU) is held by one container alone.

    :raises AllocationRecordError: naming the GPU and the pods.
    """
    where = where or configmap_name(record.node)
    used: dict[str, list[Any]] = {}
    for grants in sorted(record.pods.values(), key=lambda g: g.uid):
        for container in grants.containers:
            for grant in container:
                cap = capacity.get(grant.gpu)
                if cap is None:
                    _fail(where, grants.describe(), 'GPU %s is not one of '
                          'node %s' % (grant.gpu, record.node))
                if grant.cus >> cap.cus:
                    _fail(where, grants.describe(), 'CUs beyond the %d of '
                          'GPU %s' % (cap.cus, grant.gpu))
                state = used.setdefault(grant.gpu, [0, 0, 0, None, False])
                owner = state[3]
                if state[0] & grant.cus:
                    _fail(where, grants.describe(), 'CUs %s of GPU %s are '
                          'also held by %s' % (cumask.format_id_list(
                              state[0] & grant.cus), grant.gpu, owner))
                whole = grant.cus == (1 << cap.cus) - 1
                if state[1] and (whole or state[4]):
                    _fail(where, grants.describe(), 'GPU %s is held whole '
                          'by one of %s and shared' % (grant.gpu, owner))
                state[0] |= grant.cus
                state[1] += 1
                state[2] += grant.mem
                state[3] = grants.describe()
                state[4] = state[4] or whole
                if state[1] > cap.slots:
                    _fail(where, grants.describe(), 'GPU %s has %d slots, '
                          'more are booked' % (grant.gpu, cap.slots))
                if state[2] > cap.mem:
                    _fail(where, grants.describe(), 'GPU %s has %d MiB, %d '
                          'are booked' % (grant.gpu, cap.mem, state[2]))


def without(record: Record, uid: str) -> Record:
    """The record without pod ``uid`` (the same record if it holds
    nothing)."""
    if uid not in record.pods:
        return record
    return Record(record.node, {k: v for k, v in record.pods.items()
                                if k != uid})


def book(record: Record, uid: str, namespace: str, name: str, when: int,
         containers: hami.PodDevices, capacity: Mapping[str, Capacity],
         strategy: allocator.CuStrategy | None = None) -> Record:
    """The record with pod ``uid`` holding ``containers`` (replacing what
    it held), concrete CU ranges chosen against every other pod's.

    :raises InsufficientCapacity: the CUs, MiB or slots are not free any
        more (another writer booked them).
    :raises AllocationRecordError: the result would be over-committed.
    """
    base = without(record, uid)
    allocators: dict[str, allocator.CuAllocator] = {}
    # MiB and slots other pods hold per GPU: what this pod asks beyond the
    # rest is "no room" (a writer whose cache lagged), not a bad record
    mem_used: dict[str, int] = {}
    slots_used: dict[str, int] = {}
    for other in base.pods.values():
        for held_by_container in other.containers:
            for held in held_by_container:
                mem_used[held.gpu] = mem_used.get(held.gpu, 0) + held.mem
                slots_used[held.gpu] = slots_used.get(held.gpu, 0) + 1
        for gpu, mask in other.masks().items():
            cap = capacity.get(gpu)
            if cap is None:
                continue
            alloc = allocators.get(gpu)
            if alloc is None:
                alloc = allocators[gpu] = allocator.CuAllocator(
                    gpu, cap.cus, unit=cap.unit, strategy=strategy)
            alloc.claim_mask(other.uid, mask)
    owner = '%s/%s' % (namespace, name)
    booked = []
    for number, container in enumerate(containers):
        grants = []
        for device in container:
            gpu = device.uuid.lower()
            cap = capacity.get(gpu)
            if cap is None:
                raise exception.AllocationRecordError(
                    record=configmap_name(record.node),
                    reason='pod %s: GPU %s is not one of node %s' % (
                        owner, device.uuid, record.node))
            alloc = allocators.get(gpu)
            if alloc is None:
                alloc = allocators[gpu] = allocator.CuAllocator(
                    gpu, cap.cus, unit=cap.unit, strategy=strategy)
            mib = max(device.usedmem, 0)
            if mem_used.get(gpu, 0) + mib > cap.mem:
                raise exception.InsufficientCapacity(
                    gpu=gpu, requested=mib, unit='MiB', owner=owner,
                    free=max(cap.mem - mem_used.get(gpu, 0), 0),
                    capacity=cap.mem)
            if slots_used.get(gpu, 0) + 1 > cap.slots:
                raise exception.InsufficientCapacity(
                    gpu=gpu, requested=1, unit='slots', owner=owner,
                    free=max(cap.slots - slots_used.get(gpu, 0), 0),
                    capacity=cap.slots)
            mem_used[gpu] = mem_used.get(gpu, 0) + mib
            slots_used[gpu] = slots_used.get(gpu, 0) + 1
            count = min(max(device.usedcores, 0), cap.cus) or cap.cus
            if count >= cap.cus:
                if alloc.used_count:
                    raise exception.InsufficientCapacity(
                        gpu=gpu, requested='all %d' % count, unit='CUs',
                        owner=owner, free=alloc.free_count,
                        capacity=cap.cus)
                mask = alloc.full_mask
                alloc.claim_mask('%s#%d' % (owner, number), mask)
            else:
                mask = alloc.allocate_mask('%s#%d' % (owner, number), count)
            grants.append(Grant(gpu, mib, mask))
        booked.append(tuple(grants))
    pods = dict(base.pods)
    pods[uid] = PodGrants(uid, namespace, name, when, tuple(booked))
    result = Record(record.node, pods)
    check(result, capacity)
    return result


#: phases of pods that hold nothing any more
DONE_PHASES = ('Succeeded', 'Failed')


def prune(record: Record, live: Mapping[str, str], now: int,
          unbound_ttl: int, newest: Mapping[str, int] | None = None
          ) -> Record:
    """The record without the pods that hold nothing any more.

    :param live: node name (``''`` unbound) of every live pod by UID
        (listed after the record was read).
    :param unbound_ttl: seconds a booked pod may stay unbound (a
        scheduler that died between filter and bind).
    :param newest: per unbound pod, the time of its current booking
        (on another node, see :mod:`amdgpu_virt.k8s.record.sweep`): a booking
        of the pod older than that goes at once (the pod was booked again
        since, and the removal of this one was lost), not after
        ``unbound_ttl``. One of the same second or newer stays.
    """
    keep = {}
    for uid, grants in record.pods.items():
        node = live.get(uid)
        if node is None or node and node != record.node:
            continue
        if not node and (now - grants.time > unbound_ttl or (
                newest is not None
                and grants.time < newest.get(uid, grants.time))):
            continue
        keep[uid] = grants
    if len(keep) == len(record.pods):
        return record
    return Record(record.node, keep)
