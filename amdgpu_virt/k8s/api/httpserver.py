"""The HTTP(S) server of the webhook, the extender and their metrics.

Anything on the pod network can open a connection to these ports, so
the server assumes hostile clients:

* connections are handled by one ``asyncio`` event loop, so an idle, slow
  or silent connection costs a file descriptor and a little memory, not a
  thread; the TLS handshake runs on that connection
  (``StreamWriter.start_tls``) with its own timeout, never in the accept
  path;
* a request (its head and body) must arrive within ``request_timeout``
  seconds of its first byte and, after the first ``request_grace``
  seconds, at ``min_request_rate`` bytes a second at least (counted from
  its first byte): a slower client gets 408 and is disconnected; the next
  request on a kept-alive connection must start within ``idle_timeout``;
  heads are capped at ``max_header_bytes`` (431), bodies at
  ``max_body_bytes`` (413, before the body is read), chunked bodies are
  refused (411);
* one address holds at most ``max_connections_per_peer`` connections; at
  ``max_connections`` a connection is closed to make room for a new one
  as :mod:`amdgpu_virt.k8s.api.connpolicy` chooses (a silent or idle one
  first, then one reading slower than the floor; never one whose request
  arrives at a sensible pace, nor one being answered), so neither a flood
  of idle connections nor a slow client can lock a real client out;
* complete requests run in a pool of ``workers`` threads; with every
  worker busy and ``max_queue`` requests waiting, a request is answered
  503 at once; a handler that takes longer than ``handler_timeout`` gets
  its client a 503 (the thread finishes on its own); a handler sees when
  its request's first byte arrived (``handler.received_at``, monotonic),
  so it can answer within a budget of its own;
* the answer is written within ``write_timeout``.

The handlers stay ``http.server.BaseHTTPRequestHandler`` subclasses
(``do_GET``/``do_POST``): each complete request is replayed to a handler
from memory and its answer collected from memory, so no handler ever reads
from a socket (its JSON body: :mod:`amdgpu_virt.k8s.api.httpbody`). An
exception escaping a handler answers 500 without detail (it is logged).

TLS: :class:`~amdgpu_virt.k8s.api.tls.TlsFiles` holds the PEM files and
rebuilds its ``SSLContext`` when a file changes (a rotated Kubernetes
secret), for new connections, with no restart; a set that does not load
(half-written during a rotation) is logged and the previous context kept.
With a client CA file, clients must present a certificate signed by it.

Why not an existing server library (``cheroot`` handshakes in its
accept loop, ``waitress`` has no TLS, ``gunicorn`` forks workers that
cannot share the extender's cache): see the Kubernetes admin guide.
"""

from __future__ import annotations

import array
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import http
import http.server
import io
import itertools
import json
import logging
import socket
import ssl
import termios
import threading
import time
from typing import Any

from amdgpu_virt.k8s.api import connpolicy
from amdgpu_virt.k8s.api.tls import TlsFiles

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one client may take from a server (see the module text)."""

    max_connections: int = 1024
    max_connections_per_peer: int = 128
    workers: int = 8
    max_queue: int = 64
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 8 * 1024 * 1024
    handshake_timeout: float = 5.0
    request_timeout: float = 10.0
    min_request_rate: int = 4096
    request_grace: float = 1.0
    idle_timeout: float = 60.0
    handler_timeout: float = 30.0
    write_timeout: float = 10.0

    @classmethod
    def from_conf(cls, conf: Any) -> Limits:
        """The limits of the ``[kubernetes] http_*`` options."""
        group = conf.kubernetes
        return cls(max_connections=group.http_max_connections,
                   max_connections_per_peer=(
                       group.http_max_connections_per_peer),
                   min_request_rate=group.http_min_request_rate,
                   workers=group.http_workers,
                   max_queue=group.http_max_queue,
                   max_body_bytes=group.http_max_body_bytes,
                   handshake_timeout=group.http_handshake_timeout,
                   request_timeout=group.http_request_timeout,
                   idle_timeout=group.http_idle_timeout,
                   handler_timeout=group.http_handler_timeout)


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
    state: connpolicy.ConnState
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: the TCP transport (the writer's until TLS replaces it)
    raw: asyncio.WriteTransport
    #: bytes read past the end of the last request (the next one's start)
    leftover: bytes = b''
    #: the last read was past the request's deadline (allowed once, for
    #: what arrived while the server itself was busy)
    late: bool = False

    def waiting(self) -> int:
        """Bytes that arrived and are not read yet: in the stream's buffer
        (which asyncio keeps as ``_buffer``) and in the socket's (the
        kernel's count, ``FIONREAD``)."""
        waiting = len(getattr(self.reader, '_buffer', b''))
        sock = self.raw.get_extra_info('socket')
        if sock is not None:
            count = array.array('i', [0])
            with contextlib.suppress(OSError, ValueError):
                fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
                waiting += count[0]
        return waiting

    def abort(self) -> None:
        transport = self.writer.transport or self.raw
        transport.abort()


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
        self._peers: dict[str, int] = {}
        self._numbers = itertools.count()
        self._pending = 0
        #: connections closed to make room for new ones
        self.evicted = 0
        #: connections refused at once (their peer's share taken, or every
        #: connection in use)
        self.refused = 0
        #: requests answered 408 for arriving slower than the byte-rate
        #: floor
        self.too_slow = 0

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
        """Stop serving and wait until :meth:`serve_forever` returned
        (at once when it is not serving)."""
        if not self._started or self._done.is_set():
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
                conn.abort()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

    # -- connections ------------------------------------------------------

    def _admit(self, peer: str) -> bool:
        """Make room for a connection from ``peer`` (see
        :mod:`~amdgpu_virt.k8s.api.connpolicy`).

        :returns: False to refuse it: the peer holds its share, or every
            connection is in use at a sensible pace.
        """
        limits = self.limits
        if self._peers.get(peer, 0) >= limits.max_connections_per_peer:
            return False
        if len(self._connections) < limits.max_connections:
            return True
        for conn in self._connections.values():
            if conn.state.state in (connpolicy.IDLE, connpolicy.READING):
                conn.state.waiting = conn.waiting()
        chosen = connpolicy.victim(
            (c.state for c in self._connections.values()),
            time.monotonic(), limits.min_request_rate)
        if chosen is None:
            return False
        victim = self._connections.pop(chosen.number)
        self._forget(victim)
        victim.abort()
        self.evicted += 1
        return True

    def _forget(self, conn: _Connection) -> None:
        peer = conn.state.peer
        left = self._peers.get(peer, 0) - 1
        if left > 0:
            self._peers[peer] = left
        else:
            self._peers.pop(peer, None)

    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        raw = writer.transport
        peer = writer.get_extra_info('peername') or ('?', 0)
        if not self._admit(str(peer[0])):
            self.refused += 1
            LOG.warning('%s: refusing a connection from %s (%d connections, '
                        '%d of them from it)', self.name, peer[0],
                        len(self._connections),
                        self._peers.get(str(peer[0]), 0))
            raw.abort()
            return
        state = connpolicy.ConnState(next(self._numbers), str(peer[0]),
                                     connpolicy.HANDSHAKE, time.monotonic())
        conn = _Connection(state, reader, writer, raw)
        self._connections[state.number] = conn
        self._peers[state.peer] = self._peers.get(state.peer, 0) + 1
        try:
            if self.tls is not None:
                await self._handshake(writer, raw)
            await self._requests(conn, reader, writer, tuple(peer[:2]))
        except (TimeoutError, asyncio.IncompleteReadError,
                ConnectionError, ssl.SSLError, OSError) as err:
            LOG.debug('%s: connection from %s ended: %r', self.name,
                      peer[0], err)
        except Exception:  # one connection never ends the server
            LOG.exception('%s: connection from %s failed', self.name,
                          peer[0])
        finally:
            if self._connections.pop(state.number, None) is not None:
                self._forget(conn)
            conn.abort()

    async def _handshake(self, writer: asyncio.StreamWriter,
                         raw: asyncio.WriteTransport) -> None:
        """The TLS handshake of a new connection, within its timeout.

        :raises ConnectionAbortedError: the connection was lost during
            the handshake (closed by the client, or evicted).
        """
        assert self.tls is not None
        # asyncio's start_tls gets no transport back when the connection
        # is lost during the handshake, and fails on it
        with contextlib.suppress(AttributeError):
            await writer.start_tls(
                self.tls.context(),
                ssl_handshake_timeout=self.limits.handshake_timeout)
        if writer.transport is None:
            # give the writer back its (closed) TCP transport, or its
            # __del__ fails on the missing one
            setattr(writer, '_transport', raw)  # noqa: B010
            raise ConnectionAbortedError('closed during the TLS handshake')

    async def _requests(self, conn: _Connection,
                        reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter,
                        peer: tuple[Any, ...]) -> None:
        limits = self.limits
        state = conn.state
        wait = limits.request_timeout
        while True:
            state.state = connpolicy.IDLE
            state.since = time.monotonic()
            state.received = 0
            first = conn.leftover
            conn.leftover = b''
            if not first:
                # in this task (not wait_for's own): what arrives is in
                # the stream's buffer until this very step takes it, so
                # the connection policy never sees a request in between
                async with asyncio.timeout(wait):
                    first = await reader.read(65536)
                if not first:
                    return   # closed between requests
            state.state = connpolicy.READING
            state.since = time.monotonic()
            wait = limits.idle_timeout
            try:
                raw = await self._read_request(conn, first, reader)
                state.state = connpolicy.WORKING
                answer, close = await self._dispatch(raw, peer, state.since)
            except _Refused as refused:
                answer, close = _answer(refused.code, refused.reason,
                                        refused.close), refused.close
            state.state = connpolicy.WORKING
            writer.write(answer)
            await asyncio.wait_for(writer.drain(), limits.write_timeout)
            state.served += 1
            if close:
                return

    async def _more(self, conn: _Connection,
                    reader: asyncio.StreamReader, most: int) -> bytes:
        """Up to ``most`` further bytes of the request under way, within
        its deadline and byte-rate floor.

        :raises _Refused: 408 when they do not come in time.
        """
        limits = self.limits
        state = conn.state
        deadline = min(state.since + limits.request_timeout,
                       state.since + limits.request_grace +
                       state.received / max(limits.min_request_rate, 1))
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                if conn.late or deadline >= state.since + \
                        limits.request_timeout:
                    raise TimeoutError
                # once: what arrived while this server was too busy to
                # read it counts (a slow client gets no more from it)
                conn.late = True
                remaining = 0.05
            async with asyncio.timeout(remaining):
                chunk = await reader.read(most)
        except TimeoutError:
            self.too_slow += 1
            if deadline >= state.since + limits.request_timeout:
                raise _Refused(408, 'the request did not arrive within '
                               '%g s' % limits.request_timeout) from None
            raise _Refused(408, 'the request arrived slower than %d bytes '
                           'a second' % limits.min_request_rate) from None
        if not chunk:
            raise asyncio.IncompleteReadError(b'', None)
        state.received += len(chunk)
        if conn.late and time.monotonic() < state.since + \
                limits.request_grace + state.received / max(
                    limits.min_request_rate, 1):
            conn.late = False   # back at the floor's pace
        return chunk

    async def _read_request(self, conn: _Connection, first: bytes,
                            reader: asyncio.StreamReader) -> bytes:
        limits = self.limits
        conn.state.received = len(first)
        conn.late = False
        data = bytearray(first)
        scanned = 0
        while True:
            end = data.find(b'\r\n\r\n', max(scanned - 3, 0))
            if end >= 0 or len(data) > limits.max_header_bytes:
                break
            scanned = len(data)
            data += await self._more(conn, reader, 65536)
        if end < 0 or end + 4 > limits.max_header_bytes:
            raise _Refused(431, 'the request head is larger than %d bytes'
                           % limits.max_header_bytes)
        head = bytes(data[:end + 4])
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
        if length > limits.max_body_bytes:
            raise _Refused(413, 'the request body (Content-Length %d) is '
                           'larger than the limit of %d bytes'
                           % (length, limits.max_body_bytes))
        body = data[end + 4:]
        while len(body) < length:
            body += await self._more(conn, reader, length - len(body))
        conn.leftover = bytes(body[length:])
        return head + bytes(body[:length])

    async def _dispatch(self, raw: bytes, peer: tuple[Any, ...],
                        received_at: float) -> tuple[bytes, bool]:
        limits = self.limits
        if self._pending >= limits.workers + limits.max_queue:
            raise _Refused(503, 'the server is busy (%d requests waiting); '
                           'retry' % self._pending, close=False)
        self._pending += 1
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._pool, self._handle, raw,
                                          peer, received_at)
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

    def _handle(self, raw: bytes, peer: tuple[Any, ...],
                received_at: float) -> tuple[bytes, bool]:
        """Replay one complete request to a handler; its answer."""
        handler = self.handler_class.__new__(self.handler_class)
        handler.rfile = io.BytesIO(raw)
        handler.wfile = io.BytesIO()
        handler.client_address = peer
        handler.server = self  # type: ignore[assignment]
        handler.close_connection = True
        handler.received_at = received_at  # type: ignore[attr-defined]
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
