"""Live running placements: time to turn what runs into kept placements.

A seeded fleet (half GIM hosts in CPX with 8 VFs per GPU, half amdgpu
hosts in SPX with GPUs k8s-shared or k8s-dedicated) and seeded holdings
as ``plan --running-from k8s,placement`` reads them: instances holding 1
to 3 VFs, pods holding CU slices (with and without CU ids), whole-GPU
claims, and a share of hostile ones (slices larger than the GPU,
overlapping CUs, unknown GPUs and hosts). Prints the time of
:func:`amdgpu_virt.policy.running.placements`, then of the plan made
around them, and the counts.

    python bench/running.py                    # 1,000 hosts, 8 GPUs each
    python bench/running.py --hosts 100 --hostile 0.5
"""

from __future__ import annotations

import argparse
import random
import time

from amdgpu_virt import conf as av_conf
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import Role
from amdgpu_virt.policy import planner
from amdgpu_virt.policy import running
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload


def fleet(hosts: int, gpus: int) -> tuple[list, av_ledger.Ledger]:
    inventories = []
    roles = []
    for i in range(hosts):
        gim = i % 2 == 0
        name = '%s-%d' % ('gim' if gim else 'bm', i)
        inv = simulate.design_host(simulate.HostSpec(
            name, gpus=gpus, mode='gim-cpx' if gim else 'spx'))
        inventories.append(inv)
        for n, gpu in enumerate(inv.gpus):
            role = Role.NOVA_VF if gim else (
                Role.K8S_SHARED if n % 2 == 0 else Role.K8S_DEDICATED)
            roles.append(av_ledger.GpuAssignment(
                name, gpu.address, role, gpu.model.name,
                vf_count=8 if gim else None))
    return inventories, av_ledger.build(roles)


def holdings(inventories: list, rng: random.Random,
             hostile: float) -> list[running.Holding]:
    result = []
    for inv in inventories:
        gim = inv.hostname.startswith('gim')
        for n, gpu in enumerate(inv.gpus):
            address = str(gpu.address)
            if gim:
                for k in range(rng.randint(0, 3)):
                    result.append(running.Holding(
                        'instance/%s-%d-%d' % (inv.hostname, n, k),
                        running.NOVA, inv.hostname, address,
                        vfs=rng.randint(1, 3)))
            elif n % 2:
                if rng.random() < 0.6:
                    result.append(running.Holding(
                        'claim/ns/%s-%d' % (inv.hostname, n),
                        running.KUBERNETES, inv.hostname, address,
                        whole=True))
            else:
                start = 0
                for k in range(rng.randint(0, 6)):
                    cus = rng.choice((19, 38, 76))
                    ids = tuple(range(start, start + cus)) \
                        if rng.random() < 0.5 else None
                    start += cus
                    result.append(running.Holding(
                        'pod/ns/%s-%d-%d' % (inv.hostname, n, k),
                        running.KUBERNETES, inv.hostname, address,
                        compute_units=cus, memory_mib=cus * 512, cus=ids))
            if rng.random() < hostile:
                kind = rng.randrange(4)
                name = 'pod/evil/%s-%d' % (inv.hostname, n)
                if kind == 0:
                    result.append(running.Holding(
                        name, running.KUBERNETES, inv.hostname, address,
                        compute_units=10_000, memory_mib=1 << 30))
                elif kind == 1:
                    result.append(running.Holding(
                        name, running.KUBERNETES, inv.hostname, address,
                        compute_units=38, memory_mib=1, cus=tuple(range(38))))
                elif kind == 2:
                    result.append(running.Holding(
                        name, running.KUBERNETES, inv.hostname, None,
                        problem='device x not registered'))
                else:
                    result.append(running.Holding(
                        name, running.KUBERNETES, 'nowhere-%d' % n,
                        address))
    rng.shuffle(result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', type=int, default=1000)
    parser.add_argument('--gpus', type=int, default=8)
    parser.add_argument('--hostile', type=float, default=0.05,
                        help='share of GPUs with one hostile holding')
    parser.add_argument('--workloads', type=int, default=2000)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    conf = av_conf.new_conf()
    inventories, ledger = fleet(args.hosts, args.gpus)
    live = holdings(inventories, rng, args.hostile)
    start = time.perf_counter()
    result = running.placements(conf, inventories, ledger, live)
    took = time.perf_counter() - start
    held = sum(1 for d in result.placements
               if d.workload.startswith(running.HELD))
    print('%d hosts x %d GPUs, %d holdings: %d running placements (%d held '
          'GPUs), %d warnings in %.2f s' % (
              args.hosts, args.gpus, len(live), len(result.placements), held,
              len(result.warnings), took))
    workloads = [Workload('w%d' % i, Platform.POD, Tenancy.TRUSTED,
                          cus=rng.choice((19, 38, 76)),
                          memory_mib=rng.choice((4096, 16384)))
                 for i in range(args.workloads)]
    start = time.perf_counter()
    plan = planner.plan(conf, inventories, workloads, result.ledger,
                        result.placements)
    took = time.perf_counter() - start
    summary = plan.summary()
    print('plan of %d new workloads around them: %d placed, kept %d, in '
          '%.2f s' % (args.workloads, summary['placed'],
                      summary['existing'], took))


if __name__ == '__main__':
    main()
