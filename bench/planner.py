"""Fleet planner benchmark: time to plan and placed share vs the bound.

A seeded fleet of MI300X and MI210 hosts in every driver family and
partition mode, and a seeded mix of workloads (P2P training, tenant VMs,
inference pods, notebooks, isolated customer pods). Prints the plan time
and how close the plan comes to the capacity bound.

    python bench/planner.py                 # 1,000 hosts x 8 GPUs, 20,000
    python bench/planner.py --hosts 50 --workloads 1000
    python bench/planner.py --hosts 1000 --workloads 31000 --improve 10
    python bench/planner.py --scale 1000,2000,5000,10000   # time, memory
    python bench/planner.py --hosts 10000 --workloads 200000 --phases

``--improve`` plans again with the improvement pass and prints both;
``--scale`` runs each size in its own process (so each peak RSS is that
size's) and prints the log-log slope of the plan time; ``--phases`` plans
once more with a timer around each part of the planner and prints where
the time went.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import random
import resource
import subprocess
import sys
import time

from amdgpu_virt import conf as av_conf
from amdgpu_virt.inventory import simulate
from amdgpu_virt.policy import candidates
from amdgpu_virt.policy import engine
from amdgpu_virt.policy import planner
from amdgpu_virt.policy import report as av_report
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Sensitivity
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload

#: (share of hosts, model, mode, nps)
HOST_MIX = (
    (0.40, 'MI300X', 'gim-cpx', 'nps1'),
    (0.30, 'MI300X', 'spx', 'nps1'),
    (0.15, 'MI300X', 'cpx', 'nps4'),
    (0.10, 'MI210', 'spx', 'nps1'),
    (0.05, 'MI300X', 'vfio', 'nps1'),
)


#: the parts of a plan --phases times: (part, owner, attribute)
PHASES = (
    ('build the fleet state', planner.Planner, '_build'),
    ('judge (filters)', engine.Engine, 'judge'),
    ('search', candidates.CandidateSearch, '_dedicated'),
    ('search', candidates.CandidateSearch, '_vf'),
    ('search', candidates.CandidateSearch, '_cu'),
    ('rank (weighers)', planner.Planner, '_rank'),
    ('commit', planner.Planner, '_commit'),
    ('bound', planner.Planner, 'bound'),
    ('GPU reports', av_report, 'gpu_reports'),
    ('ledger', av_report, 'ledger_of'),
)


def make_fleet(hosts: int, gpus: int, seed: int) -> list:
    rng = random.Random(seed)
    result = []
    for i in range(hosts):
        pick = rng.random()
        chosen = HOST_MIX[-1]
        for entry in HOST_MIX:
            if pick < entry[0]:
                chosen = entry
                break
            pick -= entry[0]
        _share, model, mode, nps = chosen
        count = 4 if model == 'MI210' else gpus
        result.append(simulate.design_host(simulate.HostSpec(
            hostname='host-%04d' % i, model=model, gpus=count, mode=mode,
            nps=nps)))
    return result


def make_workloads(count: int, seed: int) -> list[Workload]:
    rng = random.Random(seed)
    result = []
    for i in range(count):
        pick = rng.random()
        name = 'w%05d' % i
        if pick < 0.02:
            result.append(Workload(
                name, rng.choice([Platform.VM, Platform.POD]),
                Tenancy.ISOLATED, gpus=rng.choice([2, 4, 8]), p2p=True,
                sensitivity=Sensitivity.HIGH,
                priority=rng.randint(80, 100)))
        elif pick < 0.05:
            result.append(Workload(name, Platform.VM, Tenancy.ISOLATED,
                                   priority=rng.randint(40, 80)))
        elif pick < 0.40:
            result.append(Workload(
                name, Platform.VM, Tenancy.ISOLATED,
                gpus=rng.choice([1, 1, 1, 2]),
                memory_mib=rng.choice([8, 12, 16, 20]) * 1024, cus=38,
                priority=rng.randint(30, 70)))
        elif pick < 0.70:
            result.append(Workload(
                name, Platform.POD, Tenancy.TRUSTED,
                gpus=rng.choice([1, 1, 1, 2]),
                memory_mib=rng.choice([16, 24, 32, 48]) * 1024,
                percent=rng.choice([10, 12, 20, 25]),
                sensitivity=rng.choice([Sensitivity.LOW,
                                        Sensitivity.MEDIUM]),
                priority=rng.randint(20, 60)))
        elif pick < 0.95:
            result.append(Workload(
                name, Platform.ANY, Tenancy.TRUSTED,
                memory_mib=rng.choice([4, 8]) * 1024,
                cus=rng.choice([8, 16, 19]), sensitivity=Sensitivity.LOW,
                priority=rng.randint(0, 20)))
        else:
            result.append(Workload(
                name, Platform.POD, Tenancy.ISOLATED,
                memory_mib=64 * 1024, percent=40,
                priority=rng.randint(30, 60)))
    return result


def run(hosts: int, gpus: int, workloads: int, seed: int,
        improve: float, tries: int) -> dict:
    """Plan once (greedy, then with the improvement pass when
    ``improve``); figures as a dict."""
    t0 = time.perf_counter()
    fleet = make_fleet(hosts, gpus, seed)
    items = make_workloads(workloads, seed + 1)
    built = time.perf_counter() - t0
    result = {'hosts': hosts, 'workloads': workloads, 'built_s': built,
              # the inputs alone: the fleet's inventories and workloads
              'input_rss_mib': resource.getrusage(
                  resource.RUSAGE_SELF).ru_maxrss / 1024}
    for label, seconds in (('greedy', 0.0), ('improved', improve)):
        if label == 'improved' and not improve:
            break
        conf = av_conf.new_conf()
        conf.set_override('improve_seconds', seconds, 'policy')
        conf.set_override('improve_tries', tries, 'policy')
        w0, c0 = time.perf_counter(), time.process_time()
        plan = planner.plan(conf, fleet, items)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        s = plan.summary()
        result[label] = {
            'wall_s': wall, 'cpu_s': cpu, 'gpus': s['gpus'],
            'placed': s['placed'], 'placed_priority': s['placed_priority'],
            'placed_by_kind': s['placed_by_kind'],
            'unschedulable': s['by_code']['unschedulable-now'],
            'never': s['by_code']['never-fits'], 'bound': s['bound'],
            'placed_of_bound': s['placed_of_bound'],
            'priority_of_bound': s['priority_of_bound'],
            'gpus_with_role': s['gpus_with_role'],
            'utilisation': s['utilisation'],
            'utilisation_of_used': s['utilisation_of_used'],
            'stranded_gpus': s['stranded_gpus']}
        del plan
    # the peak of this process: fleet, workloads and the plans made
    result['peak_rss_mib'] = resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _timer(part, call, seconds, calls):
    """``call`` with its wall time and count added to ``part``."""

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            seconds[part] += time.perf_counter() - start
            calls[part] += 1
    return timed


@contextlib.contextmanager
def timed_phases():
    """Wall seconds and calls per part of :data:`PHASES` while inside
    (each part's attribute wrapped by a timer, put back after)."""
    seconds: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    saved = []
    for part, owner, name in PHASES:
        original = owner.__dict__[name]
        saved.append((owner, name, original))
        setattr(owner, name, _timer(part, original, seconds, calls))
    try:
        yield seconds, calls
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def timer_cost(rounds: int = 200000) -> float:
    """Seconds a timer adds to one call (a call that does nothing, timed
    and not)."""
    def nothing():
        return None
    timed = _timer('x', nothing, collections.Counter(),
                   collections.Counter())
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            timed()
        middle = time.perf_counter()
        for _ in range(rounds):
            nothing()
        best = min(best, (middle - start) - (time.perf_counter() - middle))
    return max(0.0, best / rounds)


def phases(hosts: int, gpus: int, workloads: int, seed: int) -> None:
    """Plan once (greedy) with :func:`timed_phases` and print the parts."""
    fleet = make_fleet(hosts, gpus, seed)
    items = make_workloads(workloads, seed + 1)
    conf = av_conf.new_conf()
    conf.set_override('improve_seconds', 0.0, 'policy')
    with timed_phases() as (seconds, calls):
        w0, c0 = time.perf_counter(), time.process_time()
        planner.plan(conf, fleet, items)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    count = sum(calls.values())
    overhead = count * timer_cost()
    print('%d hosts, %d workloads: plan %.2f s wall, %.2f s CPU, with a '
          'timer around each part (%d timed calls, which add about %.2f s)'
          % (hosts, workloads, wall, cpu, count, overhead))
    parts = list(dict.fromkeys(part for part, _o, _n in PHASES))
    for part in parts:
        print('  %-22s %7.2f s %5.1f %% %9d calls %7.2f us a call' % (
            part, seconds[part], 100 * seconds[part] / wall, calls[part],
            1e6 * seconds[part] / max(1, calls[part])))
    rest = wall - sum(seconds.values())
    print('  %-22s %7.2f s %5.1f %% (the order, the candidate caches, the '
          'decisions and their trails, the timers)'
          % ('the rest', rest, 100 * rest / wall))
    without = wall - seconds['search']
    print('  without the searches: %.2f s (%.1f us a workload; the timers '
          'outside the searches add about %.2f s of it)'
          % (without, 1e6 * without / max(1, workloads),
             overhead * (1 - calls['search'] / max(1, count))))


def report(r: dict) -> None:
    g = r['greedy']
    print('fleet: %d hosts, %d GPUs; %d workloads (built in %.2f s)'
          % (r['hosts'], g['gpus'], r['workloads'], r['built_s']))
    print('plan time: %.2f s wall, %.2f s CPU; peak RSS %.0f MiB (%.0f MiB '
          'before planning: the inventories and workloads)'
          % (g['wall_s'], g['cpu_s'], r['peak_rss_mib'],
             r['input_rss_mib']))
    print('placed: %d of %d (%s); unschedulable %d, never %d'
          % (g['placed'], r['workloads'], ', '.join(
              '%s %d' % i for i in g['placed_by_kind'].items()),
             g['unschedulable'], g['never']))
    b = g['bound']
    print('load: the feasible workloads need at least %.0f of %.0f free '
          'GPUs (%.0f %%)' % (b['demand_gpus'], b['capacity_gpus'],
                              100 * b['demand_gpus']
                              / max(1.0, b['capacity_gpus'])))
    print('capacity bound: %d workloads, priority %d (feasible %d)'
          % (b['placed'], b['priority'], b['feasible']))
    print('placed / bound: %.1f %%; priority / bound: %.1f %%'
          % (100 * g['placed_of_bound'], 100 * g['priority_of_bound']))
    print('GPUs with a role: %d of %d; utilisation %.1f %% (of GPUs with a '
          'role %.1f %%); stranded %.1f GPU-equivalents'
          % (g['gpus_with_role'], g['gpus'], 100 * g['utilisation'],
             100 * g['utilisation_of_used'], g['stranded_gpus']))
    if 'improved' in r:
        i = r['improved']
        print('improvement pass: %.2f s wall in all; placed %d -> %d, '
              'priority %d -> %d (%+.2f %%), priority / bound %.1f %%'
              % (i['wall_s'], g['placed'], i['placed'],
                 g['placed_priority'], i['placed_priority'],
                 100 * (i['placed_priority'] - g['placed_priority'])
                 / max(1, g['placed_priority']),
                 100 * i['priority_of_bound']))


def scale(sizes: list[int], per_host: int, args: argparse.Namespace) -> None:
    """One process per size (so each peak RSS is its own), then the
    log-log slope of the plan time."""
    rows = []
    for hosts in sizes:
        out = subprocess.run(
            [sys.executable, __file__, '--hosts', str(hosts),
             '--workloads', str(hosts * per_host), '--gpus', str(args.gpus),
             '--seed', str(args.seed), '--improve', str(args.improve),
             '--improve-tries', str(args.improve_tries), '--json'],
            check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out))
    print('%7s %9s %9s %9s %9s %9s %8s %9s %10s' % (
        'hosts', 'workloads', 'wall s', 'CPU s', 'peak MiB', 'input MiB',
        'placed', 'priority', 'improved'))
    for r in rows:
        g = r['greedy']
        better = r.get('improved', {}).get('placed_priority')
        print('%7d %9d %9.2f %9.2f %9.0f %9.0f %7.1f%% %9d %10s' % (
            r['hosts'], r['workloads'], g['wall_s'], g['cpu_s'],
            r['peak_rss_mib'], r['input_rss_mib'],
            100 * g['placed'] / r['workloads'], g['placed_priority'],
            '-' if better is None else better))
    for key in ('wall_s', 'cpu_s'):
        xs = [math.log(r['hosts']) for r in rows]
        ys = [math.log(r['greedy'][key]) for r in rows]
        ends = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if len(rows) > 1 else 0
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        pairs = zip(xs, ys, strict=True)
        fit = sum((x - mean_x) * (y - mean_y) for x, y in pairs) / (
            sum((x - mean_x) ** 2 for x in xs) or 1)
        print('log-log slope of %s from %d to %d hosts: %.2f (end points), '
              '%.2f (least squares)' % (key, rows[0]['hosts'],
                                        rows[-1]['hosts'], ends, fit))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', type=int, default=1000,
                        help='hosts in the fleet (default 1000)')
    parser.add_argument('--gpus', type=int, default=8,
                        help='GPUs per MI300X host (MI210 hosts have 4)')
    parser.add_argument('--workloads', type=int, default=20000,
                        help='workloads to place (default 20000)')
    parser.add_argument('--seed', type=int, default=42,
                        help='seed of the fleet and workload mix')
    parser.add_argument('--improve', type=float, default=0.0,
                        metavar='SECONDS',
                        help='also plan with the improvement pass of this '
                             'budget and print both (default: off)')
    parser.add_argument('--improve-tries', type=int, default=4,
                        help='[policy] improve_tries for --improve')
    parser.add_argument('--scale', metavar='H1,H2,...',
                        help='plan fleets of these host counts, each with '
                             '--per-host workloads per host, in their own '
                             'process; print time, peak RSS and the log-log '
                             'slope')
    parser.add_argument('--per-host', type=int, default=20,
                        help='workloads per host for --scale (default 20)')
    parser.add_argument('--json', action='store_true',
                        help='print the figures as JSON')
    parser.add_argument('--phases', action='store_true',
                        help='plan once (greedy) with a timer around each '
                             'part of the planner and print where the time '
                             'went')
    args = parser.parse_args(argv)
    if args.phases:
        phases(args.hosts, args.gpus, args.workloads, args.seed)
        return 0
    if args.scale:
        scale([int(x) for x in args.scale.split(',')], args.per_host, args)
        return 0
    result = run(args.hosts, args.gpus, args.workloads, args.seed,
                 args.improve, args.improve_tries)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0


if __name__ == '__main__':
    sys.exit(main())
