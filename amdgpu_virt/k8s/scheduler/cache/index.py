"""The extender cache's node indexes, kept as views change.

Each node's view carries a summary (free CUs, free memory and free slots
per GPU, idle GPUs); :class:`NodeIndex` files the node in two bucketed
indexes by it: by the most free CUs one GPU with a free slot has (in
1/:data:`BUCKETS` of a GPU) and by its idle GPUs, each ordered within by
the node's free CUs (tightest first), then by node name: the order in which
a request meets the nodes depends only on what they hold, never on the
order in which the cache saw them or on the hash seed of the process. It
also groups nodes by registration shape (for the "never fits" answers) and
keeps the nodes that take nothing now. A request then only tries the nodes
whose buckets can hold it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from amdgpu_virt.k8s import fit
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami

#: buckets of the free-CU index (one per 1/BUCKETS of a GPU)
BUCKETS = 32
#: why an unknown node takes nothing
UNKNOWN = ('node unknown to the extender (no such node, or the cache is '
           'not up to date yet)')


def share_bucket(view: fit.NodeView) -> int:
    """The free-CU bucket of ``view`` (-1: no GPU takes a share)."""
    if view.problem:
        return -1
    best = max((f.cus for f in view.frees if f.slot and f.mem > 0),
               default=0.0)
    return int(best * BUCKETS) if best > 0 else -1


def idle_bucket(view: fit.NodeView) -> int:
    """The idle-GPU bucket of ``view`` (0: none idle, or a problem)."""
    return 0 if view.problem else view.idle_gpus


def free_bucket(view: fit.NodeView) -> int:
    """Free CUs of the whole node in quarters of a GPU (the order within
    the other buckets: the tightest nodes first)."""
    return int(4 * (view.partial_free + view.idle_gpus))


def buckets_of(view: fit.NodeView) -> tuple[int, int, int]:
    """(share bucket, idle bucket, free bucket) of ``view``."""
    return share_bucket(view), idle_bucket(view), free_bucket(view)


#: bucket -> free bucket -> node names, sorted
_Index = dict[int, dict[int, list[str]]]


class NodeIndex:
    """Buckets, registration shapes and problems of the indexed views
    (not locked: the cache holds its lock around every call)."""

    def __init__(self) -> None:
        #: name -> (share bucket, idle bucket, free bucket)
        self.bucket_of: dict[str, tuple[int, int, int]] = {}
        #: share bucket or idle GPUs -> free bucket -> node names
        self.shares: _Index = {}
        self.idle: _Index = {}
        #: most memory of one GPU (request memory as a fraction), fewest
        #: CUs of one GPU
        self.reference_mem = 0
        self.min_devcore = allocator.MAX_CUS
        #: nodes by registration shape (GPU memory sizes)
        self.shapes: dict[tuple[int, ...], dict[str, None]] = {}
        self._shape_of: dict[str, tuple[int, ...]] = {}
        #: nodes that take nothing now, and why
        self.problems: dict[str, str] = {}
        #: nodes that register no AMD GPU (and have no problem)
        self.without_gpus: set[str] = set()

    def clear(self) -> None:
        """Forget every node (the largest GPU seen is kept)."""
        self.without_gpus.clear()
        self.bucket_of.clear()
        self.shares.clear()
        self.idle.clear()
        self.shapes.clear()
        self._shape_of.clear()
        self.problems.clear()

    def add(self, view: fit.NodeView) -> None:
        for gpu in view.gpus:
            if gpu.info.devmem > self.reference_mem:
                self.reference_mem = gpu.info.devmem
            if gpu.info.devcore < self.min_devcore:
                self.min_devcore = gpu.info.devcore
        if view.problem:
            self.problems[view.name] = view.problem
        elif view.gpus:
            shape = tuple(sorted(g.info.devmem for g in view.gpus))
            self._shape_of[view.name] = shape
            self.shapes.setdefault(shape, {})[view.name] = None
        if view.gpus or view.problem:
            self.without_gpus.discard(view.name)
        else:
            self.without_gpus.add(view.name)
        buckets = buckets_of(view)
        self.bucket_of[view.name] = buckets
        # names in order: a list filled in name order (a whole cluster
        # listed) only appends
        if buckets[0] >= 0:
            bisect.insort(self.shares.setdefault(buckets[0], {}).setdefault(
                buckets[2], []), view.name)
        if buckets[1]:
            bisect.insort(self.idle.setdefault(buckets[1], {}).setdefault(
                buckets[2], []), view.name)

    def remove(self, name: str, gone: bool = False) -> None:
        """Take ``name`` out (``gone``: the node no longer exists)."""
        if gone:
            self.without_gpus.discard(name)
        self.problems.pop(name, None)
        shape = self._shape_of.pop(name, None)
        if shape is not None:
            group = self.shapes[shape]
            group.pop(name, None)
            if not group:
                del self.shapes[shape]
        buckets = self.bucket_of.pop(name, None)
        if buckets is None:
            return
        for index, key in ((self.shares, buckets[0]),
                           (self.idle, buckets[1])):
            row = index.get(key)
            if row is None:
                continue
            names = row[buckets[2]]
            del names[bisect.bisect_left(names, name)]
            if not names:
                del row[buckets[2]]
                if not row:
                    del index[key]

    def snapshot(self) -> dict[str, tuple[int, int, int]]:
        """name -> (share bucket, idle bucket, free bucket) of every node
        in the indexes, read back from them."""
        shares: dict[str, tuple[int, int]] = {}
        idle: dict[str, tuple[int, int]] = {}
        for index, found in ((self.shares, shares), (self.idle, idle)):
            for key, row in index.items():
                for free, names in row.items():
                    for name in names:
                        found[name] = (key, free)
        result = {}
        for name in shares.keys() | idle.keys():
            free = (shares.get(name) or idle[name])[1]
            result[name] = (shares.get(name, (-1, 0))[0],
                            idle.get(name, (0, 0))[0], free)
        return result

    # -- what may hold a request ----------------------------------------

    def thresholds(self, request: fit.PodRequest) -> tuple[int, int]:
        """(idle GPUs, share bucket) a node needs to hold ``request``:
        whole GPUs by idle GPUs, else shares by the free-CU bucket."""
        idle = sum(w.nums for w in request.containers
                   if w.nums and w.exclusive)
        if idle:
            return idle, 0
        need = min((w.percent for w in request.containers if w.nums),
                   default=100)
        # percent_to_cus floors: a GPU may take 1 CU less than the percent
        return 0, max(0, int((need / 100 - 1 / max(1, self.min_devcore))
                             * BUCKETS))

    def candidate_count(self, request: fit.PodRequest) -> int:
        idle, first = self.thresholds(request)
        if idle:
            index, low = self.idle, idle
        else:
            index, low = self.shares, first
        return sum(len(names) for key, row in index.items() if key >= low
                   for names in row.values())

    def eligible(self, request: fit.PodRequest) -> Callable[[str], bool]:
        idle, first = self.thresholds(request)
        buckets = self.bucket_of
        if idle:
            return lambda name: name in buckets and buckets[name][1] >= idle
        return lambda name: name in buckets and buckets[name][0] >= first

    def candidate_names(self, request: fit.PodRequest) -> Iterable[str]:
        """Nodes whose buckets may hold ``request``, tightest first."""
        idle, first = self.thresholds(request)
        if idle:
            for count in sorted(self.idle):
                if count >= idle:
                    row = self.idle[count]
                    for free in sorted(row):
                        yield from row[free]
            return
        for bucket in range(first, BUCKETS + 1):
            shares = self.shares.get(bucket)
            if shares:
                for free in sorted(shares):
                    yield from shares[free]

    def unresolvable(self, request: fit.PodRequest, known: set[str],
                     unknown: set[str], views: dict[str, fit.NodeView]
                     ) -> dict[str, str]:
        """Known nodes that can never take ``request`` as registered, by
        registration shape, and the unknown ones."""
        result = dict.fromkeys(unknown, UNKNOWN)
        none = 'no AMD GPU registered in %s' % hami.NODE_REGISTER
        for name in self.without_gpus:
            if name in known:
                result[name] = none
        for group in self.shapes.values():
            first = next(iter(group))
            reason = fit.never_fits(views[first], request)
            if reason is None:
                continue
            for name in group:
                if name in known:
                    # the reason names the node's own sizes: all alike
                    result[name] = reason
        return result

    def closed(self, known: set[str]) -> dict[str, str]:
        """The known nodes that take nothing now, with why."""
        return {name: problem for name, problem in self.problems.items()
                if name in known}
