"""Slow clients against the webhook and the extender's probe listener.

The attack seen: one client sends one byte on each of 1,100 connections,
and opens a new one whenever the server closes one. With a connection
busy from its first byte and never evicted, every slot of the server
stayed taken: most real reviews and kubelet probes failed. Here the real
servers (``webhook.make_server``, ``extender.Service`` on the API server
stand-in) face that client from one address and from sixteen, with their
default limits, while a real client (from 127.0.0.1) keeps asking.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import logging
import os
import socket
import ssl
import sys
import time
from typing import Any

import fixtures
import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.k8s.admission import webhook
from amdgpu_virt.k8s.api import httpserver
from amdgpu_virt.k8s.scheduler import service as extender
from tests.functional.fixtures import certs
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import slowclients

#: connections the attacker keeps open (more than the default limit)
FLOOD = 1100
#: how long the real client keeps asking under attack (seconds)
UNDER_ATTACK = 6.0
#: the longest a real request may take under attack (a busy CI machine
#: runs the attacker, the server and the client on two cores)
ANSWER_WITHIN = 3.0
REVIEW = {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
          'request': {'uid': 'u', 'kind': {'kind': 'Pod'},
                      'namespace': 'team', 'operation': 'CREATE',
                      'object': {'metadata': {'name': 'p'},
                                 'spec': {'containers': []}}}}


def _ask(host: str, port: int, method: str, path: str,
         body: Any = None, tls: ssl.SSLContext | None = None
         ) -> tuple[int, float]:
    """(status, seconds) of one real request on a new connection (0:
    refused or dropped)."""
    began = time.monotonic()
    conn: http.client.HTTPConnection
    if tls is not None:
        conn = http.client.HTTPSConnection(host, port, timeout=10,
                                           context=tls)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data,
                     headers={'Content-Type': 'application/json'})
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - began
    except OSError:
        return 0, time.monotonic() - began
    finally:
        conn.close()


class _FloodMixin:
    """A real client keeps asking while the flood runs."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    method = 'GET'
    path = '/healthz'
    body: Any = None

    def _under_flood(self, sources: int) -> list[tuple[int, float]]:
        flood = slowclients.OneByteFlood((self.host, self.port), FLOOD,
                                         sources, self.tls).start()
        self.addCleanup(flood.stop)  # type: ignore[attr-defined]
        answers = []
        until = time.monotonic() + UNDER_ATTACK
        while time.monotonic() < until:
            answers.append(_ask(self.host, self.port, self.method,
                                self.path, self.body, self.tls))
        return answers

    def _check(self, answers: list[tuple[int, float]]) -> None:
        statuses = [status for status, _took in answers]
        self.assertGreater(len(answers), 5)  # type: ignore[attr-defined]
        self.assertEqual([200] * len(answers),  # type: ignore
                         statuses)
        self.assertLess(max(t for _s, t in answers),  # type: ignore
                        ANSWER_WITHIN)

    def test_one_address_gets_its_share_only(self) -> None:
        self._check(self._under_flood(sources=1))

    def test_many_addresses_lose_their_slow_slots(self) -> None:
        # 1,100 connections from 16 addresses: each within its share,
        # together more than the server holds
        self._check(self._under_flood(sources=16))


class WebhookFloodTest(_FloodMixin, testtools.TestCase):
    """The webhook over HTTPS, as the API server reaches it."""

    method = 'POST'
    path = '/webhook'
    body = REVIEW

    def setUp(self) -> None:
        super().setUp()
        directory = self.useFixture(fixtures.TempDir()).path
        authority = certs.Authority()
        cert, key = certs.write(directory, 'tls',
                                *authority.issue('webhook'))
        server = webhook.make_server(webhook.WebhookPolicy(),
                                     cert_file=cert, key_file=key).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        self.host, self.port = server.server_address[:2]
        self.tls = ssl.create_default_context(
            cafile=authority.write_ca(os.path.join(directory, 'ca.crt')))


class ProbeFloodTest(_FloodMixin, testtools.TestCase):
    """kubelet's probes on the extender's probe and metrics listener."""

    def setUp(self) -> None:
        super().setUp()
        kube = self.useFixture(kubeclient.ApiServerFixture())
        conf = conf_pkg.new_conf()
        conf.set_override('port', 0, group='scheduler')
        conf.set_override('metrics_port', 0, group='scheduler')
        service = extender.Service(conf, client.CoreV1Api(kube.api_client))
        service.start()
        self.addCleanup(service.stop)
        address = service.metrics_address
        assert address is not None
        self.host, self.port = address


class _Handler:
    """What the small servers below serve: 200 to anything."""

    @staticmethod
    def make() -> type:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def log_message(self, *args: Any) -> None:
                pass

            def _ok(self) -> None:
                length = int(self.headers.get('Content-Length') or 0)
                data = self.rfile.read(length)
                body = json.dumps({'read': len(data)}).encode()
                self.send_response(200)
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = _ok
            do_POST = _ok

        return Handler


class ConnectionPolicyTest(testtools.TestCase):

    def _server(self, tls: httpserver.TlsFiles | None = None,
                **limits: Any) -> httpserver.Server:
        server = httpserver.Server(_Handler.make(),
                                   limits=httpserver.Limits(**limits),
                                   tls=tls).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return server

    def test_a_dribbling_request_gets_408_long_before_its_deadline(
            self) -> None:
        server = self._server(request_timeout=10.0)
        sock = socket.create_connection(server.server_address[:2], 5)
        self.addCleanup(sock.close)
        began = time.monotonic()
        answer = b''
        sock.settimeout(0.2)
        for byte in b'GET /healthz HTTP/1.1\r\nHost: x\r\n' * 10:
            try:
                sock.sendall(bytes([byte]))
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if answer:
                break
        took = time.monotonic() - began
        self.assertTrue(answer.startswith(b'HTTP/1.1 408 '), answer)
        self.assertIn(b'slower than 4096 bytes a second', answer)
        self.assertLess(took, 4.0)
        self.assertEqual(1, server.too_slow)

    def test_a_request_at_a_sensible_pace_is_never_evicted(self) -> None:
        # a full server: a flood of new connections may close silent
        # ones, never a client whose request is arriving
        server = self._server(max_connections=32, request_timeout=10.0)
        address = server.server_address[:2]
        # half of it at once: 32 KiB keeps it above the floor of 4 KiB a
        # second for 8 s, while the flood arrives
        body = b'x' * 65536
        sock = socket.create_connection(address, 5, ('127.0.0.1', 0))
        self.addCleanup(sock.close)
        sock.sendall(b'POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d'
                     b'\r\n\r\n%s' % (len(body), body[:32768]))
        flood = []
        self.addCleanup(lambda: [s.close() for s in flood])
        for n in range(200):
            with contextlib.suppress(OSError):
                flood.append(socket.create_connection(
                    address, 5, ('127.0.0.%d' % (2 + n % 8), 0)))
        time.sleep(0.3)
        sock.sendall(body[32768:])
        sock.settimeout(5)
        answer = sock.recv(4096)
        self.assertTrue(answer.startswith(b'HTTP/1.1 200 '), answer)
        self.assertIn(b'"read": 65536', answer)
        self.assertGreaterEqual(server.evicted, 150)

    def test_a_peer_over_its_share_is_refused_and_evicts_no_one(
            self) -> None:
        server = self._server(max_connections=64,
                              max_connections_per_peer=10)
        address = server.server_address[:2]
        mine = [socket.create_connection(address, 5, ('127.0.0.1', 0))
                for _ in range(5)]
        theirs = [socket.create_connection(address, 5, ('127.0.0.2', 0))
                  for _ in range(40)]
        for sock in mine + theirs:
            self.addCleanup(sock.close)
        deadline = time.monotonic() + 5
        while server.refused < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(30, server.refused)
        self.assertEqual(0, server.evicted)
        status, _took = _ask(*address, 'GET', '/healthz')
        self.assertEqual(200, status)

    def test_dropped_handshakes_leave_no_traceback(self) -> None:
        # half a ClientHello, then the connection is evicted or closed:
        # asyncio leaves the writer without a transport, which used to
        # raise AttributeError in the server and in the writer's __del__
        directory = self.useFixture(fixtures.TempDir()).path
        cert, key = certs.write(directory, 'tls',
                                *certs.Authority().issue('server'))
        logs = self.useFixture(fixtures.FakeLogger(
            level=logging.DEBUG, name='amdgpu_virt'))
        unraisable: list[Any] = []
        hook = sys.unraisablehook
        sys.unraisablehook = unraisable.append
        self.addCleanup(setattr, sys, 'unraisablehook', hook)
        # the handshake deadline is far past the loop's time, even on a
        # loaded machine: every held connection waits in its handshake
        # until a newer one evicts it (at least 60 - 16 evictions)
        server = self._server(tls=httpserver.TlsFiles(cert, key),
                              max_connections=16, handshake_timeout=30.0)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        held = []
        for n in range(120):
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            tls = context.wrap_bio(incoming, outgoing)
            with contextlib.suppress(ssl.SSLWantReadError):
                tls.do_handshake()
            hello = outgoing.read()
            sock = socket.create_connection(
                server.server_address[:2], 5, ('127.0.0.%d' % (2 + n % 8),
                                               0))
            sock.sendall(hello[:len(hello) // 2])
            if n % 2:
                sock.close()
            else:
                held.append(sock)
        time.sleep(1.5)
        for sock in held:
            sock.close()
        time.sleep(0.3)
        gc.collect()
        self.assertGreaterEqual(server.evicted, 60 - 16)
        self.assertEqual([], [u.exc_value for u in unraisable])
        self.assertNotIn('Traceback', logs.output)
        self.assertNotIn('AttributeError', logs.output)
