"""Benchmark: ``/filter`` and ``/bind`` end to end, through the API server
stand-in.

Three processes, as in a cluster: the API server stand-in
(``tests/functional/fixtures/apiserver.py``, in a child process), the
extender (``amdgpu-virt k8s scheduler``, its own process, default
configuration) and this one, which plays kube-scheduler: one scheduling
thread sends ``/filter`` for each pod in turn, with every node's name
(``nodeCacheCapable``), and hands the chosen node to ``--binders``
binding threads that send ``/bind`` (kube-scheduler binds asynchronously,
one goroutine per pod). After each bind, the binding thread also does what
the device plugin does once kubelet has allocated the pod: the pod's
``hami.io/bind-phase: success`` and the node lock released (those calls
are counted apart: they are the node's, not the extender's).

``--nodes`` nodes of 8 MI300X GPUs (host 96 cores, 1 TiB), ``--pods``
pods asking a share of one GPU (seeded sizes, 1 or 2 cores), all created
before the clock starts, once the extender runs (its pod watch shows
them, as in a running cluster; ``--before-start``: before it starts, so
that only its first list shows them).

Prints: pods placed per second (first ``/filter`` to last bind), the
latency of ``/filter`` and ``/bind`` (p50, p99), the extender's API calls
per pod by kind (from the stand-in's request log, the node's calls left
out), writes per pod, CPU time per pod of the extender, the stand-in and
this driver (``psutil``), and the extender's own split (decision, filter
and bind handling, from its ``/metrics``). ``--profile`` profiles the
stand-in's request handling (``cProfile`` on each handler thread's CPU
time) and prints its top functions; ``--py-spy`` samples the extender
process with ``py-spy`` (when installed: not a project dependency) while
the pods are placed, counting only samples holding the interpreter lock
(its CPU), and prints where they fall.

Usage::

    python bench/extender_e2e.py [--nodes 40] [--pods 1000]
        [--binders 16] [--seed 1] [--before-start] [--profile]
        [--py-spy]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import psutil  # noqa: E402
from kubernetes import client  # noqa: E402

import _timing  # noqa: E402
from amdgpu_virt.k8s.record import nodelock  # noqa: E402
from amdgpu_virt.sharing import hami  # noqa: E402
from tests.functional.fixtures import apiserver  # noqa: E402
from tests.functional.fixtures import extenderproc  # noqa: E402
from tests.functional.k8s import cluster as fcluster  # noqa: E402

NAMESPACE = 'bench'
SCHEDULER = 'amdgpu-virt-scheduler'
MI300X = dict(count=10, devmem=196608, devcore=304,
              type='AMD Instinct MI300X', health=True, devicevendor='amd')


# --- the stand-in, in a process of its own ---------------------------------

def _standin(conn: Any, profile: bool) -> None:
    """Serve the stand-in; answer 'stats', 'profile' and 'stop' on
    ``conn``."""
    profiles: list[cProfile.Profile] = []
    if profile:
        handle = apiserver._Handler.handle

        def profiled(self: Any) -> None:
            # CPU time of the handler thread, not its waits
            profiler = cProfile.Profile(time.thread_time)
            try:
                profiler.runcall(handle, self)
            finally:
                profiles.append(profiler)

        apiserver._Handler.handle = profiled  # type: ignore[method-assign]
    server = apiserver.ApiServer(history=1000000).start()
    conn.send(server.url)
    me = psutil.Process()
    while True:
        command = conn.recv()
        if command == 'stats':
            cpu = me.cpu_times()
            conn.send((cpu.user + cpu.system, server.requests))
        elif command == 'profile':
            out = io.StringIO()
            if profiles:
                stats = pstats.Stats(profiles[0], stream=out)
                for other in profiles[1:]:
                    stats.add(other)
                stats.sort_stats('tottime').print_stats(16)
            conn.send(out.getvalue())
        else:
            server.stop()
            conn.send('stopped')
            return


def _kind(line: str) -> str:
    """``METHOD resource`` of a logged request (``watch`` for watches)."""
    method, _sep, path = line.partition(' ')
    if 'watch=' in path:
        return 'watch'
    path = path.split('?')[0]
    parts = path.strip('/').split('/')
    if 'binding' in parts:
        return '%s binding' % method
    for resource in ('configmaps', 'pods', 'nodes', 'leases', 'events'):
        if resource in parts:
            return '%s %s' % (method, resource)
    return '%s %s' % (method, path)


# --- the cluster -------------------------------------------------------------

def _node(name: str) -> dict[str, Any]:
    devices = [hami.DeviceInfo(id='%s-gpu%d' % (name, g), index=g,
                               numa=g // 4, **MI300X) for g in range(8)]
    return {'metadata': {'name': name, 'annotations': {
        hami.NODE_REGISTER: hami.encode_node_register(devices)}},
        'status': {'allocatable': {'cpu': '96', 'memory': '1Ti'},
                   'capacity': {'amd.com/gpu': '80'}}}


def _pod(rng: random.Random, number: int) -> dict[str, Any]:
    percent = rng.choice((10, 20, 25, 32, 47, 50))
    cpu = rng.randint(1, 2)
    return {'metadata': {'name': 'p%05d' % number, 'namespace': NAMESPACE},
            'spec': {'schedulerName': SCHEDULER, 'containers': [{
                'name': 'main', 'image': 'x', 'resources': {
                    'limits': {'amd.com/gpu': '1',
                               'amd.com/gpucores': str(percent),
                               'amd.com/gpumem': str(rng.choice(
                                   (4096, 16384)))},
                    'requests': {'cpu': str(cpu),
                                 'memory': '%dGi' % (4 * cpu)}}}]}}


def _metrics(http: fcluster.HttpJson) -> dict[str, float]:
    _status, body = http.request('GET', '/metrics')
    found = {}
    for line in body.decode().splitlines():
        match = re.match(r'^(amdgpu_virt_extender_\w+_seconds_(sum|count))'
                         r'\s+([0-9.e+-]+)$', line)
        if match:
            found[match.group(1)] = float(match.group(3))
    return found


# --- kube-scheduler's part -------------------------------------------------

class Driver:
    """Filters pods one after the other, binds on ``binders`` threads,
    and does the device plugin's part after each bind."""

    def __init__(self, http_address: tuple[str, int], api: Any,
                 nodes: list[str], binders: int) -> None:
        self.address = http_address
        self.api = api
        self.nodes = nodes
        self.binders = binders
        self.locker = nodelock.NodeLocker(api)
        self.filter_clock = _timing.DecisionClock()
        self.bind_clock = _timing.DecisionClock()
        self.placed = self.refused = self.failed = 0
        self.node_calls = 0
        self._lock = threading.Lock()
        self._work: queue.Queue[tuple[dict[str, Any], str] | None] = \
            queue.Queue()

    def _bind_worker(self) -> None:
        http = fcluster.HttpJson(*self.address)
        try:
            while True:
                item = self._work.get()
                if item is None:
                    return
                pod, node = item
                meta = pod['metadata']
                started = time.perf_counter()
                answer = http.post('/bind', {
                    'PodName': meta['name'], 'PodNamespace': NAMESPACE,
                    'PodUID': meta['uid'], 'Node': node})
                with self._lock:
                    self.bind_clock.wall.append(time.perf_counter() -
                                                started)
                if answer.get('Error'):
                    with self._lock:
                        self.failed += 1
                    print('bind %s: %s' % (meta['name'], answer['Error']),
                          file=sys.stderr)
                    continue
                # the device plugin, once kubelet allocated the pod (the
                # answer read, so that the connection is reused)
                _answer = self.api.patch_namespaced_pod(
                    meta['name'], NAMESPACE, {'metadata': {'annotations': {
                        hami.BIND_PHASE: hami.BindPhase.SUCCESS.value}}},
                    _content_type='application/merge-patch+json',
                    _preload_content=False).data
                self.locker.release(node, NAMESPACE, meta['name'])
                with self._lock:
                    self.placed += 1
                    # the pod patch, and the node's GET and PATCH
                    self.node_calls += 3
        finally:
            http.close()

    def run(self, pods: list[dict[str, Any]]) -> float:
        """:returns: wall seconds from the first filter to the last bind."""
        threads = [threading.Thread(target=self._bind_worker, daemon=True)
                   for _n in range(self.binders)]
        for thread in threads:
            thread.start()
        http = fcluster.HttpJson(*self.address)
        started = time.perf_counter()
        for pod in pods:
            began = time.perf_counter()
            answer = http.post('/filter', {'Pod': pod, 'Nodes': None,
                                           'NodeNames': self.nodes})
            self.filter_clock.wall.append(time.perf_counter() - began)
            if answer.get('NodeNames'):
                self._work.put((pod, answer['NodeNames'][0]))
            else:
                self.refused += 1
        for _thread in threads:
            self._work.put(None)
        for thread in threads:
            thread.join()
        http.close()
        return time.perf_counter() - started


def _spy_summary(path: str, top: int = 16) -> str:
    """Where the samples of a ``py-spy --format raw`` file fall: own
    samples per function, and inclusive ones per project function."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as stream:
        for line in stream:
            stack, _sep, count = line.rstrip().rpartition(' ')
            if not count.isdigit():
                continue
            frames = stack.split(';')
            total += int(count)
            own[frames[-1]] += int(count)
            for frame in set(frames):
                if 'amdgpu_virt/' in frame:
                    inclusive[frame] += int(count)
    lines = ['%d samples holding the interpreter lock' % total, 'own:']
    lines += ['  %5.1f %%  %s' % (100 * n / max(1, total), f[:110])
              for f, n in own.most_common(top)]
    lines.append('inclusive, project functions:')
    lines += ['  %5.1f %%  %s' % (100 * n / max(1, total), f[:110])
              for f, n in inclusive.most_common(top)]
    return '\n'.join(lines)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--nodes', type=int, default=40)
    parser.add_argument('--pods', type=int, default=1000)
    parser.add_argument('--binders', type=int, default=16)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--before-start', action='store_true',
                        help='create the pods before the extender starts '
                        '(its list shows them, not its watch)')
    parser.add_argument('--profile', action='store_true',
                        help='profile the stand-in\'s request handling')
    parser.add_argument('--py-spy', action='store_true',
                        help='sample the extender with py-spy (if installed)')
    args = parser.parse_args(argv)
    context = multiprocessing.get_context('fork')
    parent, child = context.Pipe()
    standin = context.Process(target=_standin, args=(child, args.profile),
                              daemon=True)
    standin.start()
    url = parent.recv()
    config = client.Configuration(host=url)
    config.connection_pool_maxsize = args.binders + 4
    api_client = client.ApiClient(config)
    api = client.CoreV1Api(api_client)
    for name in (NAMESPACE, 'amdgpu-virt'):
        api.create_namespace({'metadata': {'name': name}})
    names = ['node-%03d' % n for n in range(args.nodes)]
    for name in names:
        api.create_node(_node(name))
    rng = random.Random(args.seed)

    def create() -> list[dict[str, Any]]:
        return [json.loads(api.create_namespaced_pod(
            NAMESPACE, _pod(rng, n), _preload_content=False).data)
            for n in range(args.pods)]

    pods = create() if args.before_start else []
    spied = ''
    with tempfile.TemporaryDirectory() as directory:
        ext = extenderproc.ExtenderProcess(url, directory, 'extender')
        ext.setUp()
        try:
            assert ext.process is not None and ext.address is not None
            if not args.before_start:
                pods = create()
                # the extender's pod watch shows them, as in a running
                # cluster
                time.sleep(1.0)
            extender = psutil.Process(ext.process.pid)
            me = psutil.Process()
            http = fcluster.HttpJson(*ext.address)
            before = _metrics(http)
            parent.send('stats')
            standin_cpu, log = parent.recv()
            logged = len(log)
            cpu = (_cpu(extender), _cpu(me))
            driver = Driver(ext.address, api, names, args.binders)
            spy = None
            spy_file = os.path.join(directory, 'extender.spy')
            if args.py_spy and shutil.which('py-spy'):
                spy = subprocess.Popen(
                    ['py-spy', 'record', '--pid', str(extender.pid), '--gil',
                     '--rate', '200', '--format', 'raw', '--nonblocking',
                     '-o', spy_file], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
                time.sleep(1)
            wall = driver.run(pods)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
                spied = _spy_summary(spy_file) if os.path.exists(
                    spy_file) else 'py-spy wrote nothing'
            parent.send('stats')
            standin_after, log = parent.recv()
            cpu_after = (_cpu(extender), _cpu(me))
            after = _metrics(http)
            http.close()
        finally:
            ext.cleanUp()
    kinds = collections.Counter(_kind(line) for line in log[logged:])
    # the device plugin's part, done by the driver
    kinds['PATCH pods'] -= driver.placed
    kinds['GET nodes'] -= driver.placed
    kinds['PATCH nodes'] -= driver.placed
    pods_done = max(1, driver.placed)
    print('%d nodes x 8 GPUs, %d pods, %d binding threads, seed %d' % (
        args.nodes, args.pods, args.binders, args.seed))
    print('placed %d, refused %d, bind failed %d in %.2f s: %.1f pods/s' % (
        driver.placed, driver.refused, driver.failed, wall,
        driver.placed / wall))
    for label, clock in (('/filter', driver.filter_clock),
                         ('/bind', driver.bind_clock)):
        print('%-8s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms' % (
            label, 1000 * _timing.percentile(clock.wall, 0.5),
            1000 * _timing.percentile(clock.wall, 0.99),
            1000 * max(clock.wall, default=0)))
    print('API calls per pod by the extender (the node\'s %d left out):'
          % driver.node_calls)
    writes = 0
    for kind, count in sorted(kinds.items()):
        if count > 0:
            print('  %-18s %6.2f' % (kind, count / pods_done))
            if not kind.startswith(('GET', 'watch')):
                writes += count
    print('  %-18s %6.2f' % ('writes', writes / pods_done))
    print('CPU ms per pod: extender %.2f, API server stand-in %.2f, this '
          'driver %.2f (wall %.2f ms per pod; %d cores, load %s)' % (
              1000 * (cpu_after[0] - cpu[0]) / pods_done,
              1000 * (standin_after - standin_cpu) / pods_done,
              1000 * (cpu_after[1] - cpu[1]) / pods_done,
              1000 * wall / pods_done, os.cpu_count() or 0,
              ' '.join('%.1f' % x for x in os.getloadavg())))
    split = []
    for name in ('decide', 'filter', 'bind'):
        key = 'amdgpu_virt_extender_%s_seconds_sum' % name
        if key in after:
            split.append('%s %.2f' % (name, 1000 * (
                after[key] - before.get(key, 0.0)) / pods_done))
    print('extender wall ms per pod inside its handlers: %s' % ', '.join(
        split))
    if args.py_spy:
        print('\nThe extender, sampled by py-spy:')
        print(spied or 'py-spy is not installed')
    if args.profile:
        parent.send('profile')
        print('\nThe stand-in\'s request handling, by own time:')
        print(parent.recv())
    parent.send('stop')
    parent.recv()
    standin.join(timeout=10)
    api_client.close()
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
