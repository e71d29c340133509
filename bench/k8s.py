"""Benchmark: the Kubernetes node side's per-request costs.

* ``webhook``: decisions per second of the admission webhook's pure
  ``review`` over a mix of GPU pods (allowed and denied);
* ``shared``: one record-driven Allocate decision without I/O: the
  record of ``--pods`` live pods on an 8-GPU node checked, the pod and
  container chosen (the lock holder's container that got its init
  container's device ID again, with every live pod's served IDs in the
  checkpoint), and the answer built;
* ``grpc``: Allocate round trips to a device plugin on a unix socket
  (whole-GPU mode), as kubelet makes them.

Prints the median and 95th percentile per operation.

Usage::

    python bench/k8s.py [--reviews 2000] [--pods 64] [--decisions 200]
                        [--allocs 200]
"""

from __future__ import annotations

import argparse
import datetime
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
from amdgpu_virt.k8s.node import sharedpick
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc
from amdgpu_virt.k8s.record import allocation as allocrecord
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
    capacity = sharedalloc.capacity(units, 64)
    record = allocrecord.Record('bench')
    served = sharedalloc.Served()
    pods = []
    for n in range(live):
        unit = units[n % len(units)]
        uid = 'uid-live%d' % n
        record = allocrecord.book(record, uid, 'ns', 'live%d' % n, n, ((
            hami.ContainerDevice(unit.uuid, 'AMD', 256, 8),),), capacity)
        served = served.add(uid, 0, [unit.device_id(n // len(units))])
        pods.append({'metadata': {'name': 'live%d' % n, 'namespace': 'ns',
                                  'uid': uid},
                     'spec': {'nodeName': 'bench', 'containers': [
                         {'name': 'c0'}]},
                     'status': {'phase': 'Running', 'containerStatuses': [
                         {'name': 'c0', 'state': {'running': {}}}]}})
    # the lock holder: an init container, then a container that gets the
    # init container's device ID again (kubelet's reuse)
    gpu = units[0]
    record = allocrecord.book(record, 'uid-new', 'ns', 'new', live, (
        (hami.ContainerDevice(gpu.uuid, 'AMD', 1024, 16),),
        (hami.ContainerDevice(gpu.uuid, 'AMD', 4096, 16),)), capacity)
    served = served.add('uid-new', 0, [gpu.device_id(63)])
    pods.append({'metadata': {'name': 'new', 'namespace': 'ns',
                              'uid': 'uid-new'},
                 'spec': {'nodeName': 'bench',
                          'initContainers': [{'name': 'init'}],
                          'containers': [{'name': 'c0'}]},
                 'status': {'phase': 'Pending'}})
    lock = hami.encode_node_lock(hami.NodeLock(
        datetime.datetime.now(datetime.UTC), 'ns', 'new'))

    def decide(_n: int) -> None:
        allocrecord.check(record, capacity)
        pick = sharedpick.decide(record, pods, served, lock, 'uid-new',
                                 [gpu.device_id(63)], 'amd.com/gpu',
                                 'bench')
        assert (pick.grants.name, pick.index) == ('new', 1)
        sharedalloc.container_allocation(pick.grants, pick.index, units)

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
                        'node, at most 256 (default 64)')
    parser.add_argument('--decisions', type=int, default=200,
                        help='record-driven Allocate decisions (default '
                        '200)')
    parser.add_argument('--allocs', type=int, default=200,
                        help='gRPC Allocate round trips (default 200)')
    args = parser.parse_args(argv)
    if min(args.reviews, args.decisions, args.allocs) < 1 or \
            not 0 <= args.pods <= 256:
        parser.error('counts must be positive and --pods at most 256')
    print('python %s, %d CPUs' % (sys.version.split()[0], os.cpu_count()))
    bench_webhook(args.reviews)
    bench_shared(args.pods, args.decisions)
    bench_grpc(args.allocs)
    return 0


if __name__ == '__main__':
    sys.exit(main())
