"""Benchmark: the webhook and the extender under hostile clients.

Legitimate clients ask the real servers as fast as they answer, for
``--seconds`` each time, first alone, then beside each attack; printed:
requests per second, median and 99th percentile, and the failures
(anything but a 200 with the expected answer). The clients, the attackers
and the slow connections each run in a process of their own, so that the
server (alone in this one) is what is measured.

Webhook (``webhook.make_server`` with its watch of the nodes, its Event
writer and namespace labels, on the API server stand-in; a legitimate
review is a pod of two containers stating their needs):

* ``hostile pods``: ``--attackers`` clients post, again and again, a pod
  of 500 containers each stating its needs (46 KB), one of 10,000
  containers asking for CU slices (2.4 MB) and one of 10 deeply nested
  statements;
* ``hostile node``: one node registers 10,000 GPUs of distinct shapes
  (1.2 MB) and one 2,200 (within the API's 256 KiB);
* ``slow clients``: 1,100 connections from 16 addresses, each with one
  byte of a request sent, reopened as soon as the server closes one.

Extender (``extender.Service`` on the stand-in): ``/prioritize`` on its
port and ``/healthz`` (kubelet's probe) on its probe and metrics listener,
alone and beside the 1,100 slow connections on each.

Usage::

    python bench/hostile.py [--seconds 10] [--clients 4] [--attackers 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from kubernetes import client  # noqa: E402

from amdgpu_virt import conf as conf_pkg  # noqa: E402
from amdgpu_virt.k8s.admission import webhook  # noqa: E402
from amdgpu_virt.k8s.scheduler import service as extender  # noqa: E402
from tests.functional.fixtures import apiserver  # noqa: E402
from tests.functional.fixtures import hostilepods  # noqa: E402
from tests.functional.fixtures import slowclients  # noqa: E402

import _timing  # noqa: E402

FLOOD = 1100


class Ask:
    """One kind of request a client repeats on a kept-alive connection;
    :meth:`__call__` is one request: (status, seconds, expected answer)."""

    def __init__(self, address: tuple[str, int], method: str, path: str,
                 body: bytes | None, check: Callable[[bytes], bool]) -> None:
        self.address = address
        self.method = method
        self.path = path
        self.body = body
        self.check = check
        self._local = threading.local()

    def __call__(self) -> tuple[int, float, bool]:
        began = time.perf_counter()
        conn = getattr(self._local, 'conn', None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(
                *self.address, timeout=60)
        try:
            conn.request(self.method, self.path, body=self.body,
                         headers={'Content-Type': 'application/json'})
            response = conn.getresponse()
            data = response.read()
            status = response.status
        except OSError:
            conn.close()
            self._local.conn = None
            return 0, time.perf_counter() - began, False
        if response.will_close:
            conn.close()
            self._local.conn = None
        return status, time.perf_counter() - began, \
            status == 200 and self.check(data)


def _allowed(data: bytes) -> bool:
    return bool(json.loads(data)['response']['allowed'])


def _denied(data: bytes) -> bool:
    return not json.loads(data)['response']['allowed']


def _answered(data: bytes) -> bool:
    return True


CHECKS: dict[str, Callable[[bytes], bool]] = {
    'allowed': _allowed, 'denied': _denied, 'answered': _answered}
#: (address, method, path, body, name of the check of the answer)
Spec = tuple[tuple[str, int], str, str, bytes | None, str]
Run = tuple[int, float, bool]


def _clients(specs: list[Spec], threads: int, start: Any, go: Any,
             ready: Any, out: Any, seconds: float) -> None:
    """A process of clients: ``threads`` threads, each cycling through
    ``specs`` from ``start`` (once ``go`` is set) for ``seconds``."""
    asks = [Ask(address, method, path, body, CHECKS[check])
            for address, method, path, body, check in specs]
    runs: list[Run] = []
    ready.set()
    go.wait()
    stop = start.value + seconds
    while time.time() < start.value:
        time.sleep(0.001)

    def loop(number: int) -> None:
        while time.time() < stop:
            runs.append(asks[number % len(asks)]())
            number += 1

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for job in [pool.submit(loop, n) for n in range(threads)]:
            job.result()
    out.put(runs)


def _flood(address: tuple[str, int], start: Any, go: Any, ready: Any,
           out: Any, seconds: float) -> None:
    """A process holding :data:`FLOOD` one-byte connections from 16
    addresses for ``seconds`` from ``start``."""
    flood = slowclients.OneByteFlood(address, FLOOD, 16).start()
    ready.set()
    go.wait()
    time.sleep(max(start.value + seconds - time.time(), 0))
    flood.stop()
    out.put([])


def _measure(label: str, legit: Spec, clients: int, seconds: float,
             hostile: list[Spec] | None = None, attackers: int = 0,
             flood: tuple[str, int] | None = None) -> None:
    """Legitimate clients, and attackers or a flood, each in a process of
    its own (the server under test is alone in this one), all for the
    same ``seconds``; print the figures."""
    context = multiprocessing.get_context('spawn')
    start = context.Value('d', 0.0)
    go = context.Event()
    jobs = [(_clients, ([legit], clients)), ]
    if hostile:
        jobs.append((_clients, (hostile, attackers)))
    if flood is not None:
        jobs.append((_flood, (flood,)))
    processes = []
    for target, job_args in jobs:
        ready, out = context.Event(), context.Queue()
        process = context.Process(target=target, args=(
            *job_args, start, go, ready, out, seconds), daemon=True)
        process.start()
        processes.append((process, ready, out))
    for _process, ready, _out in processes:
        ready.wait(120)
    start.value = time.time() + 0.5
    go.set()
    results = [out.get(timeout=seconds + 300) for _p, _r, out in processes]
    for process, _ready, _out in processes:
        process.join(30)
    _print(label, results[0], seconds)
    if hostile:
        _print('  (the attackers)', results[1], seconds)


def _print(label: str, runs: list[tuple[int, float, bool]],
           seconds: float) -> None:
    times = [took for _status, took, _ok in runs]
    failed = sum(1 for _s, _t, ok in runs if not ok)
    print('%-38s %7.1f req/s  median %7.1f ms  p99 %8.1f ms  max %8.1f ms'
          '  failed %d of %d' % (
              label, len(runs) / seconds,
              statistics.median(times) * 1e3 if times else 0.0,
              _timing.percentile(times, 0.99) * 1e3,
              max(times, default=0.0) * 1e3, failed, len(runs)), flush=True)


def bench_webhook(args: argparse.Namespace) -> None:
    server = apiserver.ApiServer().start()
    try:
        config = client.Configuration(host=server.url)
        config.connection_pool_maxsize = 32
        api = client.CoreV1Api(client.ApiClient(config))
        hostilepods.seed(api)
        hook, models, _events = hostilepods.webhook(
            api, webhook.WebhookPolicy())
        hook.start()
        address = hook.server_address[:2]
        legit: Spec = (address, 'POST', '/webhook', hostilepods.review_body(
            hostilepods.stated_pod('ok', 2)), 'allowed')
        print('webhook (%d legitimate clients, %g s each)' % (
            args.clients, args.seconds))
        _measure('  alone', legit, args.clients, args.seconds)
        hostile: list[Spec] = [
            (address, 'POST', '/webhook', hostilepods.review_body(pod),
             'denied')
            for pod in (hostilepods.stated_pod('big', 500, distinct=True),
                        hostilepods.raw_pod('raw', 10000),
                        hostilepods.stated_pod('deep', 10, '[' * 250 +
                                               ']' * 250))]
        _measure('  beside %d hostile-pod clients' % args.attackers, legit,
                 args.clients, args.seconds, hostile, args.attackers)
        for node, count in (('liar', 10000), ('sly', 2200)):
            hostilepods.register(api, node, [hostilepods.gpu(n, 1024 + n)
                                             for n in range(count)])
        while models.refused != {'liar', 'sly'}:
            time.sleep(0.05)
        _measure('  beside a hostile node', legit, args.clients,
                 args.seconds)
        _measure('  beside 1,100 slow conns', legit, args.clients,
                 args.seconds, flood=address)
        print('  connections refused %d, evicted %d, too slow %d' % (
            hook.refused, hook.evicted, hook.too_slow))
        hook.shutdown()
        hook.server_close()
    finally:
        server.stop()


def bench_extender(args: argparse.Namespace) -> None:
    server = apiserver.ApiServer().start()
    try:
        config = client.Configuration(host=server.url)
        api = client.CoreV1Api(client.ApiClient(config))
        conf = conf_pkg.new_conf()
        conf.set_override('port', 0, group='scheduler')
        conf.set_override('metrics_port', 0, group='scheduler')
        service = extender.Service(conf, api).start()
        metrics = service.metrics_address
        assert metrics is not None
        body = json.dumps({'Pod': {'metadata': {
            'name': 'p', 'namespace': 'team'}, 'spec': {'containers': []}},
            'NodeNames': ['n%d' % n for n in range(16)]}).encode()
        asks: list[tuple[str, Spec]] = [
            ('/prioritize', (service.address, 'POST', '/prioritize', body,
                             'answered')),
            ('/healthz (probes)', (metrics, 'GET', '/healthz', None,
                                   'answered'))]
        print('extender (%d legitimate clients, %g s each)' % (
            args.clients, args.seconds))
        for label, spec in asks:
            _measure('  %s alone' % label, spec, args.clients, args.seconds)
            _measure('  %s beside 1,100 slow' % label, spec, args.clients,
                     args.seconds, flood=spec[0])
        service.stop()
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--seconds', type=float, default=10.0,
                        help='seconds per measurement (default 10)')
    parser.add_argument('--clients', type=int, default=4,
                        help='legitimate clients at once (default 4)')
    parser.add_argument('--attackers', type=int, default=8,
                        help='clients posting hostile pods at once '
                             '(default 8, the webhook\'s workers)')
    args = parser.parse_args(argv)
    bench_webhook(args)
    bench_extender(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
