"""What a node offers: its registered AMD GPUs and what its pods use of
them, with the summaries the extender's indexes and fragmentation score
read (see :mod:`amdgpu_virt.k8s.fit`, which re-exports every name here).

Pure: HAMi registrations and pod usage in, frozen dataclasses out.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import re
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

LOG = logging.getLogger(__name__)

_FORBIDDEN_TEXT = ',:;'
_FORBIDDEN = re.compile('[%s]' % re.escape(_FORBIDDEN_TEXT))


@dataclasses.dataclass(frozen=True)
class GpuState:
    """One registered GPU and what the node's pods use of it.

    :ivar free_mask: free CUs in the CU allocator's view (pods' stored
        ranges, and ranges the strategy would give to pods not allocated
        yet), whole allocation units only.
    """

    info: hami.DeviceInfo
    unit: int
    used_slots: int
    used_cores: int
    used_mem: int
    free_mask: int
    #: free CUs a new consumer may get (the counts and the CU view agree)
    usable_cores: int = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, 'usable_cores', _usable_cores(
            self.info, self.used_cores, self.free_mask))

    @property
    def free_cores(self) -> int:
        return self.info.devcore - self.used_cores

    @property
    def free_mem(self) -> int:
        return self.info.devmem - self.used_mem

    @property
    def idle(self) -> bool:
        """Nothing uses the GPU: a whole-GPU request may take it."""
        return not (self.used_slots or self.used_cores or self.used_mem) \
            and self.usable_cores >= self.info.devcore

    def free(self) -> packing.GpuFree:
        """What is free, for the fragmentation score."""
        info = self.info
        return packing.GpuFree(
            round(self.usable_cores / info.devcore, 4),
            round(max(0, self.free_mem) / info.devmem, 4),
            self.used_slots < info.count, self.idle, max(0, self.free_mem))

    @property
    def usage(self) -> float:
        """Slots, CUs and memory used, each as a fraction, summed (0..3)."""
        info = self.info
        return (self.used_slots / info.count if info.count > 0 else 1.0) + \
            self.used_cores / info.devcore + self.used_mem / info.devmem


def _usable_cores(info: hami.DeviceInfo, used_cores: int,
                  free_mask: int) -> int:
    return max(0, min(info.devcore - used_cores, free_mask.bit_count()))


_new = object.__new__


def gpu_state(info: hami.DeviceInfo, unit: int, used_slots: int,
              used_cores: int, used_mem: int, free_mask: int) -> GpuState:
    """``GpuState(info, unit, used_slots, used_cores, used_mem,
    free_mask)``, made without the frozen dataclass's
    ``object.__setattr__`` per field (a cache builds one per GPU of the
    cluster): the same instance, field for field (a test checks)."""
    state = _new(GpuState)
    state.__dict__.update(
        info=info, unit=unit, used_slots=used_slots, used_cores=used_cores,
        used_mem=used_mem, free_mask=free_mask,
        usable_cores=_usable_cores(info, used_cores, free_mask))
    return state


@dataclasses.dataclass(frozen=True)
class NodeView:
    """A node's AMD GPUs as the extender sees them.

    :ivar problem: why nothing may be placed here (fail closed), or None.
    :ivar usage: mean GPU usage, 0..1 (the node policies' measure).
    """

    name: str
    gpus: tuple[GpuState, ...]
    problem: str | None = None
    usage: float = 0.0
    #: most free CUs / MiB on one GPU, and GPUs with a free slot
    max_free_cores: int = 0
    max_free_mem: int = 0
    open_gpus: int = 0
    #: sort keys of the node policies (busiest or idlest first, by name)
    rank_binpack: tuple[float, str] = (0.0, '')
    rank_spread: tuple[float, str] = (0.0, '')
    #: healthy GPUs, what is free on them (same order), idle ones, and
    #: the free CUs (in GPUs) of the others
    healthy: tuple[GpuState, ...] = ()
    frees: tuple[packing.GpuFree, ...] = ()
    idle_gpus: int = 0
    partial_free: float = 0.0
    #: what a placement depends on, per healthy GPU: equal signatures
    #: take the same placements at the same cost
    signature: tuple[tuple[int, ...], ...] = ()


def node_view(**fields: Any) -> NodeView:
    """``NodeView(**fields)`` where ``fields`` names every field, made
    without the frozen dataclass's ``object.__setattr__`` per field (a
    cache builds one per node of the cluster): the same instance, field
    for field (a test checks)."""
    view = _new(NodeView)
    view.__dict__.update(fields)
    return view


#: devices whose fields other than the id :func:`usable_device` keeps
#: the verdict of, per (type, devcore, devmem, count, CU unit): every GPU
#: of a node, and of nodes of one kind, registers the same
_DEVICE_PROBLEM_ENTRIES = 1024


def usable_device(device: hami.DeviceInfo) -> str | None:
    """Why a registered device cannot be scheduled on (None: it can)."""
    if not device.id or _FORBIDDEN.search(device.id) is not None:
        return 'id %r is empty or holds one of %s' % (device.id,
                                                     _FORBIDDEN_TEXT)
    return _device_problem(device.type, device.devcore, device.devmem,
                           device.count, device.cu_unit)


@functools.lru_cache(maxsize=_DEVICE_PROBLEM_ENTRIES)
def _device_problem(kind: str, devcore: int, devmem: int, count: int,
                    unit: int) -> str | None:
    """What is wrong with a device's fields other than its id."""
    if _FORBIDDEN.search(kind) is not None:
        return 'type %r holds one of %s' % (kind, _FORBIDDEN_TEXT)
    if devcore <= 0 or devcore > allocator.MAX_CUS:
        return 'devcore %d is not a CU count' % devcore
    if devmem <= 0:
        return 'devmem %d is not a memory size' % devmem
    if count <= 0:
        return 'count %d offers no slot' % count
    if devcore % unit:
        return '%d CUs are not whole units of %d' % (devcore, unit)
    return None


#: (owner, devices of each container, CU ranges per GPU uuid or None)
PodUsage = tuple[str, hami.PodDevices, Mapping[str, int] | None]


def replay_pending(node: str, alloc: allocator.CuAllocator, owner: str,
                   count: int) -> bool:
    """Book ``count`` CUs on ``alloc`` for ``owner``, a pod without stored
    CU ranges, the way the view replays it; False when they did not fit.

    A pod asking for all of a GPU's CUs takes the whole mask when the GPU
    is untouched, and nothing otherwise (its counts still show it).
    """
    if count >= alloc.total:
        if not alloc.used_count:
            alloc.claim_mask(owner + '#pending', alloc.full_mask)
        return True
    try:
        alloc.allocate_mask(owner + '#pending', count)
    except exception.SharingError:
        # over-committed by someone else: the counts still say so
        LOG.debug('node %s: %d CUs of %s for %s do not fit the CU view',
                  node, count, alloc.gpu, owner)
        return False
    return True


def build_view(name: str, devices: Sequence[hami.DeviceInfo],
               pods: Iterable[PodUsage],
               strategy: allocator.CuStrategy | None = None,
               problem: str | None = None) -> NodeView:
    """The node's GPUs with their usage.

    :param devices: usable AMD devices (see :func:`usable_device`); a
        device registered twice is kept once.
    :param pods: usage of the node's live pods.
    :param strategy: CU strategy of the device plugin (for the ranges of
        pods not allocated yet).
    :param problem: a known reason to place nothing here.
    """
    strategy = strategy or allocator.BestFitStrategy()
    by_id: dict[str, hami.DeviceInfo] = {}
    for device in devices:
        by_id.setdefault(device.id.lower(), device)
    slots = collections.Counter[str]()
    cores = collections.Counter[str]()
    mem = collections.Counter[str]()
    pending: list[tuple[str, str, int]] = []
    stored: list[tuple[str, str, int]] = []
    for owner, containers, cu_masks in pods:
        mine: dict[str, int] = {}   # a plain dict: one per pod, keep it cheap
        for container in containers:
            for used in container:
                uuid = used.uuid.lower()
                if uuid not in by_id:
                    LOG.debug('node %s: pod %s uses GPU %s, which is not '
                              'registered; ignored', name, owner, used.uuid)
                    continue
                slots[uuid] += 1
                cores[uuid] += used.usedcores
                mem[uuid] += used.usedmem
                mine[uuid] = mine.get(uuid, 0) + used.usedcores
        for uuid, count in mine.items():
            mask = None
            if cu_masks:
                mask = cu_masks.get(uuid)
                if mask is None:
                    for key, value in cu_masks.items():
                        if key.lower() == uuid:
                            mask = value
            if mask:
                stored.append((owner, uuid, mask))
                count -= mask.bit_count()
            if count > 0:
                pending.append((owner, uuid, count))
    allocators: dict[str, allocator.CuAllocator] = {}
    for uuid in {uuid for _o, uuid, _m in stored} | \
            {uuid for _o, uuid, _c in pending}:
        device = by_id[uuid]
        allocators[uuid] = allocator.CuAllocator(
            uuid, device.devcore, unit=device.cu_unit, strategy=strategy)
    for owner, uuid, mask in stored:
        try:
            allocators[uuid].claim_mask(owner, mask)
        except exception.SharingError as err:
            problem = problem or 'pod %s: stored CU ranges unusable: %s' % (
                owner, err)
    for owner, uuid, count in pending:
        replay_pending(name, allocators[uuid], owner, count)
    states = []
    for uuid, device in by_id.items():
        used_alloc = allocators.get(uuid)
        # an untouched GPU: all its CUs (whole units, see usable_device)
        free = (1 << device.devcore) - 1 if used_alloc is None else \
            allocator.whole_units(used_alloc.free_mask, device.cu_unit)
        states.append(GpuState(device, device.cu_unit, slots[uuid],
                               cores[uuid], mem[uuid], free))
    states.sort(key=lambda s: (s.info.index, s.info.id))
    usage = sum(s.usage for s in states) / (3 * len(states)) if states \
        else 0.0
    healthy = tuple(s for s in states if s.info.health)
    frees = tuple(s.free() for s in healthy)
    return NodeView(
        name=name, gpus=tuple(states), problem=problem, usage=usage,
        max_free_cores=max((s.usable_cores for s in healthy), default=0),
        max_free_mem=max((s.free_mem for s in healthy), default=0),
        open_gpus=sum(1 for s in healthy
                      if s.used_slots < s.info.count),
        rank_binpack=(-usage, name), rank_spread=(usage, name),
        healthy=healthy, frees=frees,
        idle_gpus=sum(1 for f in frees if f.idle),
        partial_free=sum(f.cus for f in frees if not f.idle),
        signature=tuple((s.usable_cores, s.free_mem, s.used_slots,
                         s.info.count, s.info.devcore, s.info.devmem,
                         s.unit, int(s.idle)) for s in healthy))
