"""Benchmark: the webhook and the extender under hostile clients.

Legitimate clients ask the real servers as fast as they answer, for
``--seconds`` each time, first alone, then beside each attack; printed:
requests per second, median and 99th percentile, and the failures
(anything but a 200 with the expected answer).

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
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable

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


def _measure(label: str, legit: Ask, clients: int, seconds: float,
             hostile: list[Ask] | None = None, attackers: int = 0) -> None:
    """Run ``clients`` legitimate clients (and ``attackers`` hostile ones
    cycling through ``hostile``) for ``seconds``; print the figures."""
    stop = time.monotonic() + seconds
    legit_runs: list[tuple[int, float, bool]] = []
    hostile_runs: list[tuple[int, float, bool]] = []

    def loop(ask: Callable[[], tuple[int, float, bool]],
             into: list[tuple[int, float, bool]]) -> None:
        while time.monotonic() < stop:
            into.append(ask())

    def attacker(number: int) -> None:
        asks = hostile or []
        n = number
        while time.monotonic() < stop:
            hostile_runs.append(asks[n % len(asks)]())
            n += 1

    with concurrent.futures.ThreadPoolExecutor(clients + attackers) as pool:
        jobs = [pool.submit(loop, legit, legit_runs)
                for _ in range(clients)]
        jobs += [pool.submit(attacker, n) for n in range(attackers)]
        for job in jobs:
            job.result()
    _print(label, legit_runs, seconds)
    if hostile_runs:
        _print('  (the attackers)', hostile_runs, seconds)


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
        legit = Ask(address, 'POST', '/webhook', hostilepods.review_body(
            hostilepods.stated_pod('ok', 2)), _allowed)
        legit()
        print('webhook (%d legitimate clients, %g s each)' % (
            args.clients, args.seconds))
        _measure('  alone', legit, args.clients, args.seconds)
        hostile = [Ask(address, 'POST', '/webhook',
                       hostilepods.review_body(pod), _denied)
                   for pod in (hostilepods.stated_pod('big', 500,
                                                      distinct=True),
                               hostilepods.raw_pod('raw', 10000),
                               hostilepods.stated_pod('deep', 10, '[' * 250 +
                                                      ']' * 250))]
        _measure('  beside hostile pods', legit, args.clients,
                 args.seconds, hostile, args.attackers)
        for node, count in (('liar', 10000), ('sly', 2200)):
            hostilepods.register(api, node, [hostilepods.gpu(n, 1024 + n)
                                             for n in range(count)])
        while models.refused != {'liar', 'sly'}:
            time.sleep(0.05)
        _measure('  beside a hostile node', legit, args.clients,
                 args.seconds)
        flood = slowclients.OneByteFlood(address, FLOOD, 16).start()
        try:
            _measure('  beside 1,100 slow conns', legit, args.clients,
                     args.seconds)
        finally:
            flood.stop()
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
        asks = (('/prioritize', Ask(service.address, 'POST', '/prioritize',
                                    body, lambda data: True)),
                ('/healthz (probes)', Ask(metrics, 'GET', '/healthz', None,
                                          lambda data: True)))
        print('extender (%d legitimate clients, %g s each)' % (
            args.clients, args.seconds))
        for label, ask in asks:
            ask()
            _measure('  %s alone' % label, ask, args.clients, args.seconds)
            flood = slowclients.OneByteFlood(ask.address, FLOOD, 16).start()
            try:
                _measure('  %s beside 1,100 slow' % label, ask,
                         args.clients, args.seconds)
            finally:
                flood.stop()
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
