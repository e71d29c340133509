"""Packing benchmark: CU strategies on a pool of simulated MI300X GPUs.

A seeded trace of pod arrivals and departures (each pod asks for one GPU
slice: ``amd.com/gpucores`` 1..100 % and some memory) is replayed on a pool
of MI300X GPUs (304 CUs, 192 GiB each), once per CU strategy, side by
side. A pod that fits nowhere when it arrives is refused (no queue). The
GPU for a pod is chosen the same way for every strategy (binpack: the GPU
with the fewest free CUs that holds the pod's CUs and memory), so the
strategies differ only in which CUs of that GPU they hand out. The row
``score`` is best-fit with the GPU chosen instead by the extender's
fragmentation score (``amdgpu_virt.sharing.packing``, the pool taken as
one node, the mix learnt from the arrivals).

Figures per strategy and seed: pods admitted, their ratio to the capacity
bound (defined in the output), CU utilisation over time, fragmentation
(largest free run and free runs per GPU), and the shape of the masks
handed out (ranges per mask, XCC imbalance). A second table replays the
same traces with masks restricted to one range of CUs, where fragmentation
decides admissions; there the score sees each GPU's free ranges (a range
too short for a share is fragment for it) and the ranges the strategy
leaves, ties going to the tightest range. Last, allocations per second on
one 300-CU GPU.

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import random
import statistics
import sys
import time
from collections.abc import Callable

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import memory
from amdgpu_virt.sharing import packing

MI300X_CUS = 304
MI300X_MIB = 192 * 1024
MI300X_XCC = 8


@dataclasses.dataclass(frozen=True)
class Pod:
    name: str
    arrival: float
    departure: float
    percent: int
    cus: int
    mib: int


def make_trace(seed: int, pods: int, gpus: int,
               load: float) -> list[Pod]:
    """Poisson arrivals (rate 1), exponential lifetimes sized so that the
    offered CU demand is ``load`` times the pool's CUs."""
    rng = random.Random(seed)
    sizes = []
    for _ in range(pods):
        kind = rng.random()
        if kind < 0.40:
            percent = rng.randint(1, 12)
        elif kind < 0.75:
            percent = rng.randint(13, 50)
        elif kind < 0.92:
            percent = rng.randint(51, 99)
        else:
            percent = 100
        cus = hami.percent_to_cus(percent, MI300X_CUS)
        shape = rng.random()
        if shape < 0.5:        # memory in proportion to the CUs
            mib = MI300X_MIB * percent // 100
        elif shape < 0.8:      # small memory, whatever the CUs
            mib = rng.randint(1, 16) * 1024
        else:                  # memory-heavy
            mib = rng.randint(percent, 100) * MI300X_MIB // 100
        sizes.append((percent, cus, max(mib, 1024)))
    mean_cus = statistics.fmean(cus for _p, cus, _m in sizes)
    lifetime = load * gpus * MI300X_CUS / mean_cus
    trace = []
    now = 0.0
    for index, (percent, cus, mib) in enumerate(sizes):
        now += rng.expovariate(1.0)
        trace.append(Pod('pod-%d' % index, now,
                         now + rng.expovariate(1.0 / lifetime), percent,
                         cus, mib))
    return trace


class ContiguousFirstFit(allocator.CuStrategy):
    """First-fit over ranges: the lowest run of free CUs that holds the
    request, or nothing (bench only)."""

    name = 'first-fit'

    def choose(self, free: int, total: int, count: int,
               unit: int) -> int | None:
        for start, length in allocator.runs(
                allocator.whole_units(free, unit)):
            if length >= count:
                return ((1 << count) - 1) << start
        return None


class ContiguousBestFit(allocator.CuStrategy):
    """Best-fit over ranges: the smallest run that holds the request, or
    nothing (bench only)."""

    name = 'best-fit'

    def choose(self, free: int, total: int, count: int,
               unit: int) -> int | None:
        best = None
        for start, length in allocator.runs(
                allocator.whole_units(free, unit)):
            if length >= count and (best is None or length < best[1]):
                best = (start, length)
        return None if best is None else ((1 << count) - 1) << best[0]


@dataclasses.dataclass
class Result:
    admitted: int = 0
    utilisation: float = 0.0
    samples: tuple[float, ...] = ()
    largest_run: float = 0.0
    free_runs: float = 0.0
    pieces: float = 0.0
    contiguous: float = 0.0
    imbalance: float = 0.0


Event = tuple[float, int, int, Pod]


def _events(trace: list[Pod]) -> list[Event]:
    """Arrivals (kind 1); departures (kind 0, first on ties) are pushed as
    pods are admitted."""
    return [(pod.arrival, 1, index, pod) for index, pod in enumerate(trace)]


def _score_order(mix: packing.Mix, cus: list[allocator.CuAllocator],
                 mem: list[memory.MemoryShares], pod: Pod,
                 one_range: bool = False) -> list[int]:
    """The GPUs by the fragmentation score (the pool as one node).

    :param one_range: masks must be one range of CUs: the score sees each
        GPU's free ranges and the ranges left once the strategy has chosen
        (ties: the tightest range, then the fewest free CUs).
    """
    mix.record([packing.Shape.share(pod.cus / MI300X_CUS,
                                    pod.mib / MI300X_MIB, 1, pod.mib)])
    score = mix.score
    frees = [packing.GpuFree(c.free_count / MI300X_CUS,
                             m.free / MI300X_MIB, True, not c.used_count,
                             m.free) for c, m in zip(cus, mem, strict=True)]
    idle = sum(1 for f in frees if f.idle)
    partial = sum(f.cus for f in frees if not f.idle)
    if not one_range:
        return sorted(range(len(cus)), key=lambda i: (packing.share_cost(
            score, frees[i], pod.cus / MI300X_CUS, pod.mib / MI300X_MIB,
            True, idle, partial, pod.mib), cus[i].free_count, i))
    keys = []
    for index, gpu in enumerate(cus):
        free = gpu.free_mask
        taken = gpu.strategy.choose(free, MI300X_CUS, pod.cus, 1)
        if taken is None or not mem[index].fits(pod.mib):
            continue
        ranged = dataclasses.replace(
            frees[index], runs=packing.runs_of(free, MI300X_CUS))
        cost = packing.share_cost(
            score, ranged, pod.cus / MI300X_CUS, pod.mib / MI300X_MIB, True,
            idle, partial, pod.mib,
            packing.runs_of(free & ~taken, MI300X_CUS))
        keys.append((round(cost, 9), packing.tightest_run(
            ranged.runs, pod.cus / MI300X_CUS), gpu.free_count, index))
    return [key[-1] for key in sorted(keys)]


def simulate(trace: list[Pod], gpus: int,
             make_strategy: Callable[[], allocator.CuStrategy],
             sample_points: int = 4,
             mix: packing.Mix | None = None,
             one_range: bool = False) -> Result:
    cus = [allocator.CuAllocator('gpu-%d' % i, MI300X_CUS,
                                 strategy=make_strategy())
           for i in range(gpus)]
    mem = [memory.MemoryShares('gpu-%d' % i, MI300X_MIB)
           for i in range(gpus)]
    where: dict[str, int] = {}
    queue = _events(trace)
    heapq.heapify(queue)
    end = trace[-1].arrival
    marks = [end * (k + 1) / sample_points for k in range(sample_points)]
    samples = []
    used = 0
    last = 0.0
    area = 0.0
    largest = []
    free_runs = []
    pieces = []
    imbalance = []
    result = Result()
    while queue:
        now, kind, number, pod = heapq.heappop(queue)
        if now > end:
            break
        area += used * (now - last)
        last = now
        while marks and marks[0] <= now:
            samples.append(used / (gpus * MI300X_CUS))
            marks.pop(0)
        if kind == 0:   # departure
            index = where.pop(pod.name)
            cus[index].release(pod.name)
            mem[index].release(pod.name)
            used -= pod.cus
            continue
        # fragmentation as seen by each arrival
        for gpu in cus:
            frag = gpu.fragmentation()
            largest.append(frag.largest_free_run)
            free_runs.append(frag.free_runs)
        order = sorted(range(gpus), key=lambda i: (cus[i].free_count, i)) \
            if mix is None else _score_order(mix, cus, mem, pod, one_range)
        for index in order:
            if cus[index].usable_count < pod.cus or \
                    not mem[index].fits(pod.mib):
                continue
            try:
                chosen = cus[index].allocate_mask(pod.name, pod.cus)
            except exception.InsufficientCapacity:
                continue   # only the one-range strategies refuse here
            mem[index].allocate(pod.name, pod.mib)
            where[pod.name] = index
            used += pod.cus
            result.admitted += 1
            n_runs = len(allocator.runs(chosen))
            pieces.append(n_runs)
            imbalance.append(allocator.xcc_imbalance(chosen, MI300X_XCC))
            heapq.heappush(queue, (pod.departure, 0, number, pod))
            break
    while marks:
        samples.append(used / (gpus * MI300X_CUS))
        marks.pop(0)
    result.utilisation = area / (end * gpus * MI300X_CUS)
    result.samples = tuple(samples)
    result.largest_run = statistics.fmean(largest) if largest else 0.0
    result.free_runs = statistics.fmean(free_runs) if free_runs else 0.0
    result.pieces = statistics.fmean(pieces) if pieces else 0.0
    result.contiguous = (sum(1 for p in pieces if p == 1) / len(pieces)
                         if pieces else 0.0)
    result.imbalance = statistics.fmean(imbalance) if imbalance else 0.0
    return result


def capacity_bound(trace: list[Pod], gpus: int) -> int:
    """Pods admitted by a fluid pool: same trace, same admit-or-refuse
    rule, but the GPUs merged into one pool of CUs and MiB that any pod
    may take from in any amounts."""
    free_cus = gpus * MI300X_CUS
    free_mib = gpus * MI300X_MIB
    queue = _events(trace)
    heapq.heapify(queue)
    end = trace[-1].arrival
    admitted = 0
    while queue:
        now, kind, number, pod = heapq.heappop(queue)
        if now > end:
            break
        if kind == 0:
            free_cus += pod.cus
            free_mib += pod.mib
        elif pod.cus <= free_cus and pod.mib <= free_mib:
            free_cus -= pod.cus
            free_mib -= pod.mib
            admitted += 1
            heapq.heappush(queue, (pod.departure, 0, number, pod))
    return admitted


def allocation_rate(strategy: Callable[[], allocator.CuStrategy],
                    unit: int, operations: int,
                    seed: int = 0) -> tuple[float, float]:
    """Allocation speed on one 300-CU GPU under churn: allocate slices of
    1..40 % while they fit, otherwise release a random holder.

    :returns: allocations per second counting only the time spent in
        ``allocate``, and allocations per second of the whole loop (fit
        checks and releases included).
    """
    rng = random.Random(seed)
    sizes = [hami.percent_to_cus(rng.randint(1, 40), 300, unit)
             for _ in range(operations)]
    picks = [rng.random() for _ in range(operations)]
    names = ['p%d' % index for index in range(operations)]
    cus = allocator.CuAllocator('gpu', 300, unit=unit, strategy=strategy())
    holders: list[str] = []
    allocations = 0
    in_allocate = 0.0
    clock = time.perf_counter
    start = clock()
    for index, size in enumerate(sizes):
        if cus.usable_count >= size:
            owner = names[index]
            before = clock()
            cus.allocate(owner, size)
            in_allocate += clock() - before
            holders.append(owner)
            allocations += 1
        else:
            victim = int(picks[index] * len(holders))
            holders[victim], holders[-1] = holders[-1], holders[victim]
            cus.release(holders.pop())
    return allocations / in_allocate, allocations / (clock() - start)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seeds', type=int, default=5,
                        help='number of seeds (0..N-1); default 5')
    parser.add_argument('--pods', type=int, default=3000,
                        help='pod arrivals per trace; default 3000')
    parser.add_argument('--gpus', type=int, default=8,
                        help='MI300X GPUs in the pool; default 8')
    parser.add_argument('--load', type=float, default=1.3,
                        help='offered CU demand / pool CUs; default 1.3')
    parser.add_argument('--operations', type=int, default=200000,
                        help='operations of the allocation-rate run; '
                             'default 200000')
    parser.add_argument('--repeat', type=int, default=3,
                        help='runs of the allocation-rate test, the best '
                             'counts; default 3')
    parser.add_argument('--quick', action='store_true',
                        help='2 seeds, 600 pods, 20000 operations, 1 run')
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.pods, args.operations = 2, 600, 20000
        args.repeat = 1
    strategies = (('first-fit', allocator.FirstFitStrategy),
                  ('best-fit', allocator.BestFitStrategy))

    print('Packing: %d x MI300X (%d CUs, %d GiB), %d pods per trace, '
          'offered load %.2f, seeds 0..%d'
          % (args.gpus, MI300X_CUS, MI300X_MIB // 1024, args.pods,
             args.load, args.seeds - 1))
    print('Bound: pods a fluid pool admits: the same trace and the same '
          'admit-or-refuse rule, with all GPUs merged into one pool of '
          '%d CUs and %d GiB from which a pod may take any amounts '
          '(it ignores GPU boundaries, so no placement beats it by much; '
          'it is a greedy reference, not a proven optimum).'
          % (args.gpus * MI300X_CUS, args.gpus * MI300X_MIB // 1024))
    print('Util: CU-time used / CU-time available up to the last arrival; '
          'samples at 1/4, 2/4, 3/4, 4/4 of that span.')
    print('Largest run, free runs: per GPU, averaged over every arrival. '
          'Ranges: CU ranges per mask handed out; one-range: share of '
          'masks that are one range; XCC imb.: most minus fewest CUs of a '
          'mask on one of the 8 XCCs.')
    print()
    header = ('%-4s %-9s %8s %7s %6s %-23s %8s %9s %6s %9s %8s'
              % ('seed', 'strategy', 'admitted', 'bound', 'ratio',
                 'util mean (samples)', 'largest', 'free runs', 'ranges',
                 'one-range', 'XCC imb'))
    modes = (('Any CU set (HSA_CU_MASK takes any list)', None),
             ('Masks restricted to one range of CUs',
              {'first-fit': ContiguousFirstFit,
               'best-fit': ContiguousBestFit}))
    traces = [make_trace(seed, args.pods, args.gpus, args.load)
              for seed in range(args.seeds)]
    bounds = [capacity_bound(trace, args.gpus) for trace in traces]
    for title, contiguous in modes:
        print(title)
        print(header)
        rows = strategies + (('score', allocator.BestFitStrategy),)
        totals: dict[str, list[int]] = {name: [] for name, _s in rows}
        for seed, trace in enumerate(traces):
            for name, strategy in rows:
                made = contiguous['best-fit' if name == 'score' else name] \
                    if contiguous else strategy
                result = simulate(trace, args.gpus, made, mix=packing.Mix()
                                  if name == 'score' else None,
                                  one_range=contiguous is not None)
                totals[name].append(result.admitted)
                print('%-4d %-9s %8d %7d %6.3f %5.3f (%s) %8.1f %9.2f %6.2f '
                      '%8.1f%% %8.2f'
                      % (seed, name, result.admitted, bounds[seed],
                         result.admitted / bounds[seed], result.utilisation,
                         ' '.join('%.2f' % s for s in result.samples),
                         result.largest_run, result.free_runs,
                         result.pieces, 100 * result.contiguous,
                         result.imbalance))
        for name, _strategy in rows:
            print('     %-9s %8d %7d %6.3f  (all seeds)'
                  % (name, sum(totals[name]), sum(bounds),
                     sum(totals[name]) / sum(bounds)))
        print()

    print('Allocation rate, one 300-CU GPU, %d operations of churn '
          '(allocate 1..40 %% slices while they fit, else release one), '
          'best of %d runs' % (args.operations, args.repeat))
    print('%-9s %4s %16s %22s' % ('strategy', 'unit', 'allocate() per s',
                                  'whole loop allocs/s'))
    for name, strategy in strategies:
        for unit in (1, 2):
            rates = [allocation_rate(strategy, unit, args.operations)
                     for _ in range(args.repeat)]
            print('%-9s %4d %16.0f %22.0f'
                  % (name, unit, max(r[0] for r in rates),
                     max(r[1] for r in rates)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
