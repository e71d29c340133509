"""The HTTP(S) server of the webhook, the extender and their metrics.

Anything on the pod network can open a connection to these ports, so
the server assumes hostile clients:

* connections are handled by one ``asyncio`` event loop, so an idle, slow
  or silent connection costs a file descriptor and a little memory, not a
  thread; the TLS handshake runs on that connection
  (``StreamWriter.start_tls``) with its own timeout, never in the accept
  path;
* a request (its head and body) must arrive within ``request_timeout``
  seconds of its first byte, the next request on a kept-alive connection
  must start within ``idle_timeout``; heads are capped at
  ``max_header_bytes`` (431), bodies at ``max_body_bytes`` (413, before
  the body is read), chunked bodies are refused (411);
* at ``max_connections`` the connection that waited longest without a
  request in progress is closed to make room for the new one, so a flood
  of idle connections cannot lock a real client out;
* complete requests run in a pool of ``workers`` threads; with every
  worker busy and ``max_queue`` requests waiting, a request is answered
  503 at once; a handler that takes longer than ``handler_timeout`` gets
  its client a 503 (the thread finishes on its own);
* the answer is written within ``write_timeout``.

The handlers stay ``http.server.BaseHTTPRequestHandler`` subclasses
(``do_GET``/``do_POST``): each complete request is replayed to a handler
from memory and its answer collected from memory, so no handler ever reads
from a socket. An exception escaping a handler answers 500 without
detail (it is logged).

TLS: :class:`TlsFiles` holds the PEM files and rebuilds its
``SSLContext`` when a file changes (a rotated Kubernetes secret), for new
connections, with no restart; a set that does not load (half-written
during a rotation) is logged and the previous context kept. With a client
CA file, clients must present a certificate signed by it.

Why not an existing server library: ``cheroot`` performs the TLS
handshake in its connection-manager loop (``_from_server_socket``), so one
silent TLS client stalls every other connection for the socket timeout;
``waitress`` has no TLS; ``gunicorn`` is a pre-fork process manager
(worker processes cannot share the extender's in-memory cluster cache,
certificates are re-read only when workers restart) and would bring its
own configuration and signal handling into daemons configured with
oslo.config. ``asyncio`` gives non-blocking handshakes with timeouts and
cheap idle connections; this module adds the limits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import http
import http.server
import io
import itertools
import json
import logging
import os
import socket
import ssl
import threading
import time
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import yamlutil

LOG = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class Limits:
    """What one client may take from a server (see the module text)."""

    max_connections: int = 1024
    workers: int = 8
    max_queue: int = 64
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 8 * 1024 * 1024
    handshake_timeout: float = 5.0
    request_timeout: float = 10.0
    idle_timeout: float = 60.0
    handler_timeout: float = 30.0
    write_timeout: float = 10.0

    @classmethod
    def from_conf(cls, conf: Any) -> Limits:
        """The limits of the ``[kubernetes] http_*`` options."""
        group = conf.kubernetes
        return cls(max_connections=group.http_max_connections,
                   workers=group.http_workers,
                   max_queue=group.http_max_queue,
                   max_body_bytes=group.http_max_body_bytes,
                   handshake_timeout=group.http_handshake_timeout,
                   request_timeout=group.http_request_timeout,
                   idle_timeout=group.http_idle_timeout,
                   handler_timeout=group.http_handler_timeout)


# --- TLS ---------------------------------------------------------------------

class TlsFiles:
    """A server ``SSLContext`` from PEM files, rebuilt when they change.

    :param cert_file: the certificate chain.
    :param key_file: its private key.
    :param client_ca_file: CA certificates that sign the client
        certificates; when given, a client without a valid certificate is
        refused during the handshake.
    :param check_interval: seconds between checks of the files.
    :raises ConfigError: the files do not load now (naming them).
    """

    def __init__(self, cert_file: str, key_file: str,
                 client_ca_file: str | None = None,
                 check_interval: float = 1.0, option: str = 'TLS') -> None:
        self.files = tuple(f for f in (cert_file, key_file, client_ca_file)
                           if f)
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.check_interval = check_interval
        self.option = option
        #: contexts built so far (1 after start; +1 per rotation seen)
        self.loads = 0
        self._lock = threading.Lock()
        self._checked = 0.0
        self._signature = self._stat()
        self._failed: tuple[Any, ...] | None = None
        try:
            self._context = self._build()
        except (OSError, ssl.SSLError) as err:
            raise exception.ConfigError(
                option=option, reason='%s: %s' % (', '.join(self.files),
                                                  err)) from None

    def _stat(self) -> tuple[Any, ...]:
        result: list[tuple[int, int, int] | None] = []
        for path in self.files:
            try:
                st = os.stat(path)
            except OSError:
                result.append(None)
                continue
            result.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(result)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        self.loads += 1
        return context

    def context(self) -> ssl.SSLContext:
        """The context for a new connection (rebuilt if a file changed)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.check_interval:
                return self._context
            self._checked = now
            signature = self._stat()
            if signature == self._signature or signature == self._failed:
                return self._context
            try:
                self._context = self._build()
            except (OSError, ssl.SSLError) as err:
                # a rotation in progress, or a bad secret: keep serving
                self._failed = signature
                LOG.warning('%s: %s do not load (%s); still serving the '
                            'previous certificate', self.option,
                            ', '.join(self.files), err)
                return self._context
            self._signature = signature
            self._failed = None
            LOG.info('%s: certificate reloaded from %s', self.option,
                     ', '.join(self.files))
            return self._context


# --- request bodies ----------------------------------------------------------

def read_json(handler: http.server.BaseHTTPRequestHandler) -> Any:
    """The JSON body of the request ``handler`` serves (None if empty).

    :raises HttpRequestError: not UTF-8, not JSON, or nested deeper than
        :data:`amdgpu_virt.yamlutil.MAX_DEPTH` (naming what is wrong).
    """
    try:
        length = int(handler.headers.get('Content-Length') or 0)
    except ValueError:
        raise exception.HttpRequestError(
            reason='Content-Length is not a number') from None
    return parse_json(handler.rfile.read(length))


def parse_json(data: bytes) -> Any:
    """:func:`read_json` of a body already read."""
    if not data:
        return None
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as err:
        raise exception.HttpRequestError(
            reason='the body is not UTF-8 (byte %d)' % err.start) from None
    try:
        return yamlutil.load_json(text, 'the request body')
    except exception.AmdgpuVirtError as err:
        raise exception.HttpRequestError(reason=str(err)) from None


# --- handlers ----------------------------------------------------------------

class Handler(http.server.BaseHTTPRequestHandler):
    """A base for the handlers this server replays requests to: HTTP/1.1
    with a length on every answer, no Nagle delay, access logs at debug
    level under ``log_name``."""

    protocol_version = 'HTTP/1.1'
    # headers and body go out in two writes: without this, Nagle's
    # algorithm and the client's delayed ACK add ~40 ms to small answers
    disable_nagle_algorithm = True
    log_name = 'http'

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        LOG.debug('%s %s - %s', self.log_name, self.address_string(),
                  format % args)

    def _send(self, code: int, data: bytes,
              content_type: str = 'application/json') -> None:
        self.send_response(code)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, code: int, body: Any) -> None:
        self._send(code, json.dumps(body).encode())


# --- the server --------------------------------------------------------------

class _Refused(Exception):
    """A request answered by the server itself (status, reason)."""

    def __init__(self, code: int, reason: str, close: bool = True) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.close = close


@dataclasses.dataclass
class _Connection:
    writer: asyncio.StreamWriter
    number: int
    idle_since: float
    busy: bool = False


class Server:
    """An HTTP(S) server for a ``BaseHTTPRequestHandler`` class.

    The listening socket is bound at construction (so a bad address fails
    at once); :meth:`serve_forever` serves until :meth:`shutdown`, as the
    standard library's servers do. Handlers see this object as
    ``self.server``; give it the attributes they need.

    :param handler_class: the request handler.
    :param host: address to listen on.
    :param port: TCP port (0: a free one).
    :param limits: see :class:`Limits`.
    :param tls: serve HTTPS with these files; None: plain HTTP.
    :param name: for logs (``webhook``, ``extender``...).
    :raises OSError: the address cannot be bound.
    """

    def __init__(self, handler_class: type[http.server.BaseHTTPRequestHandler],
                 host: str = '127.0.0.1', port: int = 0,
                 limits: Limits | None = None, tls: TlsFiles | None = None,
                 name: str = 'http') -> None:
        self.handler_class = handler_class
        self.limits = limits or Limits()
        self.tls = tls
        self.name = name
        family = socket.AF_INET6 if ':' in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(min(socket.SOMAXCONN, 4096))
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.limits.workers,
            thread_name_prefix='%s-worker' % name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running = threading.Event()
        self._started = False
        self._done = threading.Event()
        self._done.set()
        self._connections: dict[int, _Connection] = {}
        self._numbers = itertools.count()
        self._pending = 0
        #: connections closed to make room for new ones
        self.evicted = 0

    # -- life cycle -------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (call it from another thread)."""
        self._started = True
        self._done.clear()
        try:
            asyncio.run(self._main())
        finally:
            self._done.set()

    def start(self) -> Server:
        """Serve from a daemon thread; returns once accepting."""
        thread = threading.Thread(target=self.serve_forever, daemon=True,
                                  name=self.name)
        thread.start()
        self._running.wait(10)
        return self

    def shutdown(self) -> None:
        """Stop serving and wait until :meth:`serve_forever` returned."""
        if not self._started:
            return
        self._running.wait(10)
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(stop.set)
        self._done.wait(10)

    def server_close(self) -> None:
        self.socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._serve, sock=self.socket,
            limit=self.limits.max_header_bytes)
        self._running.set()
        try:
            await self._stop.wait()
        finally:
            self._running.clear()
            server.close()
            for conn in list(self._connections.values()):
                conn.writer.transport.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

    # -- connections ------------------------------------------------------

    def _make_room(self) -> bool:
        """Close the longest-idle connection if at capacity.

        :returns: False when every connection is busy (refuse the new one).
        """
        if len(self._connections) < self.limits.max_connections:
            return True
        idle = [c for c in self._connections.values() if not c.busy]
        if not idle:
            return False
        victim = min(idle, key=lambda c: (c.idle_since, c.number))
        self._connections.pop(victim.number, None)
        victim.writer.transport.abort()
        self.evicted += 1
        return True

    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info('peername') or ('?', 0)
        if not self._make_room():
            LOG.warning('%s: %d connections, all busy; refusing %s',
                        self.name, len(self._connections), peer[0])
            writer.transport.abort()
            return
        conn = _Connection(writer, next(self._numbers), time.monotonic())
        self._connections[conn.number] = conn
        try:
            if self.tls is not None:
                await writer.start_tls(
                    self.tls.context(),
                    ssl_handshake_timeout=self.limits.handshake_timeout)
            await self._requests(conn, reader, writer, tuple(peer[:2]))
        except (TimeoutError, asyncio.IncompleteReadError,
                ConnectionError, ssl.SSLError, OSError) as err:
            LOG.debug('%s: connection from %s ended: %r', self.name,
                      peer[0], err)
        except Exception:  # one connection never ends the server
            LOG.exception('%s: connection from %s failed', self.name,
                          peer[0])
        finally:
            self._connections.pop(conn.number, None)
            writer.transport.abort()

    async def _requests(self, conn: _Connection,
                        reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter,
                        peer: tuple[Any, ...]) -> None:
        limits = self.limits
        wait = limits.request_timeout
        while True:
            conn.busy = False
            conn.idle_since = time.monotonic()
            first = await asyncio.wait_for(reader.readexactly(1), wait)
            conn.busy = True
            wait = limits.idle_timeout
            try:
                raw = await asyncio.wait_for(
                    self._read_request(first, reader),
                    limits.request_timeout)
                answer, close = await self._dispatch(raw, peer)
            except TimeoutError:
                answer, close = _answer(408, 'the request did not arrive '
                                        'within %g s'
                                        % limits.request_timeout), True
            except _Refused as refused:
                answer, close = _answer(refused.code, refused.reason,
                                        refused.close), refused.close
            writer.write(answer)
            await asyncio.wait_for(writer.drain(), limits.write_timeout)
            if close:
                return

    async def _read_request(self, first: bytes,
                            reader: asyncio.StreamReader) -> bytes:
        try:
            head = first + await reader.readuntil(b'\r\n\r\n')
        except (asyncio.LimitOverrunError, ValueError):
            raise _Refused(431, 'the request head is larger than %d bytes'
                           % self.limits.max_header_bytes) from None
        if len(head) > self.limits.max_header_bytes:
            raise _Refused(431, 'the request head is larger than %d bytes'
                           % self.limits.max_header_bytes)
        length = 0
        for line in head.split(b'\r\n')[1:]:
            name, _sep, value = line.partition(b':')
            name = name.strip().lower()
            if name == b'transfer-encoding':
                raise _Refused(411, 'Transfer-Encoding is not accepted; '
                               'send the body with a Content-Length')
            if name == b'content-length':
                value = value.strip()
                if not value.isdigit() or length:
                    raise _Refused(400, 'bad Content-Length header: %r'
                                   % value.decode('latin-1')[:40])
                length = int(value)
        if length > self.limits.max_body_bytes:
            raise _Refused(413, 'the request body (Content-Length %d) is '
                           'larger than the limit of %d bytes'
                           % (length, self.limits.max_body_bytes))
        body = await reader.readexactly(length) if length else b''
        return head + body

    async def _dispatch(self, raw: bytes, peer: tuple[Any, ...]
                        ) -> tuple[bytes, bool]:
        limits = self.limits
        if self._pending >= limits.workers + limits.max_queue:
            raise _Refused(503, 'the server is busy (%d requests waiting); '
                           'retry' % self._pending, close=False)
        self._pending += 1
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._pool, self._handle, raw,
                                          peer)
            try:
                return await asyncio.wait_for(asyncio.shield(future),
                                              limits.handler_timeout)
            except TimeoutError:
                LOG.warning('%s: a request took longer than %g s; '
                            'answered 503', self.name,
                            limits.handler_timeout)
                raise _Refused(503, 'the request took longer than %g s'
                               % limits.handler_timeout) from None
        finally:
            self._pending -= 1

    def _handle(self, raw: bytes, peer: tuple[Any, ...]) -> tuple[bytes,
                                                                  bool]:
        """Replay one complete request to a handler; its answer."""
        handler = self.handler_class.__new__(self.handler_class)
        handler.rfile = io.BytesIO(raw)
        handler.wfile = io.BytesIO()
        handler.client_address = peer
        handler.server = self  # type: ignore[assignment]
        handler.close_connection = True
        try:
            handler.handle_one_request()
        except Exception:  # never a traceback to the client
            LOG.exception('%s: the handler failed', self.name)
            return _answer(500, 'internal error (logged by the server)'), \
                True
        answer = handler.wfile.getvalue()
        if not answer:
            return _answer(400, 'the request could not be parsed'), True
        return answer, bool(handler.close_connection)


def _answer(code: int, reason: str, close: bool = True) -> bytes:
    """A JSON ``{"error": reason}`` answer the server gives itself."""
    body = json.dumps({'error': reason}).encode()
    return (b'HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n'
            b'Content-Length: %d\r\n%s\r\n%s'
            % (code, http.HTTPStatus(code).phrase.encode(), len(body),
               b'Connection: close\r\n' if close else b'', body))
