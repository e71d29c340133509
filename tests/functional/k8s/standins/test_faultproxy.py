"""The fault-injecting proxy in front of the API server stand-in."""

from __future__ import annotations

import contextlib
import socket
import time

import testtools
import urllib3
from kubernetes import client
from kubernetes.client import exceptions as k8s_exceptions

from tests.functional.fixtures import faultproxy
from tests.functional.fixtures import kubeclient

Fault = faultproxy.Fault
Rule = faultproxy.Rule


def _node(name: str) -> client.V1Node:
    return client.V1Node(metadata=client.V1ObjectMeta(name=name))


class FaultProxyTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(_node('n1'))

    def _proxy(self, **kwargs: object) -> faultproxy.FaultProxyFixture:
        return self.useFixture(faultproxy.FaultProxyFixture(
            self.kube, **kwargs))

    def test_pass_relays_every_request(self) -> None:
        fx = self._proxy()
        for _ in range(5):
            self.assertEqual('n1', fx.api.read_node('n1').metadata.name)
        self.assertEqual(5, fx.proxy.faults(Fault.PASS))
        self.assertEqual(['GET'] * 5, [m for m, _p, _f in fx.proxy.log])

    def test_error_answers_500_with_a_status(self) -> None:
        fx = self._proxy(rules=[Rule(Fault.ERROR, 'GET', '/nodes/n1$')])
        err = self.assertRaises(k8s_exceptions.ApiException,
                                fx.api.read_node, 'n1')
        self.assertEqual(500, err.status)
        self.assertIn('"reason": "InternalError"', err.body)
        # the rule was used once: the next request passes
        self.assertEqual('n1', fx.api.read_node('n1').metadata.name)

    def test_reset_never_reaches_the_server(self) -> None:
        fx = self._proxy(rules=[Rule(Fault.RESET, 'POST', '/nodes')])
        self.assertRaises(urllib3.exceptions.HTTPError,
                          fx.api.create_node, _node('n2'))
        self.assertIsNone(self.kube.server.get_object('nodes', 'n2'))

    def test_reset_after_applies_the_request_and_loses_the_answer(
            self) -> None:
        fx = self._proxy(rules=[Rule(Fault.RESET_AFTER, 'POST', '/nodes')])
        self.assertRaises(urllib3.exceptions.HTTPError,
                          fx.api.create_node, _node('n2'))
        self.assertIsNotNone(self.kube.server.get_object('nodes', 'n2'))

    def test_truncate_cuts_the_body(self) -> None:
        fx = self._proxy(rules=[Rule(Fault.TRUNCATE, 'GET', '/nodes/n1')])
        self.assertRaises(urllib3.exceptions.HTTPError,
                          fx.api.read_node, 'n1')
        self.assertEqual('n1', fx.api.read_node('n1').metadata.name)

    def test_delay_waits_then_passes(self) -> None:
        fx = self._proxy(rules=[Rule(Fault.DELAY, times=1)], delay=0.3)
        began = time.monotonic()
        fx.api.read_node('n1')
        self.assertGreaterEqual(time.monotonic() - began, 0.3)

    def test_skip_and_unlimited_times(self) -> None:
        fx = self._proxy(rules=[Rule(Fault.ERROR, 'GET', skip=2,
                                     times=None)])
        fx.api.read_node('n1')
        fx.api.read_node('n1')
        for _ in range(3):
            self.assertRaises(k8s_exceptions.ApiException,
                              fx.api.read_node, 'n1')
        fx.proxy.clear()
        fx.api.read_node('n1')

    def test_seeded_schedule_repeats(self) -> None:
        rates = {Fault.ERROR: 0.3, Fault.RESET: 0.2}

        def run() -> list[Fault]:
            proxy = faultproxy.FaultProxy(self.kube.server.url, seed=7,
                                          rates=rates).start()
            self.addCleanup(proxy.stop)
            config = client.Configuration(host=proxy.url)
            config.retries = 0
            with client.ApiClient(config) as api_client:
                api = client.CoreV1Api(api_client)
                for _ in range(40):
                    with contextlib.suppress(
                            k8s_exceptions.ApiException,
                            urllib3.exceptions.HTTPError):
                        api.read_node('n1')
            proxy.stop()
            return [fault for _m, _p, fault in proxy.log]

        first = run()
        self.assertEqual(first, run())
        self.assertEqual(40, len(first))
        self.assertEqual({Fault.PASS, Fault.ERROR, Fault.RESET}, set(first))

    def test_watch_streams_through(self) -> None:
        fx = self._proxy()
        response = fx.api.list_node(watch=True, timeout_seconds=1,
                                    _preload_content=False)
        lines = [line for line in response.read().split(b'\n') if line]
        self.assertEqual(1, len(lines))
        self.assertIn(b'"ADDED"', lines[0])

    def test_stops_by_itself(self) -> None:
        fx = self._proxy(lifetime=0.3)
        fx.api.read_node('n1')
        self.assertTrue(faultproxy.wait_for(lambda: fx.proxy.stopped, 5))
        port = int(fx.proxy.url.rsplit(':', 1)[1])
        self.assertTrue(faultproxy.wait_for(
            lambda: _refused(port), 5))

    def test_rejects_bad_setup(self) -> None:
        self.assertRaises(ValueError, faultproxy.FaultProxy,
                          'https://127.0.0.1:1')
        self.assertRaises(ValueError, faultproxy.FaultProxy,
                          self.kube.server.url,
                          rates={Fault.ERROR: 0.7, Fault.RESET: 0.5})


def _refused(port: int) -> bool:
    try:
        socket.create_connection(('127.0.0.1', port), timeout=1).close()
    except OSError:
        return True
    return False
