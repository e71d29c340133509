"""The webhook, extender and metrics servers against hostile clients.

Each server is the real one (``webhook.make_server``, ``extender.Service``
with its API client on the API server stand-in), reached over TCP on
127.0.0.1 by real clients (``http.client``, ``ssl``) while hundreds of
idle and slow connections are held open against it.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time
from typing import Any

import fixtures
import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt.k8s.admission import webhook
from amdgpu_virt.k8s.api import httpserver
from amdgpu_virt.k8s.scheduler import service as extender
from tests.functional.fixtures import certs
from tests.functional.fixtures import kubeclient

IDLE = 300
SLOW = 200
#: what a real client may wait for its answer under attack (seconds)
ANSWER_WITHIN = 3.0
LIMITS = httpserver.Limits(handshake_timeout=5.0, request_timeout=5.0,
                           idle_timeout=5.0, max_body_bytes=1024 * 1024)


class Attack:
    """Connections held open against ``(host, port)``; closed at cleanup.

    They come from ``sources`` loopback addresses (127.0.0.2 and up; Linux
    answers every 127/8 address), as many attackers would, so that the
    per-address cap leaves them their share; real clients connect from
    127.0.0.1.
    """

    def __init__(self, test: testtools.TestCase, host: str,
                 port: int, sources: int = 8) -> None:
        self.address = (host, port)
        self.sources = ['127.0.0.%d' % (2 + n) for n in range(sources)]
        self.sockets: list[socket.socket] = []
        test.addCleanup(self.close)

    def connect(self) -> socket.socket:
        """One more connection, from the next source address."""
        source = self.sources[len(self.sockets) % len(self.sources)]
        return socket.create_connection(self.address, 5, (source, 0))

    def idle(self, count: int) -> None:
        """Connect and send nothing (on a TLS port: no ClientHello)."""
        for _ in range(count):
            self.sockets.append(self.connect())

    def slow(self, count: int, tls: ssl.SSLContext | None = None) -> None:
        """Send the start of a request head and stop (slowloris)."""
        for _ in range(count):
            sock = self.connect()
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname='127.0.0.1')
            sock.sendall(b'POST /webhook HTTP/1.1\r\nHost: x\r\n'
                         b'Content-Length: 100\r\nX-a: ')
            self.sockets.append(sock)

    def alive(self) -> int:
        """How many attack connections the server has not closed yet
        (whatever it answered before closing is read and dropped)."""
        count = 0
        for sock in self.sockets:
            sock.setblocking(False)
            try:
                while sock.recv(65536):
                    pass
            except (ssl.SSLWantReadError, BlockingIOError):
                count += 1
            except OSError:
                pass
        return count

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


class _HostileMixin:
    """Shared attacks; a subclass sets ``host``, ``port``, ``tls`` (a
    client context or None) and ``path`` / ``body`` of a real request."""

    host: str
    port: int
    tls: ssl.SSLContext | None
    path: str
    body: Any

    def _connection(self) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=ANSWER_WITHIN,
                context=self.tls)
        return http.client.HTTPConnection(self.host, self.port,
                                          timeout=ANSWER_WITHIN)

    def _request(self, method: str, path: str, data: bytes | None = None,
                 headers: dict[str, str] | None = None
                 ) -> tuple[int, bytes, float]:
        began = time.monotonic()
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=headers or {
                'Content-Type': 'application/json'})
            response = conn.getresponse()
            return response.status, response.read(), \
                time.monotonic() - began
        finally:
            conn.close()

    def _real(self) -> tuple[int, bytes, float]:
        data = None if self.body is None else json.dumps(self.body).encode()
        return self._request('POST' if data else 'GET', self.path, data)

    def test_answers_under_idle_and_slow_connections(self) -> None:
        attack = Attack(self, self.host, self.port)  # type: ignore[arg-type]
        attack.idle(IDLE)
        began = time.monotonic()
        attack.slow(SLOW, self.tls)
        for _ in range(3):
            status, _data, took = self._real()
            self.assertEqual(200, status)  # type: ignore[attr-defined]
            self.assertLess(took, ANSWER_WITHIN)  # type: ignore
        # the idle ones were still held open while the real client was
        # answered (their first request may take request_timeout)
        if time.monotonic() - began < LIMITS.request_timeout - 1:
            self.assertGreater(attack.alive(),  # type: ignore
                               IDLE // 2)
        # and the attackers are dropped once their time is up
        deadline = time.monotonic() + LIMITS.request_timeout + 5
        while attack.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(0, attack.alive())  # type: ignore[attr-defined]

    def test_slow_request_gets_408(self) -> None:
        sock = socket.create_connection((self.host, self.port), 5)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_hostname='127.0.0.1')
        self.addCleanup(sock.close)  # type: ignore[attr-defined]
        sock.sendall(b'GET /healthz HTTP/1.1\r\nHost: x\r\n')
        sock.settimeout(LIMITS.request_timeout + 5)
        answer = sock.recv(4096)
        self.assertTrue(answer.startswith(  # type: ignore[attr-defined]
            b'HTTP/1.1 408 '), answer)

    def test_oversize_body_is_413_before_it_is_sent(self) -> None:
        status, data, took = self._request(
            'POST', self.path, None, {'Content-Length': str(1 << 30),
                                      'Content-Type': 'application/json'})
        self.assertEqual(413, status)  # type: ignore[attr-defined]
        self.assertIn(b'1073741824', data)  # type: ignore[attr-defined]
        self.assertIn(b'1048576', data)  # type: ignore[attr-defined]

    def test_chunked_and_bad_lengths_are_refused(self) -> None:
        status, _data, _took = self._request(
            'POST', self.path, iter([b'{}']),
            {'Transfer-Encoding': 'chunked'})
        self.assertEqual(411, status)  # type: ignore[attr-defined]
        status, data, _took = self._request(
            'POST', self.path, b'{}', {'Content-Length': '-2'})
        self.assertEqual(400, status)  # type: ignore[attr-defined]
        self.assertIn(b'Content-Length', data)  # type: ignore


def _conf(kubernetes: dict[str, Any] | None = None,
          **overrides: Any) -> Any:
    conf = conf_pkg.new_conf()
    conf.set_override('port', 0, group='scheduler')
    conf.set_override('metrics_port', 0, group='scheduler')
    for name, value in (('http_handshake_timeout', 5.0),
                        ('http_request_timeout', 5.0),
                        ('http_idle_timeout', 5.0),
                        ('http_max_body_bytes', 1024 * 1024)):
        conf.set_override(name, value, group='kubernetes')
    for name, value in (kubernetes or {}).items():
        conf.set_override(name, value, group='kubernetes')
    for name, value in overrides.items():
        conf.set_override(name, value, group='scheduler')
    return conf


class WebhookTlsTest(_HostileMixin, testtools.TestCase):
    """The webhook on HTTPS, as the API server reaches it."""

    path = '/webhook'

    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.ca = certs.Authority()
        self.cert, self.key = certs.write(self.dir, 'tls',
                                          *self.ca.issue('webhook'))
        self.server = webhook.make_server(
            webhook.WebhookPolicy(), cert_file=self.cert,
            key_file=self.key, limits=LIMITS).start()
        self.addCleanup(self.server.server_close)
        self.addCleanup(self.server.shutdown)
        self.host, self.port = self.server.server_address[:2]
        self.tls = ssl.create_default_context(
            cafile=self.ca.write_ca(os.path.join(self.dir, 'ca.crt')))
        self.body = {'apiVersion': 'admission.k8s.io/v1',
                     'kind': 'AdmissionReview', 'request': {
                         'uid': 'u', 'kind': {'kind': 'Pod'},
                         'namespace': 'team', 'operation': 'CREATE',
                         'object': {'metadata': {'name': 'p'},
                                    'spec': {'containers': []}}}}

    def test_silent_tcp_connection_blocks_no_one(self) -> None:
        # the fault seen before: the handshake ran in the accept loop
        attack = Attack(self, self.host, self.port)
        attack.idle(1)
        status, _data, took = self._real()
        self.assertEqual(200, status)
        self.assertLess(took, 1.0)

    def test_bad_bodies_get_400_naming_the_fault(self) -> None:
        for data, culprit in (
                (b'\xff\xfe{}', b'not UTF-8'),
                (b'{"request": ', b'not valid JSON'),
                (b'[' * 5000 + b']' * 5000, b'nested'),
                (b'[' * 150 + b']' * 150, b'deeper than 100'),
                (b'{"request": {"uid": ' + b'9' * 5000 + b'}}',
                 b'not valid JSON'),
                (b'{"request": {"kind": {"kind": "Pod"}}}', b'request.uid')):
            status, answer, _took = self._request('POST', '/webhook', data)
            self.assertEqual(400, status, (data[:40], answer))
            self.assertIn(culprit, answer)
            self.assertNotIn(b'Traceback', answer)

    def test_certificate_rotation_is_picked_up(self) -> None:
        def serial() -> int:
            with socket.create_connection((self.host, self.port), 5) as raw, \
                    self.tls.wrap_socket(raw,
                                         server_hostname='127.0.0.1') as sock:
                der = sock.getpeercert(binary_form=True)
            from cryptography import x509
            return x509.load_der_x509_certificate(der).serial_number

        self.assertNotEqual(4242, serial())
        certs.write(self.dir, 'tls', *self.ca.issue('webhook', serial=4242))
        deadline = time.monotonic() + 10
        while serial() != 4242:
            self.assertLess(time.monotonic(), deadline, 'not reloaded')
            time.sleep(0.2)
        # a half-written rotation keeps the last good certificate
        with open(self.cert, 'w') as stream:
            stream.write('-----BEGIN CERTIFICATE-----\ntrunc')
        time.sleep(1.2)
        self.assertEqual(4242, serial())
        self.assertEqual(200, self._real()[0])


class ExtenderTest(_HostileMixin, testtools.TestCase):
    """The extender's own port (kube-scheduler's side)."""

    path = '/prioritize'
    probes = False

    def _service(self, kubernetes: dict[str, Any] | None = None
                 ) -> extender.Service:
        kube = self.useFixture(kubeclient.ApiServerFixture())
        service = extender.Service(_conf(kubernetes), client.CoreV1Api(
            kube.api_client))
        service.start()
        self.addCleanup(service.stop)
        return service

    def setUp(self) -> None:
        super().setUp()
        self.service = self._service()
        address = self.service.metrics_address if self.probes \
            else self.service.address
        assert address is not None
        self.host, self.port = address
        self.tls = None
        self.body = None if self.probes else {
            'Pod': {'metadata': {'name': 'p', 'namespace': 'team'},
                    'spec': {'containers': []}}, 'NodeNames': ['n1']}

    def test_bad_bodies_never_get_500(self) -> None:
        for verb in ('filter', 'prioritize', 'bind'):
            for data in (b'\xff', b'[' * 5000 + b']' * 5000, b'{"Pod": 1'):
                status, answer, _took = self._request('POST', '/' + verb,
                                                      data)
                self.assertIn(status, (200, 400), (verb, data[:10]))
                self.assertIn(b'Bad HTTP request', answer)
                self.assertNotIn(b'Traceback', answer)

    def test_flood_over_max_connections_evicts_idle_ones(self) -> None:
        service = self._service(kubernetes={'http_max_connections': 64,
                                            'http_request_timeout': 30.0})
        self.host, self.port = service.address
        attack = Attack(self, self.host, self.port)
        attack.idle(64 + 50)
        status, _data, took = self._real()
        self.assertEqual(200, status)
        self.assertLess(took, ANSWER_WITHIN)
        self.assertGreaterEqual(service.server.evicted, 50)


class MetricsTest(ExtenderTest):
    """The probe and metrics listener on the pod address."""

    path = '/metrics'
    probes = True

    def test_bad_bodies_never_get_500(self) -> None:
        status, _answer, _took = self._request('POST', '/filter', b'{}')
        self.assertEqual(404, status)

    def test_flood_over_max_connections_evicts_idle_ones(self) -> None:
        self.skipTest('covered on the extender port, same server class')

    def test_serves_probes_and_metrics(self) -> None:
        for path in ('/healthz', '/metrics'):
            self.assertEqual(200, self._request('GET', path)[0])


class ExtenderTlsTest(testtools.TestCase):
    """The extender with TLS and client certificates (other layouts)."""

    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.ca = certs.Authority()
        cert, key = certs.write(self.dir, 'tls', *self.ca.issue('extender'))
        ca_file = self.ca.write_ca(os.path.join(self.dir, 'ca.crt'))
        kube = self.useFixture(kubeclient.ApiServerFixture())
        self.service = extender.Service(
            _conf(cert_file=cert, key_file=key, client_ca_file=ca_file),
            client.CoreV1Api(kube.api_client))
        self.service.start()
        self.addCleanup(self.service.stop)
        self.ca_file = ca_file

    def _get(self, context: ssl.SSLContext) -> int:
        host, port = self.service.address
        conn = http.client.HTTPSConnection(host, port, timeout=5,
                                           context=context)
        try:
            conn.request('GET', '/healthz')
            return conn.getresponse().status
        finally:
            conn.close()

    def _client(self, authority: certs.Authority | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if authority is not None:
            cert, key = certs.write(self.dir, 'client-%d' % id(authority),
                                    *authority.issue('kube-scheduler',
                                                     client=True))
            context.load_cert_chain(cert, key)
        return context

    def test_client_certificate_is_required(self) -> None:
        self.assertEqual(200, self._get(self._client(self.ca)))
        for intruder in (None, certs.Authority('other CA')):
            self.assertRaises((ssl.SSLError, ConnectionError, OSError),
                              self._get, self._client(intruder))

    def test_incomplete_tls_options_are_refused(self) -> None:
        kube = self.useFixture(kubeclient.ApiServerFixture())
        err = self.assertRaises(
            exception.ConfigError, extender.Service,
            _conf(client_ca_file=self.ca_file),
            client.CoreV1Api(kube.api_client))
        self.assertIn('[scheduler] cert_file/key_file', str(err))
        with open(os.path.join(self.dir, 'bad.crt'), 'w') as stream:
            stream.write('not a certificate')
        err = self.assertRaises(
            exception.ConfigError, extender.Service,
            _conf(cert_file=os.path.join(self.dir, 'bad.crt'),
                  key_file=os.path.join(self.dir, 'bad.crt')),
            client.CoreV1Api(kube.api_client))
        self.assertIn('bad.crt', str(err))


class HandlerLimitsTest(testtools.TestCase):
    """Limits that need a handler of their own: slow and failing ones."""

    def _server(self, **limits: Any) -> httpserver.Server:
        import http.server

        release = threading.Event()
        self.addCleanup(release.set)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == '/slow':
                    release.wait(10)
                if self.path == '/boom':
                    raise RuntimeError('secret detail')
                self.send_response(200)
                self.send_header('Content-Length', '2')
                self.end_headers()
                self.wfile.write(b'ok')

        server = httpserver.Server(Handler, limits=httpserver.Limits(
            **limits)).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return server

    def _get(self, server: httpserver.Server, path: str
             ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(*server.server_address[:2],
                                          timeout=10)
        try:
            conn.request('GET', path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def test_slow_handler_gets_503_and_others_still_answer(self) -> None:
        server = self._server(handler_timeout=0.5, workers=2, max_queue=0)
        status, data = self._get(server, '/slow')
        self.assertEqual(503, status)
        self.assertIn(b'0.5 s', data)
        self.assertEqual(200, self._get(server, '/')[0])

    def test_full_queue_is_503_at_once(self) -> None:
        server = self._server(handler_timeout=5, workers=1, max_queue=0)
        thread = threading.Thread(target=self._get, args=(server, '/slow'))
        thread.start()
        self.addCleanup(thread.join, 15)
        time.sleep(0.3)
        began = time.monotonic()
        status, data = self._get(server, '/')
        self.assertEqual(503, status)
        self.assertIn(b'busy', data)
        self.assertLess(time.monotonic() - began, 1.0)

    def test_handler_exception_is_500_without_detail(self) -> None:
        server = self._server()
        status, data = self._get(server, '/boom')
        self.assertEqual(500, status)
        self.assertNotIn(b'secret detail', data)
        self.assertEqual(200, self._get(server, '/')[0])

    def test_keep_alive_serves_many_requests_on_one_connection(
            self) -> None:
        server = self._server()
        conn = http.client.HTTPConnection(*server.server_address[:2],
                                          timeout=10)
        self.addCleanup(conn.close)
        for _ in range(20):
            conn.request('GET', '/')
            self.assertEqual(b'ok', conn.getresponse().read())

    def test_bad_address_fails_at_construction(self) -> None:
        import http.server

        blocker = socket.socket()
        self.addCleanup(blocker.close)
        blocker.bind(('127.0.0.1', 0))
        blocker.listen(1)
        self.assertRaises(OSError, httpserver.Server,
                          http.server.BaseHTTPRequestHandler, '127.0.0.1',
                          blocker.getsockname()[1])
