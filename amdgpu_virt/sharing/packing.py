"""Fragmentation-aware packing: a score for placing a request on a GPU.

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent" (USENIX ATC '23): the free
capacity of a node is *fragmented* for a kind of request when that
request cannot use it, and a good placement is the one that least
increases the node's fragmentation expected over what the cluster is
being asked for.

Here a GPU's free capacity is its free CUs as a fraction of its CUs (so
every amount is in "GPUs"). For a request :class:`Shape`:

* a share of one GPU (a fraction of its CUs and of its memory): the free
  CUs of a GPU are fragment when that GPU cannot take the share (no free
  slot, too few free CUs, or too little free memory: HAMi's three limits);
  when a consumer must get one range of CUs (:attr:`GpuFree.runs` given),
  the free CUs of every range too short for the share are fragment too;
* ``k`` whole GPUs: the free CUs of partly used GPUs are fragment; when
  the node has fewer than ``k`` idle GPUs, all its free CUs are.

The node's fragmentation is the sum over the :class:`Mix` of request
shapes, each weighted by its share of recent requests (with a prior for a
cluster that has asked nothing yet); :func:`placement_cost` is its change
when a request lands. Lower is better; ties go to the tightest fit. The
host beside the GPUs (CPU and memory the recent requests asked, see
:mod:`amdgpu_virt.sharing.hostfit`) adds the GPU capacity a node can no
longer feed: :attr:`Score.hosts`.

Pure: no Kubernetes, no OpenStack; the extender's fit and the fleet
planner both call it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from collections.abc import Sequence

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hostfit

#: the prior mix: shares of a GPU and whole-GPU counts, with weights
DEFAULT_PRIOR = ('0.05:2', '0.1:2', '0.25:2', '0.5:2', '1:2', '2:1', '4:1',
                 '8:1')
_EPS = 1e-9


@dataclasses.dataclass(frozen=True, order=True)
class Shape:
    """One kind of request, per GPU.

    :ivar gpus: GPUs asked (whole ones when ``whole``; else each share is
        on its own GPU).
    :ivar cus: fraction of each GPU's CUs, 0 < cus <= 1.
    :ivar mem: fraction of each GPU's memory, 0 <= mem <= 1 (used when
        ``mem_mib`` is 0).
    :ivar whole: the GPUs are taken whole (nothing else on them).
    :ivar mem_mib: MiB of each GPU's memory (0: ``mem`` says).
    """

    gpus: int
    cus: float
    mem: float
    whole: bool = False
    mem_mib: int = 0

    @classmethod
    def whole_gpus(cls, gpus: int) -> Shape:
        return cls(gpus, 1.0, 1.0, True)

    @classmethod
    def share(cls, cus: float, mem: float, gpus: int = 1,
              mem_mib: int = 0) -> Shape:
        """A share, rounded to 1/1000 of a GPU (and memory in MiB to
        1/64 GiB) so that a mix has few shapes."""
        return cls(gpus, min(1.0, max(0.001, round(cus, 3))),
                   min(1.0, max(0.0, round(mem, 3))), False,
                   max(0, mem_mib) // 16 * 16)


def parse_prior(items: Iterable[str]) -> tuple[tuple[Shape, float], ...]:
    """``SIZE:WEIGHT`` items: a SIZE below 1 is a share of one GPU (CUs
    and memory in proportion), a whole number is that many whole GPUs.

    :raises ConfigError: an item that is not of this form.
    """
    result = []
    for item in items:
        size, _sep, weight = str(item).partition(':')
        try:
            number = float(size)
            share = float(weight or '1')
        except ValueError:
            number = share = -1.0
        if number <= 0 or share <= 0 or number > 64 or \
                number >= 1 and not number.is_integer():
            raise exception.ConfigError(
                option='[scheduler] packing_prior',
                reason='%r is not SIZE:WEIGHT (SIZE a share below 1 or a '
                'whole number of GPUs up to 64, WEIGHT positive)' % item)
        shape = Shape.share(number, number) if number < 1 else \
            Shape.whole_gpus(int(number))
        result.append((shape, share))
    return tuple(result)


@dataclasses.dataclass(frozen=True)
class Weights:
    """A mix made ready for scoring: shapes and weights summing to 1."""

    #: (CU fraction, memory fraction, MiB or 0, weight) of the shares
    shares: tuple[tuple[float, float, int, float], ...]
    #: (GPUs, weight) of the whole-GPU shapes
    wholes: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, shapes: Iterable[tuple[Shape, float]]) -> Weights:
        merged: dict[Shape, float] = collections.defaultdict(float)
        for shape, weight in shapes:
            if weight > 0:
                merged[shape] += weight
        total = sum(merged.values())
        if not total:
            return cls((), ())
        shares: dict[tuple[float, float, int], float] = \
            collections.defaultdict(float)
        wholes: dict[int, float] = collections.defaultdict(float)
        for shape, weight in merged.items():
            if shape.whole:
                wholes[shape.gpus] += weight / total
            else:
                # k shares on k GPUs: each GPU must hold one share
                shares[(shape.cus, shape.mem, shape.mem_mib)] += \
                    weight / total
        return cls(tuple(sorted((c, m, b, w)
                                for (c, m, b), w in shares.items())),
                   tuple(sorted(wholes.items())))


@dataclasses.dataclass(frozen=True)
class GpuFree:
    """What is free on one GPU, as fractions of the GPU.

    :ivar cus: free CUs (those a new request may get) / CUs.
    :ivar mem: free memory / memory.
    :ivar slot: a new consumer may be added (HAMi's ``count``).
    :ivar idle: nothing uses the GPU.
    :ivar mem_mib: free memory in MiB (-1: unknown; shapes asking MiB
        are then compared by fraction of the GPU's memory).
    :ivar runs: when a consumer must get one range of CUs: the lengths
        of the free ranges, as fractions of the GPU, ascending (see
        :func:`runs_of`); empty: a consumer may get any set of CUs.
    """

    cus: float
    mem: float
    slot: bool
    idle: bool
    mem_mib: int = -1
    runs: tuple[float, ...] = ()


def runs_of(free: int, total: int) -> tuple[float, ...]:
    """The free ranges of CU mask ``free`` on a GPU of ``total`` CUs, as
    fractions of the GPU, ascending (for :attr:`GpuFree.runs`)."""
    return tuple(sorted(round(length / total, 4)
                        for _start, length in allocator.runs(free)))


class Score:
    """Scores placements against a mix; memoises per GPU state.

    :param weights: the mix (see :class:`Mix`).
    :param hosts: what the mix's requests asked of their hosts (none: the
        host is left out).
    """

    def __init__(self, weights: Weights,
                 hosts: hostfit.Demands | None = None) -> None:
        self.weights = weights
        self.hosts = hosts or hostfit.Demands()
        self._memo: dict[tuple[float, float, bool, int], float] = {}
        self._ranged: dict[tuple[tuple[float, ...], float, bool, int],
                           float] = {}
        self._whole: dict[tuple[int, float], float] = {}

    def share_fragment(self, cus: float, mem: float, slot: bool,
                       mem_mib: int = -1,
                       runs: tuple[float, ...] = ()) -> float:
        """Free CUs of one GPU (in GPUs) that the mix's shares cannot use,
        weighted by the shares' weights.

        :param mem_mib: free MiB (-1: unknown, see :class:`GpuFree`).
        :param runs: the free ranges when a share must get one range (see
            :attr:`GpuFree.runs`): the CUs of a range too short for a
            share are fragment for it.
        """
        if runs:
            return self._ranged_fragment(runs, mem, slot, mem_mib)
        key = (cus, mem, slot, mem_mib)
        value = self._memo.get(key)
        if value is None:
            if cus <= _EPS:
                value = 0.0
            else:
                unusable = sum(
                    w for c, m, b, w in self.weights.shares
                    if not slot or c > cus + _EPS or (
                        b > mem_mib if b and mem_mib >= 0
                        else m > mem + _EPS))
                value = cus * unusable
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            self._memo[key] = value
        return value

    def _ranged_fragment(self, runs: tuple[float, ...], mem: float,
                         slot: bool, mem_mib: int) -> float:
        key = (runs, mem, slot, mem_mib)
        value = self._ranged.get(key)
        if value is None:
            total = sum(runs)
            value = 0.0
            for c, m, b, w in self.weights.shares:
                if not slot or (b > mem_mib if b and mem_mib >= 0
                                else m > mem + _EPS):
                    value += w * total
                else:
                    value += w * sum(r for r in runs if r < c - _EPS)
            if len(self._ranged) > 1 << 16:
                self._ranged.clear()
            self._ranged[key] = value
        return value

    def whole_fragment(self, idle: int, partial: float) -> float:
        """Free CUs (in GPUs) of a node with ``idle`` idle GPUs and
        ``partial`` free CUs on its other GPUs that the mix's whole-GPU
        requests cannot use."""
        key = (idle, round(partial, 4))
        value = self._whole.get(key)
        if value is None:
            total = key[1] + idle
            value = sum(w * (key[1] if idle >= k else total)
                        for k, w in self.weights.wholes)
            if len(self._whole) > 1 << 16:
                self._whole.clear()
            self._whole[key] = value
        return value

    def node_fragment(self, gpus: Sequence[GpuFree]) -> float:
        """The node's expected fragmentation, in GPUs."""
        idle = sum(1 for g in gpus if g.idle)
        partial = sum(g.cus for g in gpus if not g.idle)
        return sum(self.share_fragment(g.cus, g.mem, g.slot, g.mem_mib,
                                       g.runs)
                   for g in gpus) + self.whole_fragment(idle, partial)


def after(gpu: GpuFree, cus: float, mem: float, slot: bool,
          mem_mib: int = 0, runs: tuple[float, ...] = ()) -> GpuFree:
    """``gpu`` once a consumer of ``cus`` and ``mem`` (fractions; and
    ``mem_mib`` MiB) is on it; ``slot``: it still has a free slot then.

    :param runs: the free ranges left (when ``gpu`` has :attr:`runs`: the
        CU strategy decides which range the consumer gets).
    """
    return GpuFree(max(0.0, gpu.cus - cus), max(0.0, gpu.mem - mem), slot,
                   False, max(0, gpu.mem_mib - mem_mib)
                   if gpu.mem_mib >= 0 else -1, runs if gpu.runs else ())


def placement_cost(score: Score, gpus: Sequence[GpuFree],
                   changes: dict[int, GpuFree]) -> float:
    """How much the node's expected fragmentation grows (in GPUs; may be
    negative) when GPU ``i`` of ``gpus`` becomes ``changes[i]``.

    :param gpus: the node's schedulable GPUs as they are.
    :param changes: index in ``gpus`` -> the GPU after the placement
        (see :func:`after`).
    """
    idle = partial = 0.0
    idle_after = partial_after = 0.0
    delta = 0.0
    for index, gpu in enumerate(gpus):
        new = changes.get(index, gpu)
        if gpu.idle:
            idle += 1
        else:
            partial += gpu.cus
        if new.idle:
            idle_after += 1
        else:
            partial_after += new.cus
        if new is not gpu:
            delta += score.share_fragment(new.cus, new.mem, new.slot,
                                          new.mem_mib, new.runs) - \
                score.share_fragment(gpu.cus, gpu.mem, gpu.slot,
                                     gpu.mem_mib, gpu.runs)
    if score.weights.wholes:
        delta += score.whole_fragment(int(idle_after), partial_after) - \
            score.whole_fragment(int(idle), partial)
    return delta


def share_cost(score: Score, gpu: GpuFree, cus: float, mem: float,
               slot_after: bool, idle: int, partial: float,
               mem_mib: int = 0, runs_after: tuple[float, ...] = ()
               ) -> float:
    """:func:`placement_cost` of one consumer of ``cus`` and ``mem``
    (fractions) on ``gpu``, given the node's ``idle`` GPUs and the free
    CUs (in GPUs) ``partial`` of its GPUs that are not idle, this one
    included when it is not idle (the fast path of the extender and the
    planner: O(shapes), memoised).

    :param slot_after: the GPU still has a free slot afterwards.
    :param mem_mib: the consumer's MiB (when ``gpu`` knows its own).
    :param runs_after: the free ranges left, when ``gpu`` has
        :attr:`GpuFree.runs` (a consumer gets one range).
    """
    new_cus = max(0.0, gpu.cus - cus)
    left = max(0, gpu.mem_mib - mem_mib) if gpu.mem_mib >= 0 else -1
    delta = score.share_fragment(new_cus, max(0.0, gpu.mem - mem),
                                 slot_after, left,
                                 runs_after if gpu.runs else ()) - \
        score.share_fragment(gpu.cus, gpu.mem, gpu.slot, gpu.mem_mib,
                             gpu.runs)
    if score.weights.wholes:
        if gpu.idle:
            delta += score.whole_fragment(idle - 1, partial + new_cus) - \
                score.whole_fragment(idle, partial)
        else:
            delta += score.whole_fragment(idle, partial - cus) - \
                score.whole_fragment(idle, partial)
    return delta


@dataclasses.dataclass(frozen=True)
class Option:
    """One way to place a share: a host's shareable GPUs (or compute
    partitions) as they are, and which of them takes it.

    :ivar gpus: what is free on each, see :class:`GpuFree`.
    :ivar index: the one that takes the share.
    :ivar cus: the share's CUs, as a fraction of that GPU's.
    :ivar mem: its memory, as a fraction of that GPU's.
    :ivar slot_after: that GPU still takes another consumer afterwards.
    :ivar mem_mib: its memory in MiB (0: by fraction only).
    :ivar runs_after: the free ranges of that GPU afterwards, when it has
        :attr:`GpuFree.runs`.
    """

    gpus: tuple[GpuFree, ...]
    index: int
    cus: float
    mem: float
    slot_after: bool = True
    mem_mib: int = 0
    runs_after: tuple[float, ...] = ()


def tightest_run(runs: Sequence[float], cus: float) -> float:
    """What the shortest of ``runs`` that holds ``cus`` leaves (all
    fractions of a GPU), or 1 when none holds it: the best fit among the
    ranges."""
    return min((r - cus for r in runs if r >= cus - _EPS), default=1.0)


def best(score: Score, options: Iterable[Option]) -> int | None:
    """The position in ``options`` of the placement that grows expected
    fragmentation least (ties: the tightest range when consumers get one
    range, then the fewest free CUs left on that GPU, then the first), or
    None when there is none.

    The fleet planner's entry point for ``k8s-shared`` GPUs: it lists the
    pools that fit a CU slice, and this picks among them.
    """
    chosen = None
    best_key = None
    for position, option in enumerate(options):
        gpu = option.gpus[option.index]
        idle = sum(1 for g in option.gpus if g.idle)
        partial = sum(g.cus for g in option.gpus if not g.idle)
        key = (round(share_cost(score, gpu, option.cus, option.mem,
                                option.slot_after, idle, partial,
                                option.mem_mib, option.runs_after), 9),
               tightest_run(gpu.runs, option.cus) if gpu.runs else 0.0,
               gpu.cus - option.cus)
        if best_key is None or key < best_key:
            chosen, best_key = position, key
    return chosen


def score_of(shapes: Iterable[tuple[Shape, float]] = ()) -> Score:
    """A score for a known mix (a planner knows the workloads it plans:
    one shape per workload, weight 1), or the default prior."""
    shapes = list(shapes)
    return Score(Weights.of(shapes or parse_prior(DEFAULT_PRIOR)))


class Mix:
    """The recent request mix, over a prior.

    :param prior: shapes and weights used before anything was asked (see
        :func:`parse_prior`).
    :param window: how many recent requests count.
    :param prior_weight: how many requests the prior is worth once real
        requests have been seen.
    :param refresh: requests between two recomputations of the weights.
    """

    def __init__(self, prior: Sequence[tuple[Shape, float]] = (),
                 window: int = 500, prior_weight: float = 30.0,
                 refresh: int = 100) -> None:
        self.prior = tuple(prior) or parse_prior(DEFAULT_PRIOR)
        total = sum(w for _s, w in self.prior)
        self._prior = [(s, w / total) for s, w in self.prior]
        self.window = max(1, window)
        self.prior_weight = max(0.0, prior_weight)
        self.refresh = max(1, refresh)
        self._recent: collections.deque[Shape] = collections.deque()
        self._counts = collections.Counter[Shape]()
        self._hosts = hostfit.Window(self.window)
        self._since = 0
        self._score = Score(Weights.of(self._prior))

    def record(self, shapes: Iterable[Shape],
               host: tuple[int, int] | None = None) -> None:
        """Count one request (its containers' shapes, and the CPU
        millicores and memory bytes it asks of its host)."""
        shapes = list(shapes)
        gpus = sum(s.gpus if s.whole else s.gpus * s.cus for s in shapes)
        self._hosts.record(*(host or (0, 0)), gpus)
        for shape in shapes:
            self._recent.append(shape)
            self._counts[shape] += 1
            if len(self._recent) > self.window:
                old = self._recent.popleft()
                self._counts[old] -= 1
                if not self._counts[old]:
                    del self._counts[old]
        self._since += 1
        if self._since >= self.refresh:
            self._since = 0
            self._score = Score(self.weights(), self.host_demands())

    def weights(self) -> Weights:
        seen = [(s, float(n)) for s, n in self._counts.items()]
        return Weights.of(seen + [(s, w * self.prior_weight)
                                  for s, w in self._prior])

    def host_demands(self) -> hostfit.Demands:
        """What the recent requests asked of their hosts (the prior's
        weight asking nothing)."""
        return self._hosts.demands(self.prior_weight)

    @property
    def score(self) -> Score:
        """The score of the current mix (recomputed every ``refresh``
        requests, so that its memo stays useful)."""
        return self._score
