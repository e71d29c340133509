"""Benchmark: the Kubernetes node side's per-request costs.

* ``webhook``: decisions per second of the admission webhook's pure
  ``review`` over a mix of GPU pods (allowed and denied);
* ``shared``: one HAMi Allocate decision (pod lookup, CU occupancy rebuilt
  from ``--pods`` live pods on an 8-GPU node, mask choice), without I/O;
* ``grpc``: Allocate round trips to a device plugin on a unix socket
  (whole-GPU mode), as kubelet makes them.

Prints the median and 95th percentile per operation.

Usage::

    python bench/k8s.py [--reviews 2000] [--pods 64] [--decisions 200]
                        [--allocs 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import grpc

from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.admission import webhook
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc
from amdgpu_virt.sharing import hami


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1,
                       int(round(fraction * (len(ordered) - 1))))]


def _timed(label: str, runs: int, func: Callable[[int], Any]) -> None:
    samples = []
    for n in range(runs):
        start = time.perf_counter()
        func(n)
        samples.append(time.perf_counter() - start)
    print('%-10s runs=%-6d median=%9.1f us  p95=%9.1f us  (%.0f/s)' % (
        label, runs, statistics.median(samples) * 1e6,
        _percentile(samples, 0.95) * 1e6, runs / sum(samples)))


def _review(n: int) -> dict[str, Any]:
    limits: dict[str, Any] = {'amd.com/gpu': 1 + n % 2}
    if n % 3:
        limits['amd.com/gpucores'] = str((n * 7) % 120)
    containers = [{'name': 'c%d' % i, 'image': 'rocm',
                   'resources': {'limits': limits},
                   'env': [{'name': 'A', 'value': '1'}]} for i in range(2)]
    return {'request': {'uid': 'u%d' % n, 'kind': {'kind': 'Pod'},
                        'namespace': 'ns', 'operation': 'CREATE',
                        'object': {'metadata': {'name': 'p%d' % n},
                                   'spec': {'containers': containers}}}}


def bench_webhook(reviews: int) -> None:
    policy = webhook.WebhookPolicy()
    bodies = [_review(n) for n in range(reviews)]
    _timed('webhook', reviews,
           lambda n: webhook.review(bodies[n], policy, {}))


def bench_shared(live: int, decisions: int) -> None:
    units = devices.units_from_inventory(simulate.design_host(
        simulate.HostSpec(hostname='bench')))
    pods = []
    for n in range(live):
        unit = units[n % len(units)]
        first = (n // len(units)) * 8
        pods.append({'metadata': {'name': 'live%d' % n, 'namespace': 'ns',
                                  'annotations': {hami.CU_ALLOCATED:
                                                  '{"%s":"%d-%d"}' % (
                                                      unit.uuid, first,
                                                      first + 7)}},
                     'status': {'phase': 'Running'}})
    value = '%s,AMD,4096,16:;' % units[0].uuid
    pod = {'metadata': {'name': 'new', 'namespace': 'ns', 'annotations': {
        hami.BIND_PHASE: 'allocating', hami.VGPU_NODE: 'bench',
        hami.BIND_TIME: '1', hami.DEVICES_TO_ALLOCATE: value}},
        'status': {'phase': 'Pending'}}
    everything = [*pods, pod]

    def decide(_n: int) -> None:
        found = sharedalloc.find_pod(everything, 'bench', None)
        assert found is not None
        sharedalloc.allocate(found, units, everything, ['x-0'], 'bench')

    _timed('shared', decisions, decide)


def bench_grpc(allocs: int) -> None:
    directory = tempfile.mkdtemp(prefix='dpb')
    try:
        inventory = simulate.design_host(simulate.HostSpec(hostname='b'))
        plugin = deviceplugin.DevicePlugin(
            inventory, plugin_dir=directory, socket_name='bench.sock',
            share_count=1).start()
        try:
            ids = [d.id for d in plugin.device_list()]
            with grpc.insecure_channel('unix:' + plugin.socket_path) as ch:
                stub = api_pb2_grpc.DevicePluginStub(ch)

                def allocate(n: int) -> None:
                    stub.Allocate(api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(
                            devices_ids=[ids[n % len(ids)]])]), timeout=10)

                allocate(0)  # connect first
                _timed('grpc', allocs, allocate)
        finally:
            plugin.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--reviews', type=int, default=2000,
                        help='webhook decisions (default 2000)')
    parser.add_argument('--pods', type=int, default=64,
                        help='live pods holding 8 CUs each on the 8-GPU '
                        'node, at most 288 (default 64)')
    parser.add_argument('--decisions', type=int, default=200,
                        help='HAMi Allocate decisions (default 200)')
    parser.add_argument('--allocs', type=int, default=200,
                        help='gRPC Allocate round trips (default 200)')
    args = parser.parse_args(argv)
    if min(args.reviews, args.decisions, args.allocs) < 1 or \
            not 0 <= args.pods <= 288:
        parser.error('counts must be positive and --pods at most 288')
    print('python %s, %d CPUs' % (sys.version.split()[0], os.cpu_count()))
    bench_webhook(args.reviews)
    bench_shared(args.pods, args.decisions)
    bench_grpc(args.allocs)
    return 0


if __name__ == '__main__':
    sys.exit(main())
