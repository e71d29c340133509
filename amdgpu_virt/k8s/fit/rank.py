"""How the extender's packed decision ranks the nodes that fit.

A request of one container is ranked on a node from the node's summary
alone (:func:`fast_key`): what the best placement there adds to the
node's expected fragmentation (:mod:`amdgpu_virt.sharing.packing`), and
what it leaves free. The key depends only on the node's
:attr:`~amdgpu_virt.k8s.fit.view.NodeView.signature` and the request's
shape, so the cache memoises it per (signature, shape): near full, most
nodes look alike and a decision computes few keys (:class:`KeyMemo`,
which also keeps the keys across refreshes of the request mix, renewing
a bounded number per decision). Any other request is
placed by :func:`~amdgpu_virt.k8s.fit.placement.fit_node` on each node, and the
placement ranked by :func:`placement_key`.

Pure: no Kubernetes.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Hashable
from typing import Any

from amdgpu_virt.k8s.fit.request import ContainerRequest
from amdgpu_virt.k8s.fit.request import PodRequest
from amdgpu_virt.k8s.fit.view import NodeView
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

#: (fragmentation added, free left, GPU capacity taken) of a placement:
#: lower is better on the first two
Key = tuple[float, float, float]


@functools.lru_cache(maxsize=4096)
def _cus(percent: int, devcore: int, unit: int) -> int:
    return hami.percent_to_cus(percent, devcore, unit)


def summary_ranked(request: PodRequest) -> ContainerRequest | None:
    """The one container of ``request`` that :func:`fast_key` ranks, or
    None when the request needs the full fit on every node (several
    containers, GPU filters, or GPUs kept on one NUMA node)."""
    wants = [w for w in request.containers if w.nums]
    if len(wants) != 1 or request.filtered:
        return None
    want = wants[0]
    if want.nums > 1 and not want.exclusive and request.gpu_policy == 'numa':
        return None
    return want


_MISSING = object()


def _share_part(share_fragment: Any, sig: tuple[int, ...],
                free: packing.GpuFree, percent: int,
                asked: int) -> tuple[float, float] | None:
    """(share of the GPU, change of its share fragmentation) when one
    share of ``percent`` and ``asked`` MiB (0: all) goes on the GPU of
    signature ``sig``, or None when it does not fit there."""
    usable, free_mem, used_slots, count, devcore, devmem, unit = sig[:7]
    if used_slots >= count:
        return None
    cus = _cus(percent, devcore, unit)
    mem = asked or devmem
    if usable < cus or free_mem < mem or mem > devmem:
        return None
    share = cus / devcore
    return share, share_fragment(
        max(0.0, free.cus - share), max(0.0, free.mem - mem / devmem),
        used_slots + 1 < count,
        max(0, free.mem_mib - mem) if free.mem_mib >= 0 else -1) - \
        share_fragment(free.cus, free.mem, free.slot, free.mem_mib)


def fast_key(score: packing.Score, view: NodeView,
             want: ContainerRequest,
             gpu_memo: dict[Hashable, Any] | None = None) -> Key | None:
    """(fragmentation added, free left, capacity taken) of the best
    placement of one container on ``view``, from its summary, or None when
    the node cannot hold it (the same for every node of the same
    signature).

    Whole GPUs take idle ones. Shares: each GPU that holds one is costed
    on its own (:func:`packing.share_cost`); ``want.nums`` shares take
    the cheapest GPUs (as :func:`~amdgpu_virt.k8s.fit.placement.fit_node` ranks
    them), and their joint cost is the node's change of fragmentation
    (:func:`packing.placement_cost`). Free left: of the chosen GPU for
    one share, of the whole node for more. Capacity taken: in GPUs (the
    host term of :mod:`amdgpu_virt.sharing.hostfit` needs it).

    :param gpu_memo: what each GPU state takes of the request, kept by
        the caller for one score (a node that changed has most of its
        GPUs as they were).
    """
    if want.exclusive:
        left = view.idle_gpus - want.nums
        if left < 0:
            return None
        partial = view.partial_free
        cost = score.whole_fragment(left, partial) - \
            score.whole_fragment(view.idle_gpus, partial)
        return (round(cost, 9), float(left), float(want.nums))
    # share_cost per GPU, unrolled with the node's terms computed once
    # (the same arithmetic, so the same keys): this loop is most of a
    # decision's time when a request shape meets nodes it has not seen
    share_fragment = score.share_fragment
    whole_fragment = score.whole_fragment
    wholes = bool(score.weights.wholes)
    idle, partial = view.idle_gpus, view.partial_free
    base = whole_fragment(idle, partial) if wholes else 0.0
    #: the whole-GPU term by (share, idle GPU): alike for alike GPUs
    whole_terms: dict[tuple[float, bool], float] = {}
    percent, asked = want.percent, want.mem
    memo = {} if gpu_memo is None else gpu_memo
    fitting: list[tuple[tuple[float, float], int, float, float, bool]] = []
    for index, (sig, free) in enumerate(zip(view.signature, view.frees,
                                            strict=True)):
        part = memo.get((sig, percent, asked), _MISSING)
        if part is _MISSING:
            part = _share_part(share_fragment, sig, free, percent, asked)
            memo[(sig, percent, asked)] = part
        if part is None:
            continue
        share, fragment = part
        cost = fragment
        if wholes:
            term = whole_terms.get((share, free.idle))
            if term is None:
                term = (whole_fragment(
                    idle - 1, partial + max(0.0, free.cus - share))
                    if free.idle
                    else whole_fragment(idle, partial - share)) - base
                whole_terms[(share, free.idle)] = term
            cost += term
        fitting.append(((round(cost, 9), free.cus - share), index, share,
                        fragment, free.idle))
    if len(fitting) < want.nums:
        return None
    if want.nums == 1:
        best = min(fitting)
        return (*best[0], best[2])
    # several shares: the cheapest GPUs, and the node's change as a whole
    # (what packing.placement_cost gives for them)
    fitting.sort()
    chosen = fitting[:want.nums]
    cost = sum(item[3] for item in chosen)
    if wholes:
        taken_idle = sum(1 for item in chosen if item[4])
        after = partial + sum(1.0 - item[2] if item[4] else -item[2]
                              for item in chosen)
        cost += whole_fragment(idle - taken_idle, max(0.0, after)) - base
    taken = sum(item[2] for item in chosen)
    remaining = sum(f.cus for f in view.frees) - taken
    return (round(cost, 9), remaining, taken)


def placement_key(score: packing.Score, view: NodeView,
                  containers: hami.PodDevices) -> tuple[Any, ...]:
    """(fragmentation added, free left, busiest first, name) of placing
    ``containers`` (from :func:`~amdgpu_virt.k8s.fit.placement.fit_node`) on
    ``view``."""
    cost, left, _taken = placement_delta(score, view, containers)
    return (cost, left, -view.usage, view.name)


def placement_delta(score: packing.Score, view: NodeView,
                    containers: hami.PodDevices) -> Key:
    """:data:`Key` (fragmentation added, free left, capacity taken) of
    placing ``containers`` on ``view``."""
    index = {gpu.info.id: n for n, gpu in enumerate(view.healthy)}
    changes: dict[int, packing.GpuFree] = {}
    taken = 0.0
    for container in containers:
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
    return (round(cost, 9), left, taken)


class KeyMemo:
    """:func:`fast_key` per (node signature, request shape), kept across
    refreshes of the request mix.

    A new mix changes every cost a little, not which nodes can hold a
    request. Recomputing every key at once would make the first decision
    after each refresh (every ``packing`` refresh of requests, for every
    request shape) walk its candidates cold: the slow tail of decisions.
    So a key computed under an earlier score stays in use, and each
    decision renews at most ``renew`` of them (the ones it meets first);
    "cannot hold it" never goes stale. At most ``size`` keys are kept, the
    least recently computed dropped first. What each GPU state takes of a
    request is kept too, for the current score: a node that changed has
    most of its GPUs as they were.

    :param size: keys kept.
    :param renew: stale keys recomputed per decision, at most.
    """

    def __init__(self, size: int = 1 << 17, renew: int = 16) -> None:
        self.size = max(1, size)
        self.renew = max(0, renew)
        self._keys: collections.OrderedDict[
            tuple[Hashable, Hashable], tuple[int, Key | None]] = \
            collections.OrderedDict()
        self._score: packing.Score | None = None
        #: fast_key's GPU memo, for the current score
        self._gpus: dict[Hashable, Any] = {}
        #: node signature -> its GPU fragmentation, for the current score
        self._fragments: dict[Hashable, float] = {}
        self._generation = 0
        self._budget = 0
        #: keys computed, and stale keys used as they were (for tests)
        self.computed = 0
        self.stale_used = 0

    def __len__(self) -> int:
        return len(self._keys)

    def begin(self, score: packing.Score) -> None:
        """Start a decision under ``score``."""
        if score is not self._score:
            self._score = score
            self._generation += 1
            self._gpus = {}
            self._fragments = {}
        else:
            if len(self._gpus) > self.size:
                self._gpus.clear()
            if len(self._fragments) > self.size:
                self._fragments.clear()
        self._budget = self.renew

    def fragment(self, view: NodeView) -> float:
        """The GPU fragmentation of ``view`` (in GPUs) under the score
        given to :meth:`begin`, memoised by signature."""
        assert self._score is not None, 'begin() first'
        value = self._fragments.get(view.signature)
        if value is None:
            value = self._score.node_fragment(view.frees)
            self._fragments[view.signature] = value
        return value

    def key(self, view: NodeView, want: ContainerRequest,
            shape: Hashable) -> Key | None:
        """:func:`fast_key` of ``want`` (of shape ``shape``) on ``view``
        under the score given to :meth:`begin`, or a key computed under an
        earlier one once this decision's renewals are spent."""
        assert self._score is not None, 'begin() first'
        memo = (view.signature, shape)
        found = self._keys.get(memo)
        if found is not None:
            generation, key = found
            if generation == self._generation or key is None:
                return key
            if self._budget <= 0:
                self.stale_used += 1
                return key
            self._budget -= 1
        key = fast_key(self._score, view, want, self._gpus)
        self.computed += 1
        self._keys[memo] = (self._generation, key)
        self._keys.move_to_end(memo)
        while len(self._keys) > self.size:
            self._keys.popitem(last=False)
        return key
