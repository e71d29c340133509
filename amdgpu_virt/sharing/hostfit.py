"""The host beside the GPUs: GPU capacity a node can no longer feed.

A GPU request also asks its node's host for CPU and memory. GPU capacity
whose host cannot feed it is lost like CUs too few for a share, in two
ways, both counted:

* the next request: where a node has too little CPU or memory left for a
  request, every GPU capacity it still has free is lost to that request
  (Weng et al., "Beware of Fragmentation", USENIX ATC '23, count a task
  type the node's CPU cannot hold as seeing the whole node's free GPU as
  fragment). :class:`Demands` is what the recent requests asked of their
  hosts; :meth:`Demands.blocked` the share of them that free CPU and
  memory cannot hold;
* the requests to come: recent requests asked, on average, so much CPU
  and memory per GPU of capacity (:attr:`Demands.per_gpu`); a node whose
  free CPU or memory is less than its free GPU capacity needs at that
  rate can feed only part of it, and the rest is lost whatever comes
  (:func:`unfed`).

With :mod:`amdgpu_virt.sharing.packing`'s GPU fragmentation ``F`` of a
node (free GPU capacity the mix cannot use, in GPUs), its free GPU
capacity ``T`` and what its host cannot feed ``U``, the node's
fragmentation is

    ``F + b * (T - F) + U``

where ``b`` is :meth:`Demands.blocked` of the node's free CPU and memory:
the capacity the mix could use is lost in the proportion of requests the
host cannot feed (the two taken as independent). :func:`placement_cost`
is its change when a request lands: the GPU fragmentation it adds,
damped where the host is short anyway, plus the usable capacity its host
request strands, less the stranded capacity it puts to use, plus the
change of ``U`` (a request lighter on the host than the mix's rate, put
on a node short of host, lowers it). A request that asks no GPU
(``taken`` 0, no GPU change) strands GPU capacity through its host
request alone.

Pure: amounts are integers (CPU in millicores, memory in bytes).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from collections.abc import Mapping

#: demands are rounded up to these steps (so that a mix has few of them)
CPU_STEP = 100
MEMORY_STEP = 64 << 20


def rounded(cpu: int, memory: int) -> tuple[int, int]:
    """``(cpu, memory)`` rounded up to :data:`CPU_STEP` and
    :data:`MEMORY_STEP`."""
    return (-(-max(0, cpu) // CPU_STEP) * CPU_STEP,
            -(-max(0, memory) // MEMORY_STEP) * MEMORY_STEP)


class Demands:
    """What recent GPU requests asked of their hosts.

    :param items: ``(cpu, memory, weight)``, the weights summing to at
        most 1 (the rest asked nothing of the host, or is the prior, which
        says nothing of hosts).
    """

    def __init__(self, items: Iterable[tuple[int, int, float]] = (),
                 per_gpu: tuple[float, float] = (0.0, 0.0)) -> None:
        self.items = tuple(sorted(items))
        #: CPU millicores and memory bytes asked per GPU of capacity (0:
        #: nothing known)
        self.per_gpu = per_gpu
        self._cpus = sorted({c for c, _m, _w in self.items})
        self._memories = sorted({m for _c, m, _w in self.items})
        self._memo: dict[tuple[int, int], float] = {}

    @classmethod
    def of(cls, counts: Mapping[tuple[int, int], float], total: float,
           per_gpu: tuple[float, float] = (0.0, 0.0)) -> Demands:
        """From ``(cpu, memory) -> weight`` among ``total`` requests."""
        if total <= 0:
            return cls((), per_gpu)
        return cls(((cpu, memory, weight / total)
                    for (cpu, memory), weight in counts.items()
                    if weight > 0 and (cpu or memory)), per_gpu)

    def __bool__(self) -> bool:
        return bool(self.items) or any(self.per_gpu)

    def blocked(self, cpu: int, memory: int) -> float:
        """The weight of the requests that ``cpu`` millicores and
        ``memory`` bytes free cannot hold (0..1)."""
        if not self.items:
            return 0.0
        # the answer depends only on how many demand values each amount
        # reaches: memoised by that (at most one entry per pair)
        key = (bisect.bisect_right(self._cpus, cpu),
               bisect.bisect_right(self._memories, memory))
        value = self._memo.get(key)
        if value is None:
            value = sum(w for c, m, w in self.items
                        if c > cpu or m > memory)
            self._memo[key] = value
        return value


class Window:
    """The host demands of the last ``window`` requests.

    :param window: requests counted.
    """

    def __init__(self, window: int = 500) -> None:
        self.window = max(1, window)
        self._recent: list[tuple[int, int, float]] = []
        self._start = 0
        self._counts: dict[tuple[int, int], int] = {}
        #: CPU, memory and GPU capacity summed over the window's requests
        #: that ask GPUs
        self._sums = [0, 0, 0.0]

    def __len__(self) -> int:
        return len(self._recent) - self._start

    def record(self, cpu: int, memory: int, gpus: float = 0.0) -> None:
        """One request: its host demand, and the GPU capacity (in GPUs)
        it asks."""
        demand = rounded(cpu, memory)
        self._recent.append((*demand, gpus))
        self._counts[demand] = self._counts.get(demand, 0) + 1
        self._add(demand, gpus, 1)
        if len(self) > self.window:
            cpu, memory, gpus = self._recent[self._start]
            old = (cpu, memory)
            self._start += 1
            self._add(old, gpus, -1)
            left = self._counts[old] - 1
            if left:
                self._counts[old] = left
            else:
                del self._counts[old]
            if self._start > self.window:
                del self._recent[:self._start]
                self._start = 0

    def _add(self, demand: tuple[int, int], gpus: float, sign: int) -> None:
        if gpus > 0:
            self._sums[0] += sign * demand[0]
            self._sums[1] += sign * demand[1]
            self._sums[2] += sign * gpus

    def demands(self, extra: float = 0.0) -> Demands:
        """The demands, with ``extra`` more requests that ask nothing of
        the host (a prior's weight)."""
        cpu, memory, gpus = self._sums
        per_gpu = (cpu / gpus, memory / gpus) if gpus > 1e-9 else (0.0, 0.0)
        return Demands.of({k: float(n) for k, n in self._counts.items()},
                          len(self) + max(0.0, extra), per_gpu)


def unfed(free_gpus: float, cpu: int, memory: int,
          per_gpu: tuple[float, float]) -> float:
    """GPU capacity (in GPUs) of the ``free_gpus`` of a node that its
    host's free ``cpu`` and ``memory`` cannot feed at the rate of
    ``per_gpu`` (see :attr:`Demands.per_gpu`; a rate of 0 says
    nothing)."""
    lost = 0.0
    for free, rate in ((cpu, per_gpu[0]), (memory, per_gpu[1])):
        if rate > 0:
            lost = max(lost, free_gpus - max(0, free) / rate)
    return lost


def placement_cost(gpu_delta: float, taken: float, usable: float,
                   blocked_before: float, blocked_after: float,
                   unfed_before: float = 0.0,
                   unfed_after: float = 0.0) -> float:
    """How much a node's fragmentation, host included, grows (in GPUs;
    may be negative) when a request lands.

    :param gpu_delta: growth of its GPU fragmentation (``F``).
    :param taken: GPU capacity the request takes (in GPUs).
    :param usable: the node's free GPU capacity the mix could use before
        (``T - F``).
    :param blocked_before: :meth:`Demands.blocked` of the host before.
    :param blocked_after: the same once the request's host share is
        taken.
    :param unfed_before: :func:`unfed` before.
    :param unfed_after: :func:`unfed` after.
    """
    return gpu_delta * (1.0 - blocked_after) + \
        (blocked_after - blocked_before) * usable - \
        blocked_after * taken + unfed_after - unfed_before


def usable_capacity(frees: Iterable[float], fragment: float) -> float:
    """``T - F``: a node's free GPU capacity (``frees``, in GPUs) less
    its GPU fragmentation, never negative."""
    return max(0.0, sum(frees) - fragment)
