"""Benchmark: placement policies on a GPU-sharing workload, side by side.

The FGD method (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC
'23): seeded tasks in the shape of a production trace arrive one after the
other until 130 % of the GPU capacity has been asked; nothing departs; a
task that fits nowhere is rejected (no queue). Node shapes and workloads
come in presets (``_gpushare_model.PRESETS``): ``cpu-tight`` (12 host cores
per GPU, the trace's mix with 13 % of tasks asking no GPU), ``today`` (16
cores per GPU, the same mix) and ``small-shares`` (this benchmark's first
workload); ``--cpu-per-gpu`` and ``--mem-per-gpu`` change a preset's host.

Tasks without a GPU are placed by a stand-in of kube-scheduler's default
profile (``_hostsched.py``, ``NodeResourcesFit`` LeastAllocated and
BalancedAllocation scoring, as a stock cluster runs), or by one of the
other configurations measured (``--gpuless``): its ``MostAllocated``
scoring, or the stock profile with the project's extender scoring them
through ``/prioritize``. With ``--same`` (the default runs both) every
policy sees the same placements of those tasks: where the stand-in put
them beside HAMi's first-fit (a task whose node has no room left under
another policy is placed by the stand-in there and counted as moved).

GPU policies (``_gpushare_policies.py``): ``hami`` (first-fit), ``best-fit``,
``dot-product``, ``fgd``, ``plain`` (the extender, ``packing = false``) and
``ours`` (the extender's default, its fragmentation score with the host).

Prints per preset, seed and placement of tasks without GPU: GPU capacity
allocated at the first rejection, at 100 % and at 130 % offered load;
tasks rejected; idle GPUs and free GPU capacity at 100 % on nodes whose
host has too little CPU or memory left for the smallest GPU task; the
unallocated capacity at 60 % to 130 %; decision time once 90 % was
offered (and as a ratio to ``hami``); then a summary over the seeds.

Usage::

    python bench/gpushare.py [--nodes 1200] [--seeds 1,2,3]
        [--presets cpu-tight,today] [--gpuless stock] [--modes live,same]
        [--policies hami,best-fit,fgd,plain,ours]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from typing import Any

import _gpushare_model as model
import _gpushare_policies as policies
import _hostsched
import _timing

NEAR_FULL = 0.9
DEFAULT_POLICIES = 'hami,best-fit,fgd,plain,ours'


@dataclasses.dataclass
class Outcome:
    name: str
    at_first_reject: float | None = None
    allocated: dict[float, float] = dataclasses.field(default_factory=dict)
    rejected: int = 0
    gpuless_rejected: int = 0
    moved: int = 0
    stranded: tuple[int, float] = (0, 0.0)
    clock: _timing.DecisionClock = dataclasses.field(
        default_factory=_timing.DecisionClock)
    #: task name -> node name ('' rejected), of tasks without GPU
    gpuless: dict[str, str] = dataclasses.field(default_factory=dict)


def run(name: str, preset: model.Preset, nodes: int, seed: int,
        tasks: list[model.Task], gpuless: str = 'stock',
        same: dict[str, str] | None = None, **options: Any) -> Outcome:
    """One policy on one task list.

    :param gpuless: how tasks without a GPU are placed (see
        :func:`_hostsched.options`).
    :param same: their placements to replay (task name -> node name).
    """
    cluster = model.make_cluster(nodes, seed, preset)
    by_name = {n.name: n for n in cluster}
    total = sum(len(n.gpus) for n in cluster)
    policy = policies.POLICIES[name](cluster, tasks, **options)
    setting = dict(_hostsched.options()[gpuless])
    weight = setting.pop('weight', 0)
    mirror = policy if isinstance(policy, policies.Mirror) else (
        policies.Mirror(cluster, policies.packing.Mix(), learn=True)
        if weight else None)
    placer = _hostsched.DefaultScheduler(
        cluster, seed, prioritize=(mirror.prioritize, weight)
        if weight and mirror is not None else None, **setting)
    outcome = Outcome(name)
    inside = isinstance(policy, policies.Ours)
    # as the extender service does after its list: what is loaded now
    # stays out of the collector's full passes
    gc.collect()
    gc.freeze()
    try:
        _place(policy, mirror, placer, tasks, same, by_name, total, inside,
               outcome, cluster)
    finally:
        gc.unfreeze()
    outcome.clock.close()
    return outcome


def _place(policy: Any, mirror: policies.Mirror | None,
           placer: _hostsched.DefaultScheduler, tasks: list[model.Task],
           same: dict[str, str] | None, by_name: dict[str, model.Node],
           total: int, inside: bool, outcome: Outcome,
           cluster: list[model.Node]) -> None:
    offered = allocated = 0.0
    marks = list(model.LOADS)
    for task in tasks:
        if task.gpuless:
            node = None
            if same is not None:
                node = by_name.get(same.get(task.name, ''))
                if same.get(task.name) == '':
                    outcome.gpuless_rejected += 1
                    continue
                if node is not None and not node.room(task):
                    node = None
                    outcome.moved += 1
            if node is None:
                node = placer.choose(task)
            if node is None:
                outcome.gpuless_rejected += 1
                outcome.gpuless[task.name] = ''
                continue
            model.apply((node, []), task)
            outcome.gpuless[task.name] = node.name
            if mirror is not None:
                mirror.seen(task, node, [])
            continue
        offered += task.demand / total
        timed = offered >= NEAR_FULL
        if inside:
            policy.clock = outcome.clock if timed else None
        elif timed:
            outcome.clock.start()
        choice = policy.choose(task)
        if timed and not inside:
            outcome.clock.stop()
        if choice is None:
            outcome.rejected += 1
            if outcome.at_first_reject is None:
                outcome.at_first_reject = allocated / total
        else:
            allocated += model.apply(choice, task)
            if mirror is not None and mirror is not policy:
                mirror.seen(task, *choice)
            if hasattr(policy, 'placed'):
                policy.placed(choice[0])
        while marks and offered >= marks[0] - 1e-9:
            mark = marks.pop(0)
            outcome.allocated[mark] = allocated / total
            if mark == 1.0:
                outcome.stranded = model.stranded(cluster, tasks)
    for mark in marks:
        outcome.allocated[mark] = allocated / total


def _table(outcomes: list[Outcome], gpus: int) -> None:
    print('GPU capacity allocated (%% of %d GPUs); at 100 %%, GPUs idle '
          'and capacity free beside a host too full for the smallest GPU '
          'task' % gpus)
    print('%-11s %9s %7s %7s %9s %9s %11s' % (
        'policy', '1st rej.', '100 %', '130 %', 'rejected', 'idle GPUs',
        'unfed GPUs'))
    for o in outcomes:
        print('%-11s %8.2f%% %6.2f%% %6.2f%% %9d %9d %11.1f' % (
            o.name, 100 * (o.at_first_reject or 0), 100 * o.allocated[1.0],
            100 * o.allocated[1.3], o.rejected, *o.stranded))
    extra = [o for o in outcomes if o.gpuless_rejected or o.moved]
    for o in extra:
        print('%-11s tasks without GPU: %d rejected, %d moved from the '
              'shared placements' % (o.name, o.gpuless_rejected, o.moved))
    print()
    print('Unallocated GPU capacity (%) by offered load')
    print('%-11s ' % 'policy' + ' '.join('%5d' % round(x * 100)
                                         for x in model.LOADS))
    for o in outcomes:
        print('%-11s ' % o.name + ' '.join(
            '%5.2f' % (100 * (1 - o.allocated[x])) for x in model.LOADS))
    print()
    base = next((o for o in outcomes if o.name == 'hami'), None)
    print('Decision time once %d %% was offered, ms (%s)'
          % (round(NEAR_FULL * 100), _timing.LEGEND))
    print(_timing.header('policy'))
    for o in outcomes:
        print(_timing.row(o.name, o.clock))
    if base is not None:
        print('Ratio to hami:')
        for o in outcomes:
            if o is not base:
                print('%-11s %s' % (o.name, _timing.ratio(o.clock,
                                                          base.clock)))
    print(flush=True)


def _summary(results: dict[tuple[str, str, int], list[Outcome]]) -> None:
    """Over the seeds: allocated at 100 %, and the margins of ``ours``."""
    print('Summary: GPU capacity allocated at 100 % offered (per seed)')
    groups: dict[tuple[str, str], list[list[Outcome]]] = {}
    for (preset, mode, _seed), outcomes in results.items():
        groups.setdefault((preset, mode), []).append(outcomes)
    for (preset, mode), runs in groups.items():
        print('%s, %s:' % (preset, mode))
        names = [o.name for o in runs[0]]
        for name in names:
            values = [next(o for o in run if o.name == name).allocated[1.0]
                      for run in runs]
            print('  %-11s %s' % (name, '  '.join('%6.2f%%' % (100 * v)
                                                  for v in values)))
        for other in ('hami', 'plain'):
            if 'ours' in names and other in names:
                margins = [min(next(o for o in run if o.name == 'ours')
                               .allocated[x] -
                               next(o for o in run if o.name == other)
                               .allocated[x] for x in model.LOADS)
                           for run in runs]
                print('  ours - %-5s least margin over loads 60-130 %%: %s'
                      % (other, '  '.join('%+.2f' % (100 * m)
                                          for m in margins)))
        if 'ours' in names and 'best-fit' in names:
            gains = [next(o for o in run if o.name == 'ours').allocated[1.0]
                     - next(o for o in run if o.name == 'best-fit')
                     .allocated[1.0] for run in runs]
            print('  ours - best-fit at 100 %%: %s' % '  '.join(
                '%+.2f' % (100 * g) for g in gains))
    print(flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--nodes', type=int, default=1200)
    parser.add_argument('--seeds', default='1,2,3')
    parser.add_argument('--presets', default='cpu-tight,today',
                        help='comma-separated, of %s' % ', '.join(
                            model.PRESETS))
    parser.add_argument('--cpu-per-gpu', type=int, default=0,
                        help='host cores per GPU (0: the preset\'s)')
    parser.add_argument('--mem-per-gpu', type=int, default=0,
                        help='host GiB per GPU (0: the preset\'s)')
    parser.add_argument('--gpuless', default='stock',
                        help='how tasks without GPU are placed, '
                        'comma-separated, of %s' % ', '.join(
                            _hostsched.options()))
    parser.add_argument('--modes', default='live,same',
                        help='live: each policy beside its own placements '
                        'of tasks without GPU; same: every policy with the '
                        'placements made beside hami')
    parser.add_argument('--policies', default=DEFAULT_POLICIES,
                        help='comma-separated, of %s' % ', '.join(
                            policies.POLICIES))
    parser.add_argument('--candidates', type=int, default=256,
                        help='ours: nodes that fit compared per decision '
                             '([scheduler] packing_candidates)')
    args = parser.parse_args(argv)
    results: dict[tuple[str, str, int], list[Outcome]] = {}
    for preset_name in args.presets.split(','):
        preset = model.PRESETS[preset_name]
        if args.cpu_per_gpu or args.mem_per_gpu:
            preset = dataclasses.replace(
                preset, cpu_per_gpu=args.cpu_per_gpu or preset.cpu_per_gpu,
                mem_per_gpu=args.mem_per_gpu or preset.mem_per_gpu)
        mix = model.MIXES[preset.mix]
        for seed in (int(s) for s in args.seeds.split(',')):
            cluster = model.make_cluster(args.nodes, seed, preset)
            tasks = model.make_tasks(cluster, seed, mix)
            gpus = sum(len(n.gpus) for n in cluster)
            bare = sum(1 for t in tasks if t.gpuless)
            shares = sum(1 for t in tasks if t.gpus and not t.whole)
            print('=== %s (%s, %d cores and %d GiB per GPU), seed %d: %d '
                  'nodes, %d GPUs; %d tasks (%d shares of one GPU, %d of '
                  'whole GPUs, %d without GPU) asking %.0f GPUs' % (
                      preset.name, preset.mix, preset.cpu_per_gpu,
                      preset.mem_per_gpu, seed, len(cluster), gpus,
                      len(tasks), shares, len(tasks) - shares - bare, bare,
                      sum(t.demand for t in tasks)), flush=True)
            for gpuless in args.gpuless.split(','):
                reference = None
                for mode in args.modes.split(','):
                    if mode == 'same' and reference is None:
                        reference = run('hami', preset, args.nodes, seed,
                                        tasks, gpuless).gpuless
                    outcomes = []
                    for name in args.policies.split(','):
                        started = time.perf_counter()
                        options = {'candidates': args.candidates} \
                            if name in ('ours', 'plain', 'ours-gpu-only') \
                            else {}
                        outcome = run(name, preset, args.nodes, seed,
                                      tasks, gpuless, reference
                                      if mode == 'same' else None,
                                      **options)
                        if mode == 'live' and name == 'hami':
                            reference = outcome.gpuless
                        outcomes.append(outcome)
                        print('  %-11s done in %.1f s' % (
                            name, time.perf_counter() - started),
                            flush=True)
                    print('\n--- %s, seed %d, tasks without GPU: %s, %s' % (
                        preset.name, seed, gpuless, mode))
                    _table(outcomes, gpus)
                    results[(preset.name, '%s/%s' % (gpuless, mode),
                             seed)] = outcomes
    _summary(results)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
