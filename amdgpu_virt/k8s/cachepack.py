"""The packed decision of the extender's cache: where a ``binpack`` pod
grows the expected fragmentation least.

With a :class:`~amdgpu_virt.sharing.packing.Mix` (the fragmentation
score), a ``binpack`` pod is only tried on nodes whose buckets can hold it
(:mod:`amdgpu_virt.k8s.cacheindex`), tightest first, and placed where the
expected fragmentation grows least among the first ``candidates`` nodes
that fit: a decision does not rescan the cluster. The cost of the best
placement of a one-container request is the same on every node of the same
signature, so it is memoised by (signature, request shape).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from amdgpu_virt.k8s import cacheindex
from amdgpu_virt.k8s import fit
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

_MISSING = object()


@functools.lru_cache(maxsize=4096)
def _cus(percent: int, devcore: int, unit: int) -> int:
    return hami.percent_to_cus(percent, devcore, unit)


def fast_key(score: packing.Score, view: fit.NodeView,
              want: fit.ContainerRequest) -> Any:
    """(fragmentation added, free left) of the best placement of a
    one-container request on ``view`` from its summary, or None when
    no GPU holds it (the same for every node of the same
    signature)."""
    if want.exclusive:
        left = view.idle_gpus - want.nums
        if left < 0:
            return None
        partial = view.partial_free
        cost = score.whole_fragment(left, partial) - \
            score.whole_fragment(view.idle_gpus, partial)
        return (round(cost, 9), float(left))
    best = None
    for gpu, free in zip(view.healthy, view.frees, strict=True):
        info = gpu.info
        if gpu.used_slots >= info.count:
            continue
        cus = _cus(want.percent, info.devcore, gpu.unit)
        mem = want.mem or info.devmem
        if gpu.usable_cores < cus or gpu.free_mem < mem or \
                mem > info.devmem:
            continue
        cost = packing.share_cost(
            score, free, cus / info.devcore, mem / info.devmem,
            gpu.used_slots + 1 < info.count, view.idle_gpus,
            view.partial_free, mem)
        key = (round(cost, 9), free.cus - cus / info.devcore)
        if best is None or key < best:
            best = key
    return best


def placement_key(score: packing.Score, view: fit.NodeView,
                  placement: fit.NodeFit) -> Any:
    index = {gpu.info.id: n for n, gpu in enumerate(view.healthy)}
    changes: dict[int, packing.GpuFree] = {}
    taken = 0.0
    for container in placement.containers:
        for used in container:
            n = index[used.uuid]
            gpu = view.healthy[n]
            info = gpu.info
            before = changes.get(n, view.frees[n])
            share = used.usedcores / info.devcore
            taken += share
            changes[n] = packing.after(
                before, share, used.usedmem / info.devmem,
                gpu.used_slots + 1 < info.count, used.usedmem)
    cost = packing.placement_cost(score, view.frees, changes)
    left = sum(f.cus for f in view.frees) - taken
    return (round(cost, 9), left, -view.usage, view.name)


def summary_reason(views: Mapping[str, fit.NodeView],
                   request: fit.PodRequest, name: str) -> str:
    """Why the node's summary rules ``request`` out (nodes the
    indexes skipped)."""
    view = views.get(name)
    if view is None:
        return cacheindex.UNKNOWN
    reason = fit.quick_reject(view, request)
    if reason:
        return reason
    for want in request.containers:
        if not want.nums:
            continue
        if want.exclusive:
            if view.idle_gpus < want.nums:
                return 'container %r (%s): in use (a whole GPU was ' \
                    'asked): %d of %d GPUs idle' % (
                        want.name, want.describe(), view.idle_gpus,
                        len(view.gpus))
            continue
        largest = max((g.usable_cores for g in view.healthy
                       if g.used_slots < g.info.count), default=0)
        return 'container %r (%s): too few free CUs or too little ' \
            'free memory (at most %d CUs on a GPU with a free slot, ' \
            '%d MiB on one GPU)' % (want.name, want.describe(),
                                    largest, view.max_free_mem)
    return 'does not fit'


def no_fit(views: Mapping[str, fit.NodeView], request: fit.PodRequest,
           known: set[str], failed: dict[str, str],
           unresolvable: dict[str, str]) -> fit.Decision:
    """No node takes ``request``: each node's reason, the skipped ones'
    from their summaries (worked out when asked)."""
    return fit.Decision(None, fit.Reasons(
        known, failed, functools.partial(summary_reason, views, request),
        unresolvable), unresolvable)


class Packer:
    """Packed decisions by the fragmentation score of ``mix``.

    :param candidates: nodes that fit to compare, at most, per decision.
    """

    def __init__(self, mix: packing.Mix, candidates: int,
                 strategy: allocator.CuStrategy) -> None:
        self.mix = mix
        self.candidates = max(1, candidates)
        self.strategy = strategy
        #: (node signature, request shape) -> its best placement's cost
        self._costs: dict[tuple[Any, Any], Any] = {}
        self._cost_score: packing.Score | None = None

    def decide(self, request: fit.PodRequest, known: set[str],
               unresolvable: dict[str, str], index: cacheindex.NodeIndex,
               views: Mapping[str, fit.NodeView]) -> fit.Decision:
        """The placement that grows expected fragmentation least, among
        the first nodes of the indexes that hold the request."""
        score = self.mix.score
        if score is not self._cost_score:
            self._costs.clear()
            self._cost_score = score
        gpu_score = score if not request.gpu_policy_set or \
            request.gpu_policy == 'binpack' else None
        wants = [w for w in request.containers if w.nums]
        fast = gpu_score is not None and not request.filtered and \
            len(wants) == 1 and (wants[0].exclusive or wants[0].nums == 1)
        shape = (wants[0].nums, wants[0].percent, wants[0].mem,
                 wants[0].exclusive) if fast else None
        failed = index.closed(known)
        found: list[tuple[Any, fit.NodeView, fit.NodeFit | None]] = []
        for name in index.candidate_names(request):
            if name not in known or name in unresolvable:
                continue
            view = views[name]
            if shape is not None:
                memo = (view.signature, shape)
                cost = self._costs.get(memo, _MISSING)
                if cost is _MISSING:
                    cost = fast_key(score, view, wants[0])
                    if len(self._costs) > 1 << 16:
                        self._costs.clear()
                    self._costs[memo] = cost
                key = None if cost is None else \
                    (*cost, -view.usage, view.name)
                if key is None:
                    failed[name] = fit.quick_reject(view, request) or \
                        'container %r (%s): no GPU holds it' % (
                            wants[0].name, wants[0].describe())
                    continue
                found.append((key, view, None))
            else:
                result = fit.quick_reject(view, request) or fit.fit_node(
                    view, request, self.strategy, gpu_score)
                if isinstance(result, str):
                    failed[name] = result
                    continue
                found.append((placement_key(score, view, result),
                              view, result))
            if len(found) >= self.candidates:
                break
        found.sort(key=lambda item: item[0])
        for _key, view, placement in found:
            result = placement or fit.fit_node(view, request, self.strategy,
                                               gpu_score)
            if isinstance(result, fit.NodeFit):
                return fit.chosen_decision(
                    result, known, failed, unresolvable, (),
                    'node %s was chosen (least fragmentation among the '
                    'nodes that fit)' % result.node)
            failed[view.name] = result
        return no_fit(views, request, known, failed, unresolvable)
