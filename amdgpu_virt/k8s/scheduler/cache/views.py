"""The extender cache's node views, built for a whole cluster at once.

:func:`amdgpu_virt.k8s.fit.view.build_view` is the reference: what a
node's GPUs offer given its pods. :class:`ViewBuilder` gives the very same
:class:`~amdgpu_virt.k8s.fit.view.NodeView` (a test compares them on
seeded clusters with hostile pods) for the cache, which builds every view of a
large cluster after a list, with less work per pod and per GPU:

* the CU allocator's replay of the pods that have no stored CU ranges is
  memoised per GPU by (CUs, allocation unit, the pods' CU counts in
  order): a strategy chooses from the free CUs and the count alone, and
  the owners only name the allocations, so the same sequence on any GPU of
  the same size leaves the same CUs free. A GPU with stored ranges is
  replayed in full (a bad range names its pod in the node's problem), and
  so is a sequence that did not fit (its pods are logged);
* what is free on a GPU, its usage and its part of the node's signature
  come from :class:`~amdgpu_virt.k8s.fit.view.GpuState`'s own methods
  once per distinct (GPU size, slots, CUs, memory, usable CUs) and are shared.

The memos are bounded (cleared when full; a GPU shared by more than
:data:`MEMO_PODS` pods is replayed each time) and belong to one builder,
hence to one CU strategy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.fit import view as fitview
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

#: most entries of each memo before it is cleared
MEMO_ENTRIES = 1 << 16
#: longest sequence of pods of one GPU whose replay is memoised (longer
#: ones are replayed each time: the memo's size stays bounded)
MEMO_PODS = 64


def _stored_mask(cu_masks: Mapping[str, int], uuid: str) -> int | None:
    """The stored CU ranges of GPU ``uuid`` (lower case) in a pod's
    ``hami.io/amd-cu-allocated``, whatever the case of its key there (the
    last such key, as the reference reads them)."""
    mask = cu_masks.get(uuid)
    if mask is None:
        for key, value in cu_masks.items():
            if key.lower() == uuid:
                mask = value
    return mask


def _gpu_order(gpu: tuple[fit.GpuState, Any, float, tuple[int, ...]]
               ) -> tuple[int, str]:
    """A node's GPUs in the order of their index, then id."""
    info = gpu[0].info
    return info.index, info.id


class ViewBuilder:
    """Builds node views as :func:`fit.build_view` does, memoising what
    repeats across GPUs (see the module's documentation).

    :param strategy: the device plugin's CU strategy.
    """

    def __init__(self, strategy: allocator.CuStrategy) -> None:
        self.strategy = strategy
        #: (CUs, unit, pending counts) -> free CUs in whole units
        self._replays: dict[tuple[int, int, tuple[int, ...]], int] = {}
        #: GPU counts -> (free, usage, signature entry)
        self._derived: dict[tuple[int, ...], tuple[Any, float,
                                                    tuple[int, ...]]] = {}

    def _replay(self, name: str, uuid: str, device: hami.DeviceInfo,
                unit: int, owners: list[str], counts: list[int]) -> int:
        """Free CUs (whole units) of a GPU after the pods without stored
        ranges (``owners``, asking ``counts`` CUs), in order."""
        key = None
        if len(counts) <= MEMO_PODS:
            key = (device.devcore, unit, tuple(counts))
            free = self._replays.get(key)
            if free is not None:
                return free
        alloc = allocator.CuAllocator(uuid, device.devcore, unit=unit,
                                      strategy=self.strategy)
        fitted = self._allocate(name, alloc,
                                zip(owners, counts, strict=True))
        free = allocator.whole_units(alloc.free_mask, unit)
        if fitted and key is not None:
            if len(self._replays) >= MEMO_ENTRIES:
                self._replays.clear()
            self._replays[key] = free
        return free

    @staticmethod
    def _allocate(name: str, alloc: allocator.CuAllocator,
                  pending: Iterable[tuple[str, int]]) -> bool:
        """What the reference does for pods without stored ranges; False
        when one did not fit the CU view."""
        fitted = True
        for owner, count in pending:
            fitted = fitview.replay_pending(name, alloc, owner, count) \
                and fitted
        return fitted

    def _state(self, device: hami.DeviceInfo, unit: int,
               counts: list[int], free: int
               ) -> tuple[fit.GpuState, Any, float, tuple[int, ...]]:
        state = fitview.gpu_state(device, unit, counts[0], counts[1],
                                  counts[2], free)
        key = (device.devcore, device.devmem, device.count, unit,
               counts[0], counts[1], counts[2], state.usable_cores)
        derived = self._derived.get(key)
        if derived is None:
            derived = (state.free(), state.usage, (
                state.usable_cores, state.free_mem, state.used_slots,
                device.count, device.devcore, device.devmem, unit,
                int(state.idle)))
            if len(self._derived) >= MEMO_ENTRIES:
                self._derived.clear()
            self._derived[key] = derived
        return (state, *derived)

    def build(self, name: str, devices: Sequence[hami.DeviceInfo],
              pods: Iterable[fit.PodUsage],
              problem: str | None = None) -> fit.NodeView:
        """The view :func:`fit.build_view` gives for these arguments (and
        this builder's strategy)."""
        by_id: dict[str, hami.DeviceInfo] = {}
        for device in devices:
            by_id.setdefault(device.id.lower(), device)
        #: per GPU: slots, CUs and memory used
        counts = {uuid: [0, 0, 0] for uuid in by_id}
        counts_of = counts.get
        stored: list[tuple[str, str, int]] = []
        #: per GPU: the pods without stored ranges, and their CU counts
        pending: dict[str, tuple[list[str], list[int]]] = {}
        for owner, containers, cu_masks in pods:
            if not cu_masks and len(containers) == 1:
                only = containers[0]
                if len(only) == 1:
                    # most pods: one container on one GPU, no stored
                    # ranges
                    used = only[0]
                    uuid = used.uuid.lower()
                    used_here = counts_of(uuid)
                    if used_here is not None:
                        cores = used.usedcores
                        used_here[0] += 1
                        used_here[1] += cores
                        used_here[2] += used.usedmem
                        if cores > 0:
                            waiting = pending.get(uuid)
                            if waiting is None:
                                pending[uuid] = ([owner], [cores])
                            else:
                                waiting[0].append(owner)
                                waiting[1].append(cores)
                        continue
            mine: dict[str, int] = {}
            for container in containers:
                for used in container:
                    uuid = used.uuid.lower()
                    used_here = counts_of(uuid)
                    if used_here is None:
                        LOG.debug('node %s: pod %s uses GPU %s, which is not '
                                  'registered; ignored', name, owner,
                                  used.uuid)
                        continue
                    used_here[0] += 1
                    used_here[1] += used.usedcores
                    used_here[2] += used.usedmem
                    mine[uuid] = mine.get(uuid, 0) + used.usedcores
            for uuid, count in mine.items():
                mask = _stored_mask(cu_masks, uuid) if cu_masks else None
                if mask:
                    stored.append((owner, uuid, mask))
                    count -= mask.bit_count()
                if count > 0:
                    waiting = pending.setdefault(uuid, ([], []))
                    waiting[0].append(owner)
                    waiting[1].append(count)
        units = {uuid: device.cu_unit for uuid, device in by_id.items()}
        frees: dict[str, int] = {}
        if stored:
            allocators: dict[str, allocator.CuAllocator] = {}
            for uuid in dict.fromkeys(uuid for _o, uuid, _m in stored):
                allocators[uuid] = allocator.CuAllocator(
                    uuid, by_id[uuid].devcore, unit=units[uuid],
                    strategy=self.strategy)
            for owner, uuid, mask in stored:
                try:
                    allocators[uuid].claim_mask(owner, mask)
                except exception.SharingError as err:
                    problem = problem or 'pod %s: stored CU ranges ' \
                        'unusable: %s' % (owner, err)
            for uuid, alloc in allocators.items():
                owners, asked = pending.pop(uuid, ((), ()))
                self._allocate(name, alloc,
                               zip(owners, asked, strict=True))
                frees[uuid] = allocator.whole_units(alloc.free_mask,
                                                    units[uuid])
        for uuid, (owners, asked) in pending.items():
            frees[uuid] = self._replay(name, uuid, by_id[uuid], units[uuid],
                                       owners, asked)
        gpus = []
        for uuid, device in by_id.items():
            free = frees.get(uuid)
            if free is None:
                # an untouched GPU: all its CUs (whole units, see
                # fit.usable_device)
                free = (1 << device.devcore) - 1
            gpus.append(self._state(device, units[uuid], counts[uuid], free))
        gpus.sort(key=_gpu_order)
        # what fit.build_view sums over the GPUs, in one pass
        states = []
        healthy = []
        frees_of = []
        signature = []
        usage = 0.0
        open_gpus = idle_gpus = 0
        # as max() and sum() give them: the first GPU's figures (which
        # may be negative: an over-used GPU), 0 when none; an int sum
        max_cores: int | None = None
        max_mem: int | None = None
        partial: float = 0
        for state, free_now, gpu_usage, entry in gpus:
            states.append(state)
            usage += gpu_usage
            if not state.info.health:
                continue
            healthy.append(state)
            frees_of.append(free_now)
            signature.append(entry)
            if max_cores is None or entry[0] > max_cores:
                max_cores = entry[0]
            if max_mem is None or entry[1] > max_mem:
                max_mem = entry[1]
            if entry[2] < entry[3]:
                open_gpus += 1
            if free_now.idle:
                idle_gpus += 1
            else:
                partial += free_now.cus
        usage = usage / (3 * len(gpus)) if gpus else 0.0
        return fitview.node_view(
            name=name, gpus=tuple(states), problem=problem, usage=usage,
            max_free_cores=max_cores or 0, max_free_mem=max_mem or 0,
            open_gpus=open_gpus, rank_binpack=(-usage, name),
            rank_spread=(usage, name), healthy=tuple(healthy),
            frees=tuple(frees_of), idle_gpus=idle_gpus,
            partial_free=partial, signature=tuple(signature))
