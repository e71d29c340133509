"""The node lock (``hami.io/mutex.lock``), the handshake and bind phase
values, and unix-second times."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re

from amdgpu_virt.sharing.hami.common import _check_text
from amdgpu_virt.sharing.hami.common import _fail
from amdgpu_virt.sharing.hami.names import BIND_PHASE
from amdgpu_virt.sharing.hami.names import BIND_TIME
from amdgpu_virt.sharing.hami.names import NODE_LOCK
from amdgpu_virt.sharing.hami.names import NODE_LOCK_TIMEOUT


_RFC3339_RE = re.compile(
    r'([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})'
    r'(?:\.([0-9]{1,9}))?(Z|[+-][0-9]{2}:[0-9]{2})\Z')


def parse_rfc3339(text: str, key: str = NODE_LOCK,
                  value: str | None = None) -> datetime.datetime:
    """Parse an RFC 3339 time as Go's ``time.RFC3339`` layout reads it.

    :returns: an aware datetime (microsecond precision).
    :raises HamiProtocolError: not such a time.
    """
    match = _RFC3339_RE.match(text)
    if not match:
        _fail(key, text if value is None else value,
              '%r is not an RFC 3339 time such as 2026-01-02T15:04:05Z'
              % text)
    year, month, day, hour, minute, second = (
        int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    fraction = match.group(7) or ''
    zone = match.group(8)
    if zone == 'Z':
        tz = datetime.UTC
    else:
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        offset = datetime.timedelta(hours=hours, minutes=minutes)
        if hours > 23 or minutes > 59:
            _fail(key, text if value is None else value,
                  'time zone %s out of range' % zone)
        tz = datetime.timezone(-offset if zone[0] == '-' else offset)
    try:
        return datetime.datetime(
            year, month, day, hour, minute, second,
            int((fraction + '000000')[:6]), tzinfo=tz)
    except ValueError as exc:
        _fail(key, text if value is None else value,
              '%r is not a valid time: %s' % (text, exc))


def format_rfc3339(when: datetime.datetime) -> str:
    """Write ``when`` as Go's ``time.RFC3339`` layout does (seconds
    precision, ``Z`` for a zero offset).

    :raises HamiProtocolError: a naive datetime (its zone is unknown).
    """
    offset = when.utcoffset()
    if offset is None:
        _fail(NODE_LOCK, when.isoformat(),
              'a lock time needs a time zone')
    text = when.strftime('%Y-%m-%dT%H:%M:%S')
    if not offset:
        return text + 'Z'
    minutes = int(offset.total_seconds()) // 60
    sign = '-' if minutes < 0 else '+'
    minutes = abs(minutes)
    return '%s%s%02d:%02d' % (text, sign, minutes // 60, minutes % 60)


@dataclasses.dataclass(frozen=True)
class NodeLock:
    """Value of ``hami.io/mutex.lock``: when and by which pod.

    ``namespace`` and ``pod`` are None for the legacy bare-time form.
    """

    time: datetime.datetime
    namespace: str | None = None
    pod: str | None = None

    def expired(self, now: datetime.datetime,
                timeout: datetime.timedelta = NODE_LOCK_TIMEOUT) -> bool:
        """True once more than ``timeout`` has passed since the lock."""
        return now - self.time > timeout

    def held_by(self, namespace: str, pod: str) -> bool:
        return self.namespace == namespace and self.pod == pod

    def encode(self) -> str:
        return encode_node_lock(self)


def decode_node_lock(value: str, key: str = NODE_LOCK) -> NodeLock:
    """Decode ``<RFC3339>,<namespace>,<pod>`` or a bare RFC 3339 time.

    :raises HamiProtocolError: not 1 or 3 fields, a bad time, or an empty
        namespace or pod name.
    """
    if ',' not in value:
        return NodeLock(time=parse_rfc3339(value, key, value))
    parts = value.split(',')
    if len(parts) != 3:
        _fail(key, value, '%d fields, expected <time>,<namespace>,<pod> or '
              'a bare time' % len(parts))
    when = parse_rfc3339(parts[0], key, value)
    if not parts[1] or not parts[2]:
        _fail(key, value, 'empty namespace or pod name')
    return NodeLock(time=when, namespace=parts[1], pod=parts[2])


def encode_node_lock(lock: NodeLock) -> str:
    """Encode a node lock value (bare time when it has no pod).

    :raises HamiProtocolError: only one of namespace and pod, or one
        containing ``,``.
    """
    when = format_rfc3339(lock.time)
    if lock.namespace is None and lock.pod is None:
        return when
    if not lock.namespace or not lock.pod:
        _fail(NODE_LOCK, repr(lock), 'needs both a namespace and a pod')
    for text in (lock.namespace, lock.pod):
        _check_text(NODE_LOCK, 'a namespace or pod name', text, ',')
    return '%s,%s,%s' % (when, lock.namespace, lock.pod)


# --- handshake, bind phase, times --------------------------------------------

class HandshakeState(str, enum.Enum):
    """States of HAMi's node handshake annotations (other vendors; the AMD
    path judges health by the node's ``amd.com/gpu`` capacity)."""

    REQUESTING = 'Requesting'
    REPORTED = 'Reported'
    DELETED = 'Deleted'


#: Go's ``time.DateTime`` layout, in the writer's local time.
_HANDSHAKE_TIME = '%Y-%m-%d %H:%M:%S'
_HANDSHAKE_RE = re.compile(
    r'[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\Z')


@dataclasses.dataclass(frozen=True)
class Handshake:
    """``<State>_<YYYY-MM-DD HH:MM:SS>`` (naive local time)."""

    state: HandshakeState
    time: datetime.datetime

    def encode(self) -> str:
        return '%s_%s' % (self.state.value,
                          self.time.strftime(_HANDSHAKE_TIME))


def decode_handshake(value: str, key: str = 'hami.io/node-handshake'
                     ) -> Handshake:
    """Decode a handshake value such as ``Requesting_2026-01-02 15:04:05``.

    :raises HamiProtocolError: unknown state or bad time.
    """
    state, sep, when = value.partition('_')
    try:
        parsed_state = HandshakeState(state)
    except ValueError:
        _fail(key, value, 'state %r is none of %s' % (
            state, ', '.join(s.value for s in HandshakeState)))
    if not sep or not _HANDSHAKE_RE.match(when):
        _fail(key, value, 'expected <State>_YYYY-MM-DD HH:MM:SS')
    try:
        parsed = datetime.datetime.strptime(when, _HANDSHAKE_TIME)
    except ValueError as exc:
        _fail(key, value, 'bad time: %s' % exc)
    return Handshake(state=parsed_state, time=parsed)


class BindPhase(str, enum.Enum):
    """Values of ``hami.io/bind-phase``."""

    ALLOCATING = 'allocating'
    SUCCESS = 'success'
    FAILED = 'failed'


def decode_bind_phase(value: str, key: str = BIND_PHASE) -> BindPhase:
    """:raises HamiProtocolError: not one of the three phases."""
    try:
        return BindPhase(value)
    except ValueError:
        _fail(key, value, 'expected one of %s'
              % ', '.join(p.value for p in BindPhase))


def decode_unix_time(value: str, key: str = BIND_TIME) -> int:
    """Decode unix seconds (``hami.io/bind-time``, ``hami.io/vgpu-time``).

    :raises HamiProtocolError: not a non-negative decimal integer.
    """
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        _fail(key, value, 'expected unix seconds (decimal digits)')
    return int(value)


def encode_unix_time(seconds: int | float) -> str:
    return str(int(seconds))
