"""Benchmark: how much GPU capacity any placement could allocate.

An upper bound for ``bench/gpushare.py``: for the tasks offered up to a
load (100 % by default), the most GPU capacity any placement at all could
allocate, online or offline, knowing every task in advance, free to reject
any of them. It is the optimum of a linear relaxation, so no placement
can do better:

* the host's CPU and memory and the shares' GPU memory are left out, and
  so are the nodes within a node kind: a whole-GPU task of ``g`` GPUs
  needs ``g`` GPUs of a kind of node (model and GPUs per node) with at
  least ``g`` GPUs, not of one node;
* each GPU holds shares within its CUs (each percent turned into CUs as
  the extender books them, ``hami.percent_to_cus``) and its ``count``
  slots, or one whole-GPU task;
* the linear program has a column for every way one GPU can be filled (a
  pattern: how many shares of each size) and for every width of
  whole-GPU task on every kind of node, and the number of tasks of each
  size and width as the supply.

Adding each share's GPU memory to the patterns (a column generation with
an exact knapsack of CUs, MiB and slots) gave the same bound on the
seeds it was tried on, at a hundred times the time, so it is not here.

A policy's distance to this bound is the most any change of its GPU
choice can gain on that workload. Needs ``scipy`` (HiGHS); ``--policies``
runs ``bench/gpushare.py``'s policies on the same tasks beside it.

Usage::

    python bench/gpushare_bound.py [--nodes 1200] [--seeds 1,2,3]
        [--presets today,cpu-tight] [--load 1.0]
        [--policies best-fit,ours]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _gpushare_model as model  # noqa: E402

from amdgpu_virt.sharing import hami  # noqa: E402


def offered(tasks: Sequence[model.Task], total: int,
            load: float) -> list[model.Task]:
    """The GPU tasks offered until ``load`` times the GPUs were asked
    (as ``bench/gpushare.py`` counts its marks)."""
    result = []
    asked = 0.0
    for task in tasks:
        if task.gpuless:
            continue
        result.append(task)
        asked += task.demand / total
        if asked >= load - 1e-9:
            break
    return result


#: a kind of node: (model, GPUs per node)
Kind = tuple[str, int]


def patterns(sizes: Sequence[int], devcore: int, slots: int
             ) -> list[tuple[int, ...]]:
    """Every multiset of share sizes (percent) one GPU of ``devcore`` CUs
    with ``slots`` slots holds: counts per size, in the order of
    ``sizes``."""
    cost = [hami.percent_to_cus(p, devcore) for p in sizes]
    found: list[tuple[int, ...]] = []

    def grow(index: int, left: int, room: int, counts: list[int]) -> None:
        if index == len(sizes):
            if any(counts):
                found.append(tuple(counts))
            return
        for n in range(min(room, left // cost[index]) + 1):
            counts.append(n)
            grow(index + 1, left - n * cost[index], room - n, counts)
            counts.pop()

    grow(0, devcore, slots, [])
    return found


def bound(cluster: Sequence[model.Node], tasks: Sequence[model.Task]
          ) -> tuple[float, int]:
    """(the most GPU capacity, in GPUs, any placement of ``tasks``
    allocates; the program's columns)."""
    from scipy.optimize import linprog  # the bench's own dependency

    gpus: collections.Counter[Kind] = collections.Counter()
    for node in cluster:
        gpus[(node.model, len(node.gpus))] += len(node.gpus)
    kinds = sorted(gpus)
    shares = collections.Counter(t.percent for t in tasks if not t.whole)
    sizes = sorted(shares)
    wholes = collections.Counter(t.gpus for t in tasks if t.whole)
    widths = sorted(wholes)
    fillings = {name: patterns(sizes, model.MODELS[name]['devcore'],
                               model.MODELS[name]['count'])
                for name in {k[0] for k in kinds}}
    # columns: ('share', kind, counts per size) or ('whole', kind, width)
    columns: list[tuple[str, Kind, Any]] = []
    for kind in kinds:
        columns += [('share', kind, f) for f in fillings[kind[0]]]
        columns += [('whole', kind, w) for w in widths if w <= kind[1]]
    objective = [-(sum(n * p / 100 for n, p in zip(c[2], sizes, strict=True))
                   if c[0] == 'share' else float(c[2])) for c in columns]
    rows = [[float(c[2] if c[0] == 'whole' else 1) if c[1] == kind
             else 0.0 for c in columns] for kind in kinds]
    rows += [[float(c[2][i]) if c[0] == 'share' else 0.0 for c in columns]
             for i in range(len(sizes))]
    rows += [[1.0 if c[0] == 'whole' and c[2] == w else 0.0
              for c in columns] for w in widths]
    limits = [float(gpus[k]) for k in kinds] + \
        [float(shares[p]) for p in sizes] + [float(wholes[w]) for w in widths]
    result = linprog(objective, A_ub=rows, b_ub=limits, bounds=(0, None),
                     method='highs')
    if result.status != 0:
        raise RuntimeError('the linear program failed: %s' % result.message)
    return -result.fun, len(columns)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--nodes', type=int, default=1200)
    parser.add_argument('--seeds', default='1,2,3')
    parser.add_argument('--presets', default='today,cpu-tight',
                        help='comma-separated, of: %s'
                        % ', '.join(model.PRESETS))
    parser.add_argument('--load', type=float, default=1.0,
                        help='offered load the bound is for (1.0: 100 %%)')
    parser.add_argument('--policies', default='',
                        help='policies of bench/gpushare.py to run beside '
                        'the bound on the same tasks (mode live), e.g. '
                        'best-fit,ours')
    args = parser.parse_args(argv)
    chosen = [p for p in args.policies.split(',') if p]
    print('GPU capacity allocated at %d %% offered (%% of the GPUs): the '
          'bound no placement exceeds%s' % (
              round(args.load * 100),
              ', beside ' + ', '.join(chosen) if chosen else ''))
    for name in args.presets.split(','):
        preset = model.PRESETS[name]
        mix = model.MIXES[preset.mix]
        for seed in (int(s) for s in args.seeds.split(',')):
            cluster = model.make_cluster(args.nodes, seed, preset)
            total = sum(len(n.gpus) for n in cluster)
            tasks = model.make_tasks(cluster, seed, mix)
            began = time.process_time()
            best, columns = bound(cluster, offered(tasks, total, args.load))
            took = time.process_time() - began
            line = '%-12s seed %d  bound %6.2f %%  (%d columns, %.1f s)' % (
                name, seed, 100 * best / total, columns, took)
            if chosen:
                import gpushare   # the policies and their driver
                for policy in chosen:
                    outcome = gpushare.run(policy, preset, args.nodes, seed,
                                           tasks)
                    got = outcome.allocated[min(
                        model.LOADS, key=lambda x: abs(x - args.load))]
                    line += '  %s %6.2f %% (%.2f below)' % (
                        policy, 100 * got, 100 * (best / total - got))
            print(line)
            sys.stdout.flush()
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
