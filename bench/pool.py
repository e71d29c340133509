"""Benchmark: the shared pool commands' pure work on a large fleet.

Builds ``--hosts`` simulated hosts of 8 MI300X (half under GIM with 8 VFs
per GPU, half under amdgpu) and their ledger (``nova-vf`` and
``k8s-shared``), then times: checking the ledger against the inventories,
rendering every host's files (Nova snippets and GIM files through the Nova
renderers; Kubernetes hosts need none, the ledger ConfigMap is all they
read), writing them (first run), the idempotent second run, and a
cross-audit of one observation per GPU and side.

Usage::

    python bench/pool.py [--hosts 1000] [--tmpdir DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from amdgpu_virt import conf
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import Role
from amdgpu_virt.nova import driver
from amdgpu_virt.nova import pool as nova_pool
from amdgpu_virt.pool import apply
from amdgpu_virt.pool import crossaudit
from amdgpu_virt.pool.observed import SideObservation


def _timed(label: str, func, *args, **kwargs):
    start = time.perf_counter()
    result = func(*args, **kwargs)
    print('%-34s %9.1f ms' % (label, 1000 * (time.perf_counter() - start)))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--hosts', type=int, default=1000,
                        help='hosts of 8 GPUs (default 1000)')
    parser.add_argument('--tmpdir', default=None,
                        help='where to write the rendered files')
    args = parser.parse_args(argv)
    inventories = {}
    items = []
    for n in range(args.hosts):
        gim = n % 2 == 0
        name = 'host-%05d' % n
        inventory = simulate.design_host(simulate.HostSpec(
            name, gpus=8, mode='gim-cpx' if gim else 'spx'))
        inventories[name] = inventory
        for gpu in inventory.gpus:
            items.append(av_ledger.GpuAssignment(
                name, gpu.address, Role.NOVA_VF if gim else Role.K8S_SHARED,
                'MI300X', vf_count=8 if gim else None))
    ledger = av_ledger.build(items)
    print('%d hosts, %d GPUs' % (args.hosts, len(items)))
    _timed('ledger against inventories', av_ledger.check_hardware, ledger,
           inventories.values())
    renderer = nova_pool.NovaRenderer(driver.NovaBackend(conf.new_conf()))
    files = _timed('render every host', apply.render_all, ledger,
                   ledger.hosts, inventories, renderer)
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as out:
        report = _timed('write (first run)', apply.apply_files, out, files)
        print('%-34s %9d' % ('files written', len(report.written)))
        report = _timed('write (second run, nothing to do)',
                        apply.apply_files, out, files)
        print('%-34s %9d' % ('files written', len(report.written)))
    observations = []
    for item in items:
        side = item.role.side or 'nova'
        observations.append(SideObservation(side, item.host, item.address,
                                            capacity=8))
    result = _timed('cross-audit', crossaudit.audit, ledger,
                    inventories.values(), observations)
    print('%-34s %9d' % ('conflicts', len(result.conflicts)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
