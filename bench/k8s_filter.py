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

Near full (``--near-full 90,99``): the same nodes, their GPUs' CUs filled
to 90 % and 99 % by live pods (a fifth of the GPUs taken whole, the rest
shared by up to 9 pods each), then ``--requests`` decisions timed on the
cache (the extender's default: the fragmentation score for binpack pods,
HAMi's order for spread ones) and, on the same state, a plain first-fit
over per-GPU free counts (the cheapest scan there is; the ratio says how
far the cache is from it). Also the time to build the cache from the
list, wall and CPU: nodes and pods in pages of 500 as the API serves them
(encoded before timing; in memory, through the extender's own watchers,
page decoders and collector pause), and the first views;
``--build-only`` stops there.

Usage::

    python bench/k8s_filter.py [--nodes 100,1000,5000] [--requests 300]
                               [--http-requests 100] [--fill 2] [--seed 1]
                               [--near-full 90,99] [--build-only]
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

import _timing

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.scheduler import service as extender
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import watching
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

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


def _node_objs(names: list[str]) -> list[dict[str, Any]]:
    objs = []
    for name in names:
        devices = [hami.DeviceInfo(id='%s-gpu%d' % (name, g), index=g,
                                   numa=g // 4, **MI300X)
                   for g in range(GPUS)]
        objs.append({'metadata': {'name': name, 'annotations': {
            hami.NODE_REGISTER: hami.encode_node_register(devices)}}})
    return objs


def filled_pods(names: list[str], target: float, rng: random.Random
                ) -> list[dict[str, Any]]:
    """Live pods using ``target`` of every GPU's CUs (a fifth of the GPUs
    whole, the others shared by up to 9 pods)."""
    devcore, devmem = MI300X['devcore'], MI300X['devmem']
    pods = []
    for name in names:
        for g in range(GPUS):
            uuid = '%s-gpu%d' % (name, g)
            if rng.random() < 0.2:
                sizes = [(devcore, devmem)]
            else:
                sizes = []
                left = int(target * devcore)
                while left > 0 and len(sizes) < 9:
                    cus = min(left, hami.percent_to_cus(rng.choice(
                        (5, 10, 20, 25, 33, 50)), devcore))
                    if len(sizes) == 8:
                        cus = left
                    sizes.append((cus, max(1024, devmem * cus // devcore
                                           * 3 // 4)))
                    left -= cus
            for number, (cus, mem) in enumerate(sizes):
                value = hami.encode_pod_devices(((hami.ContainerDevice(
                    uuid, MI300X['type'], mem, cus),),))
                pods.append({'metadata': {
                    'name': '%s-%d' % (uuid, number), 'namespace': 'live',
                    'resourceVersion': '2', 'annotations': {
                        hami.DEVICES_ALLOCATED: value,
                        hami.VGPU_NODE: name}},
                    'spec': {'nodeName': name},
                    'status': {'phase': 'Running'}})
    return pods


class _Pages:
    """A list verb serving ``items`` in pages, as JSON (in memory)."""

    class _Response:
        def __init__(self, data: bytes) -> None:
            self.data = data

    def __init__(self, items: list[dict[str, Any]], kind: str,
                 limit: int = 0) -> None:
        self.items = items
        self.kind = kind
        self.limit = limit
        self.names: list[str] = []
        #: pages of ``limit`` encoded before timing (the server's work)
        self.encoded = {start: self._encode(start, limit) for start in
                        range(0, len(items), limit)} if limit else {}

    def _encode(self, start: int, limit: int) -> bytes:
        meta: dict[str, Any] = {'resourceVersion': '5'}
        if start + limit < len(self.items):
            meta['continue'] = str(start + limit)
        return json.dumps({
            'kind': self.kind, 'metadata': meta,
            'items': self.items[start:start + limit]}).encode()

    def __call__(self, **kwargs: Any) -> Any:
        start = int(kwargs.get('_continue') or 0)
        limit = kwargs.get('limit') or len(self.items)
        data = self.encoded.get(start) if limit == self.limit else None
        return self._Response(data or self._encode(start, limit))


class _ListApi:
    """The two list verbs the extender's watchers call, in memory."""

    def __init__(self, nodes: _Pages, pods: _Pages) -> None:
        self.list_node = nodes
        self.list_pod_for_all_namespaces = pods


def build_from_pages(cache: schedcache.ClusterCache, nodes: _Pages,
                     pods: _Pages) -> dict[str, float]:
    """Fill ``cache`` through the extender's own watchers (their list
    code, page decoders and the collector paused as the extender service
    asks), then its first views (already built by the list, unless the
    views are lazy); wall and CPU seconds of each step."""
    api = _ListApi(nodes, pods)
    figures: dict[str, float] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    for watcher in watching.watchers(cache, api, pause_collector=True):
        watcher._list()
    figures['list'] = time.perf_counter() - wall
    figures['list cpu'] = time.process_time() - cpu
    cache.views(nodes.names)
    figures['total'] = time.perf_counter() - wall
    figures['total cpu'] = time.process_time() - cpu
    return figures


def near_full(size: int, target: float, requests: int,
              rng: random.Random, build_only: bool = False) -> None:
    names = ['node-%05d' % n for n in range(size)]
    nodes = _node_objs(names)
    pods = filled_pods(names, target, rng)
    cache = schedcache.ClusterCache(mix=packing.Mix())
    limit = 500   # the watchers' page size
    node_pages = _Pages(nodes, 'NodeList', limit)
    node_pages.names = names
    pod_pages = _Pages(pods, 'PodList', limit)
    del nodes, pods
    figures = build_from_pages(cache, node_pages, pod_pages)
    del node_pages, pod_pages
    gc.collect()
    gc.freeze()
    used = sum(g.used_cores for v in cache.views(names)[0] for g in v.gpus)
    print('%5d nodes x %d GPUs filled to %d %% (%.1f %% of CUs used, %d '
          'live pods): cache from pages of 500 in %.2f s wall, %.2f s CPU '
          '(list %.2f s wall, %.2f s CPU)' % (
              size, GPUS, round(target * 100),
              100 * used / (size * GPUS * MI300X['devcore']),
              cache.pod_count(), figures['total'], figures['total cpu'],
              figures['list'], figures['list cpu']), flush=True)
    if build_only:
        gc.unfreeze()
        return
    time_decisions(cache, names, requests, rng)


def time_decisions(cache: schedcache.ClusterCache, names: list[str],
                   requests: int, rng: random.Random) -> None:
    """``requests`` decisions on the cache and, on the same state, a plain
    first-fit scan; prints wall and CPU time per decision, the collector
    apart (what was loaded is frozen out of it, as the service does)."""
    # the same state for first-fit: per GPU (free CUs, free MiB, slots)
    flat = [(v.name, [(g.usable_cores, g.free_mem, g.info.count -
                       g.used_slots) for g in v.gpus])
            for v in cache.views(names)[0]]
    reqs = [fit.pod_request(_pod(rng, 'q%d' % n)) for n in range(requests)]
    ours = _timing.DecisionClock()
    first = _timing.DecisionClock()
    placed = 0
    try:
        for number, request in enumerate(reqs):
            want = request.containers[0]
            cus = MI300X['devcore'] if want.exclusive else \
                hami.percent_to_cus(want.percent, MI300X['devcore'])
            mem = want.mem or MI300X['devmem']
            first.start()
            for _name, gpus in flat:
                if sum(1 for c, m, s in gpus if c >= cus and m >= mem
                       and s) >= want.nums:
                    break
            first.stop()
            ours.start()
            decision = cache.decide_and_reserve('bench/q%d' % number,
                                                request, names)
            ours.stop()
            placed += decision.fit is not None
    finally:
        ours.close()
        first.close()
        gc.unfreeze()
    print('  per decision, ms (%s)' % _timing.LEGEND)
    print('  ' + _timing.header())
    for label, clock in (('cache', ours), ('first-fit', first)):
        print('  ' + _timing.row(label, clock))
    print('  cache / first-fit: %s; %d of %d placed'
          % (_timing.ratio(ours, first), placed, requests), flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--nodes', default='100,1000,5000',
                        help='comma-separated cluster sizes')
    parser.add_argument('--requests', type=int, default=300,
                        help='decisions timed on the cache per size')
    parser.add_argument('--http-requests', type=int, default=100,
                        help='POST /filter round trips per size (0: none)')
    parser.add_argument('--fill', type=int, default=2,
                        help='live pods per node before timing (negative: '
                             'only the near-full runs)')
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--near-full', default='90,99',
                        help='comma-separated fill percentages for the '
                             'near-full runs (empty: none)')
    parser.add_argument('--build-only', action='store_true',
                        help='near full: only build the cache (no '
                             'decisions)')
    args = parser.parse_args(argv)
    for size in (int(s) for s in args.nodes.split(',')):
        for target in (int(t) for t in args.near_full.split(',') if t):
            near_full(size, target / 100, args.requests,
                      random.Random(args.seed), args.build_only)
    if args.near_full and args.fill < 0:
        return 0
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
