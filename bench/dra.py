"""Benchmark: the DRA driver's slice publication and prepare latency.

* ``build``: plan + ResourceSlices of an 8 x MI300X CPX host (72 devices,
  3 slices), pure;
* ``publish``: those slices written to the API server stand-in with the
  real ``kubernetes`` client after a role change (new generation, every
  slice rewritten), and an idempotent publish with nothing changed;
* ``prepare``: NodePrepareResources over a real unix socket for
  ``--shares`` CU shares on each of 8 shared SPX GPUs (CU choice, state
  file written atomically, CDI spec written), as kubelet calls it.

Prints the median and 95th percentile per operation; asserts nothing.

Usage::

    python bench/dra.py [--runs 20] [--shares 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from amdgpu_virt import ledger as av_ledger  # noqa: E402
from amdgpu_virt import model  # noqa: E402
from amdgpu_virt.inventory import simulate  # noqa: E402
from amdgpu_virt.k8s.dra import cdi  # noqa: E402
from amdgpu_virt.k8s.dra import classes  # noqa: E402
from amdgpu_virt.k8s.dra import devices  # noqa: E402
from amdgpu_virt.k8s.dra import plugin as dra_plugin  # noqa: E402
from amdgpu_virt.k8s.dra import publish  # noqa: E402
from amdgpu_virt.k8s.dra import slices  # noqa: E402
from tests.functional.fixtures import apiserver  # noqa: E402
from tests.functional.fixtures import draallocator  # noqa: E402
from tests.functional.fixtures import drakubelet  # noqa: E402

DRIVER = 'gpu.amd.com'
NODE = 'bench-node'


def _report(label: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) -
                                                          1))))]
    print('%-22s runs=%-5d median=%9.2f ms  p95=%9.2f ms' % (
        label, len(samples), statistics.median(samples) * 1e3, p95 * 1e3))


def bench_publish(runs: int) -> None:
    from kubernetes import client

    inv = simulate.design_host(simulate.KINDS['mi300x-cpx-nps4'])
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        objs = slices.build(devices.plan(NODE, inv), DRIVER)
        samples.append(time.perf_counter() - start)
    _report('build (%d devices)' % sum(len(s['spec'].get('devices', []))
                                       for s in objs), samples)
    server = apiserver.ApiServer().start()
    try:
        api = client.ResourceV1Api(client.ApiClient(
            client.Configuration(host=server.url)))
        publisher = publish.Publisher(api, NODE, DRIVER)
        changed, same = [], []
        for n in range(runs):
            # alternate the last GPU's partition option so every other
            # publish changes what the node offers
            plan = devices.plan(NODE, inv, partition_devices=bool(n % 2))
            start = time.perf_counter()
            publisher.publish(plan)
            changed.append(time.perf_counter() - start)
            start = time.perf_counter()
            publisher.publish(plan)
            same.append(time.perf_counter() - start)
        _report('publish (changed)', changed)
        _report('publish (unchanged)', same)
    finally:
        server.stop()


def bench_prepare(shares: int) -> None:
    inv = simulate.design_host(simulate.KINDS['mi300x-spx'])
    ledger = av_ledger.Ledger(tuple(
        av_ledger.GpuAssignment(NODE, g.address, model.Role.K8S_SHARED,
                                'MI300X') for g in inv.gpus))
    tmp = tempfile.mkdtemp(prefix='dra-bench-')
    try:
        simulate.write_tree(inv, os.path.join(tmp, 'sys'))
        claims: dict[tuple[str, str], dict] = {}

        class Source:
            def read(self) -> av_ledger.Ledger:
                return ledger

        plugin = dra_plugin.DraPlugin(
            inv, NODE, lambda ns, name: claims[(ns, name)], driver=DRIVER,
            registration_dir=os.path.join(tmp, 'reg'),
            plugin_dir=os.path.join(tmp, 'plugin'),
            cdi_dir=os.path.join(tmp, 'cdi'),
            numbers=cdi.sysfs_numbers(os.path.join(tmp, 'sys')),
            ledger_source=Source())  # type: ignore[arg-type]
        kubelet = drakubelet.DraKubeletStandIn(
            os.path.join(tmp, 'reg')).start()
        plugin.start()
        try:
            kubelet.wait_for(DRIVER)
            allocator = draallocator.Allocator(
                slices.build(plugin.plan, DRIVER),
                classes.device_classes(DRIVER))
            # 304 CUs / 64 shares: 4 CUs and 3 GiB each
            cus = max(1, 304 // shares)
            samples = []
            for n in range(8 * shares):
                obj = draallocator.claim('c%d' % n, [draallocator.request(
                    's', 'share.' + DRIVER, capacity={
                        'computeUnits': str(cus), 'memory': '3Gi'})])
                allocation = allocator.allocate(obj, NODE)
                if allocation is None:
                    print('claim %d did not fit' % n)
                    break
                uid = '%08x-0000-4000-8000-000000000000' % n
                obj['metadata']['uid'] = uid
                obj['status'] = {'allocation': allocation}
                claims[('default', 'c%d' % n)] = obj
                start = time.perf_counter()
                response = kubelet.prepare(DRIVER, [('default', uid,
                                                     'c%d' % n)])
                samples.append(time.perf_counter() - start)
                if response[uid].error:
                    print('prepare %d failed: %s' % (n, response[uid].error))
                    break
            _report('prepare (%d shares)' % len(samples), samples)
            with open(plugin.state.path) as handle:
                print('state file: %d claims, %d bytes' % (
                    len(json.load(handle)['claims']),
                    os.path.getsize(plugin.state.path)))
        finally:
            plugin.stop()
            kubelet.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--runs', type=int, default=20,
                        help='slice builds and publishes (default 20)')
    parser.add_argument('--shares', type=int, default=64,
                        help='CU shares per GPU, 8 GPUs (default 64)')
    args = parser.parse_args(argv)
    bench_publish(args.runs)
    bench_prepare(args.shares)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
