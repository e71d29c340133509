"""The packed decision of the extender's cache: where a ``binpack`` pod
grows the expected fragmentation least.

With a :class:`~amdgpu_virt.sharing.packing.Mix` (the fragmentation score), a
``binpack`` pod is only tried on nodes whose buckets can hold it
(:mod:`amdgpu_virt.k8s.scheduler.cache.index`), tightest first, and placed
where the expected fragmentation grows least among the first ``candidates``
nodes that fit: a decision does not rescan the cluster. The cost of the best
placement of a one-container request is the same on every node of the same
signature, so it is memoised by (signature, request shape), across refreshes of
the mix (:mod:`amdgpu_virt.k8s.fit.rank`, which ranks).

The host beside the GPUs enters per node (it is not part of the signature):
a node whose host cannot hold the pod's CPU and memory request is not
tried, and the cost of a placement counts the GPU capacity its host
request leaves unfed (:mod:`amdgpu_virt.sharing.hostfit`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.fit import host as fithost
from amdgpu_virt.k8s.fit import rank as fitrank
from amdgpu_virt.k8s.scheduler.cache import index as cacheindex
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hostfit
from amdgpu_virt.sharing import packing

#: a node's free host (None: unknown), by node name
HostFree = Callable[[str], fithost.HostAmount | None]


def host_problem(free: fithost.HostAmount | None,
                 asked: fithost.HostAmount | None) -> str | None:
    """Why a host with ``free`` left cannot take a pod asking ``asked``
    (None: it can, or one of them is unknown)."""
    if free is None or asked is None or free.holds(asked):
        return None
    return 'too little CPU or memory left on the host (%s free, %s ' \
        'asked)' % (free.describe(), asked.describe())

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
        self._costs = fitrank.KeyMemo()

    def _host_cost(self, score: packing.Score, view: fit.NodeView,
                   delta: float, taken: float,
                   free: fithost.HostAmount | None,
                   asked: fithost.HostAmount | None) -> float:
        """``delta`` (GPU fragmentation added) with the host's part: the
        GPU capacity the node can no longer feed once ``asked`` of its
        ``free`` host is taken, less what the placement puts to use (see
        :mod:`amdgpu_virt.sharing.hostfit`)."""
        demands = score.hosts
        if free is None or not demands:
            return delta
        before = demands.blocked(free.cpu, free.memory)
        left = free - (asked or fithost.NOTHING)
        after = demands.blocked(left.cpu, left.memory)
        total = sum(f.cus for f in view.frees)
        unfed_before = hostfit.unfed(total, free.cpu, free.memory,
                                     demands.per_gpu)
        unfed_after = hostfit.unfed(total - taken, left.cpu, left.memory,
                                    demands.per_gpu)
        if not before and not after and unfed_before == unfed_after:
            return delta
        usable = hostfit.usable_capacity(
            (f.cus for f in view.frees), self._costs.fragment(view)) \
            if before or after else 0.0
        return round(hostfit.placement_cost(
            delta, taken, usable, before, after, unfed_before,
            unfed_after), 9)

    def strands(self, view: fit.NodeView, free: fithost.HostAmount | None,
                asked: fithost.HostAmount | None) -> float:
        """GPU capacity (in GPUs) a pod asking no GPU and ``asked`` of the
        host leaves ``view``'s node unable to feed (0: none, or the host
        unknown)."""
        score = self.mix.score
        self._costs.begin(score)
        return max(0.0, self._host_cost(score, view, 0.0, 0.0, free, asked))

    def decide(self, request: fit.PodRequest, known: set[str],
               unresolvable: dict[str, str], index: cacheindex.NodeIndex,
               views: Mapping[str, fit.NodeView],
               host_free: HostFree | None = None) -> fit.Decision:
        """The placement that grows expected fragmentation least, among
        the first nodes of the indexes that hold the request.

        :param host_free: what each node's host has left (None: hosts
            unknown).
        """
        score = self.mix.score
        self._costs.begin(score)
        asked = request.host
        gpu_score = score if not request.gpu_policy_set or \
            request.gpu_policy == 'binpack' else None
        want = fitrank.summary_ranked(request) if gpu_score is not None \
            else None
        shape = None if want is None else \
            (want.nums, want.percent, want.mem, want.exclusive)
        failed = index.closed(known)
        found: list[tuple[Any, fit.NodeView, fit.NodeFit | None]] = []
        for name in index.candidate_names(request):
            if name not in known or name in unresolvable:
                continue
            view = views[name]
            free = None if host_free is None else host_free(name)
            problem = host_problem(free, asked)
            if problem is not None:
                failed[name] = problem
                continue
            if want is not None:
                cost = self._costs.key(view, want, shape)
                if cost is None:
                    failed[name] = fit.quick_reject(view, request) or \
                        'container %r (%s): no GPU holds it' % (
                            want.name, want.describe())
                    continue
                found.append(((self._host_cost(score, view, cost[0],
                                               cost[2], free, asked),
                               cost[1], -view.usage, view.name),
                              view, None))
            else:
                result = fit.quick_reject(view, request) or fit.fit_node(
                    view, request, self.strategy, gpu_score)
                if isinstance(result, str):
                    failed[name] = result
                    continue
                delta, left, taken = fitrank.placement_delta(
                    score, view, result.containers)
                found.append(((self._host_cost(score, view, delta, taken,
                                               free, asked),
                               left, -view.usage, view.name), view, result))
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
