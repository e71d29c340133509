"""Which connection an HTTP server gives up when it is full (pure).

:class:`amdgpu_virt.k8s.api.httpserver.Server` holds at most
``max_connections`` connections, and at most ``max_connections_per_peer``
from one address. A connection is in one of four states:

``handshake``
    accepted, its TLS handshake under way;
``idle``
    waiting for the first byte of its next (or first) request;
``reading``
    a request under way: its first byte arrived, not yet all of it;
``working``
    a complete request with a worker, or its answer being written.

When a new connection arrives at the limit, :func:`victim` chooses the
connection to close for it, in this order:

1. a connection that has not sent a whole request yet, in its handshake
   or idle, the one waiting longest first (what a flood of silent
   connections is made of);
2. a kept-alive idle connection, the one waiting longest first (its
   client reconnects when it needs to);
3. a connection reading a request slower than the byte-rate floor
   (``min_rate`` bytes a second since the request's first byte), the
   slowest first.

A connection reading at the floor or faster, one whose next request has
arrived but is not read yet (the server was busy), and a working one are
never closed: a handshake can evict no client in the middle of a request that
arrives at a sensible pace. With nothing to close, the new connection is
refused. A peer already holding its share is refused before anything is
closed for it, so one address can never take the slots of others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

HANDSHAKE = 'handshake'
IDLE = 'idle'
READING = 'reading'
WORKING = 'working'


@dataclasses.dataclass
class ConnState:
    """What the policy knows of one connection.

    :ivar number: the order of arrival (ties go to the older).
    :ivar peer: the client's address.
    :ivar state: one of the four states above.
    :ivar since: when the state was entered (monotonic seconds); for
        ``reading``, the time of the request's first byte.
    :ivar received: bytes of the current request read so far.
    :ivar waiting: bytes of it that arrived and are not read yet (a busy
        server reads late; the client is not slow for that).
    :ivar served: requests answered on this connection.
    """

    number: int
    peer: str
    state: str = HANDSHAKE
    since: float = 0.0
    received: int = 0
    served: int = 0
    waiting: int = 0


def below_floor(conn: ConnState, now: float, min_rate: float) -> bool:
    """Whether ``conn``'s request arrives slower than ``min_rate`` bytes a
    second, counted from its first byte."""
    return conn.state == READING and \
        conn.received + conn.waiting < min_rate * (now - conn.since)


def victim(conns: Iterable[ConnState], now: float,
           min_rate: float) -> ConnState | None:
    """The connection to close for a new one (None: close none, refuse
    the new one)."""
    fresh: list[ConnState] = []
    kept: list[ConnState] = []
    slow: list[ConnState] = []
    for conn in conns:
        if conn.state == IDLE and conn.waiting:
            continue   # its request has begun; judged once it is read
        if conn.state in (HANDSHAKE, IDLE):
            (kept if conn.served else fresh).append(conn)
        elif below_floor(conn, now, min_rate):
            slow.append(conn)
    for group in (fresh, kept):
        if group:
            return min(group, key=lambda c: (c.since, c.number))
    if slow:
        return min(slow, key=lambda c: (
            (c.received + c.waiting) / max(now - c.since, 1e-9), c.number))
    return None
