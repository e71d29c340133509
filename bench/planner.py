"""Fleet planner benchmark: time to plan and placed share vs the bound.

A seeded fleet of MI300X and MI210 hosts in every driver family and
partition mode, and a seeded mix of workloads (P2P training, tenant VMs,
inference pods, notebooks, isolated customer pods). Prints the plan time
and how close the plan comes to the capacity bound.

    python bench/planner.py                 # 1,000 hosts x 8 GPUs, 20,000
    python bench/planner.py --hosts 50 --workloads 1000
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from amdgpu_virt import conf as av_conf
from amdgpu_virt.inventory import simulate
from amdgpu_virt.policy import planner
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
                percent=rng.choice([10, 12.5, 20, 25]),
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
    args = parser.parse_args(argv)
    conf = av_conf.new_conf()
    t0 = time.perf_counter()
    fleet = make_fleet(args.hosts, args.gpus, args.seed)
    workloads = make_workloads(args.workloads, args.seed + 1)
    t1 = time.perf_counter()
    c1 = time.process_time()
    plan = planner.plan(conf, fleet, workloads)
    t2 = time.perf_counter()
    c2 = time.process_time()
    s = plan.summary()
    print('fleet: %d hosts, %d GPUs; %d workloads (built in %.2f s)'
          % (args.hosts, s['gpus'], len(workloads), t1 - t0))
    print('plan time: %.2f s wall, %.2f s CPU' % (t2 - t1, c2 - c1))
    print('placed: %d of %d (%s); unschedulable %d, never %d'
          % (s['placed'], s['workloads'], ', '.join(
              '%s %d' % i for i in s['placed_by_kind'].items()),
             s['by_code']['unschedulable-now'], s['by_code']['never-fits']))
    print('load: the feasible workloads need at least %.0f of %.0f free '
          'GPUs (%.0f %%)' % (s['bound']['demand_gpus'],
                              s['bound']['capacity_gpus'],
                              100 * s['bound']['demand_gpus']
                              / max(1.0, s['bound']['capacity_gpus'])))
    print('capacity bound: %d workloads, priority %d (feasible %d)'
          % (s['bound']['placed'], s['bound']['priority'],
             s['bound']['feasible']))
    print('placed / bound: %.1f %%; priority / bound: %.1f %%'
          % (100 * s['placed_of_bound'], 100 * s['priority_of_bound']))
    print('GPUs with a role: %d of %d; utilisation %.1f %% (of GPUs with a '
          'role %.1f %%); stranded %.1f GPU-equivalents'
          % (s['gpus_with_role'], s['gpus'], 100 * s['utilisation'],
             100 * s['utilisation_of_used'], s['stranded_gpus']))
    return 0


if __name__ == '__main__':
    sys.exit(main())
