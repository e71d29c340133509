"""Benchmark: the scheduler extender's ``/filter`` decision latency.

A cluster of ``N`` nodes with 8 MI300X GPUs each (304 CUs, 192 GiB, 10
slots) is loaded into the extender's cache, with live pods already using
part of it (``--fill`` pods per node on average). Pods of random sizes
(seeded; half binpack, half spread) are then filtered one after the other
against every node, as kube-scheduler does with ``nodeCacheCapable``;
every decision is reserved in the cache, so the cluster fills up as it
would. As the extender does after a list, what was loaded is frozen out of
the cyclic garbage collector, and the node views are built before timing.

Two figures per size:

* ``cache``: the decision on the cache (``ClusterCache.decide_and_reserve``);
* ``http``: the whole ``POST /filter`` round trip over loopback HTTP with
  all node names in the request (JSON both ways, the decision, and the
  pod annotation write, stubbed here: no API server).

Prints p50 and p99. Goal at 5,000 nodes: p50 < 5 ms, p99 < 20 ms.

Usage::

    python bench/k8s_filter.py [--nodes 100,1000,5000] [--requests 300]
                               [--http-requests 100] [--fill 2] [--seed 1]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import random
import sys
import threading
import time
from typing import Any

from amdgpu_virt.k8s import extender
from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s import schedcache
from amdgpu_virt.sharing import hami

GPUS = 8
MI300X = dict(count=10, devmem=196608, devcore=304,
              type='AMD Instinct MI300X', health=True, devicevendor='amd')


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1,
                       int(round(fraction * (len(ordered) - 1))))]


def _limits(rng: random.Random) -> dict[str, str]:
    percent = rng.choice((5, 10, 20, 25, 33, 50, 100))
    limits = {'amd.com/gpu': str(1 if rng.random() < 0.85 else 2),
              'amd.com/gpucores': str(percent)}
    if percent < 100 or rng.random() < 0.5:
        limits['amd.com/gpumem'] = str(rng.choice((1024, 8192, 32768)))
    return limits


def _pod(rng: random.Random, name: str) -> dict[str, Any]:
    annotations = {}
    if rng.random() < 0.5:
        annotations[hami.NODE_SCHEDULER_POLICY] = 'spread'
    return {'metadata': {'name': name, 'namespace': 'bench',
                         'annotations': annotations},
            'spec': {'containers': [{'name': 'main', 'resources': {
                'limits': _limits(rng)}}]}}


def build_cache(nodes: int, fill: int, rng: random.Random
                ) -> tuple[schedcache.ClusterCache, list[str]]:
    cache = schedcache.ClusterCache()
    names = ['node-%05d' % n for n in range(nodes)]
    node_objs = []
    for name in names:
        devices = [hami.DeviceInfo(id='%s-gpu%d' % (name, g), index=g,
                                   numa=g // 4, **MI300X)
                   for g in range(GPUS)]
        node_objs.append({'metadata': {'name': name, 'annotations': {
            hami.NODE_REGISTER: hami.encode_node_register(devices)}}})
    cache.replace_nodes(node_objs)
    cache.replace_pods([], None)
    # live pods: placed by the extender's own decision, then seen "back"
    # as pods carrying the annotations
    pod_objs = []
    for number in range(nodes * fill):
        pod = _pod(rng, 'live-%d' % number)
        target = rng.choice(names)
        decision = cache.decide_and_reserve(
            'bench/live-%d' % number, fit.pod_request(pod), [target])
        if decision.fit is None:
            continue
        value = hami.encode_pod_devices(decision.fit.containers)
        pod['metadata']['annotations'].update({
            hami.DEVICES_ALLOCATED: value, hami.VGPU_NODE: target})
        pod['metadata']['resourceVersion'] = '1'
        pod['spec']['nodeName'] = target
        pod_objs.append(pod)
    cache.replace_pods(pod_objs, 2)
    return cache, names


class _StubApi:
    """The annotation write of /filter, without an API server."""

    class _Response:
        data = b'{"metadata": {"resourceVersion": "3"}}'

    def patch_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        return self._Response()


def bench_cache(cache: schedcache.ClusterCache, names: list[str],
                requests: int, rng: random.Random) -> list[float]:
    samples = []
    for number in range(requests):
        request = fit.pod_request(_pod(rng, 'p%d' % number))
        start = time.perf_counter()
        cache.decide_and_reserve('bench/p%d' % number, request, names)
        samples.append(time.perf_counter() - start)
    return samples


def bench_http(cache: schedcache.ClusterCache, names: list[str],
               requests: int, rng: random.Random) -> list[float]:
    cache.nodes_synced.set()
    cache.pods_synced.set()
    service = extender.Extender(cache, _StubApi())
    server = extender.make_server(service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=60)
    samples = []
    try:
        for number in range(requests):
            body = json.dumps({'Pod': _pod(rng, 'h%d' % number),
                               'Nodes': None, 'NodeNames': names}).encode()
            start = time.perf_counter()
            conn.request('POST', '/filter', body=body,
                         headers={'Content-Type': 'application/json'})
            answer = json.loads(conn.getresponse().read())
            samples.append(time.perf_counter() - start)
            if answer['Error']:
                raise SystemExit('filter failed: %s' % answer['Error'])
    finally:
        conn.close()
        server.shutdown()
        server.server_close()
    return samples


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--nodes', default='100,1000,5000',
                        help='comma-separated cluster sizes')
    parser.add_argument('--requests', type=int, default=300,
                        help='decisions timed on the cache per size')
    parser.add_argument('--http-requests', type=int, default=100,
                        help='POST /filter round trips per size (0: none)')
    parser.add_argument('--fill', type=int, default=2,
                        help='live pods per node before timing')
    parser.add_argument('--seed', type=int, default=1)
    args = parser.parse_args(argv)
    for size in (int(s) for s in args.nodes.split(',')):
        rng = random.Random(args.seed)
        started = time.perf_counter()
        cache, names = build_cache(size, args.fill, rng)
        # as the extender does after a list; views built before timing
        gc.collect()
        gc.freeze()
        cache.views(names)
        print('%5d nodes x %d GPUs, %d live pods (built in %.1f s)' % (
            size, GPUS, cache.pod_count(), time.perf_counter() - started),
            flush=True)
        for label, func, runs in (('cache', bench_cache, args.requests),
                                  ('http', bench_http, args.http_requests)):
            if not runs:
                continue
            samples = func(cache, names, runs, rng)
            print('  %-6s runs=%-5d p50=%7.2f ms  p99=%7.2f ms  max=%7.2f '
                  'ms' % (label, runs, _percentile(samples, 0.5) * 1e3,
                          _percentile(samples, 0.99) * 1e3,
                          max(samples) * 1e3), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
