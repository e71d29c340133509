"""Reading input files within bounds; writing rendered files idempotently.

Every file the project reads that a user or a node controls (ledgers,
fleet and workload files, snapshots, move state, sysfs values) goes
through :func:`read_bytes` or :func:`read_text`: only regular files are
opened (a FIFO, socket or device node such as ``/dev/zero`` is refused
before it is opened, so nothing blocks or streams forever), at most
``limit`` bytes are read, and text must be UTF-8; every refusal is a
:class:`~amdgpu_virt.exception.FileInputError` naming the file.

Every file the project writes (rendered configuration, ledgers, move state,
charts) goes through :func:`atomic_write` or :func:`write_if_changed`: a
reader never sees half a file, and a second run with nothing changed writes
nothing. A writer killed half-way leaves a temporary file named for its
host and process; the writers of output trees remove those of writers
that are gone (:func:`remove_stale_temps`) on their next run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Iterable

from amdgpu_virt import exception

LOG = logging.getLogger(__name__)

#: name prefix of the temporary files of :func:`atomic_write`
TEMP_PREFIX = '.amdgpu-virt-'
#: a temporary file of :func:`atomic_write`: its writer's host (a digest)
#: and process id, then mkstemp's random part; or the older form, without
#: an owner
_TEMP_NAME = re.compile(r'^%s(?:tmp-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-)?'
                        r'[a-z0-9_]{8}$' % re.escape(TEMP_PREFIX))
#: seconds after which a temporary file whose writer cannot be asked (on
#: another host, or of the older form) is stale: no write takes that long
STALE_AFTER = 600.0
#: default size limit of an input file (bytes)
MAX_INPUT_BYTES = 16 * 1024 * 1024

_KINDS = ((stat.S_ISFIFO, 'a FIFO'), (stat.S_ISSOCK, 'a socket'),
          (stat.S_ISCHR, 'a character device'),
          (stat.S_ISBLK, 'a block device'), (stat.S_ISDIR, 'a directory'))


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return 'not a regular file'


def read_bytes(path: str, what: str = 'file',
               limit: int = MAX_INPUT_BYTES, truncate: bool = False) -> bytes:
    """The content of the regular file ``path``, at most ``limit`` bytes.

    Symbolic links are followed; what they lead to must be a regular file.

    :param what: what the file is (``ledger``, ``sysfs value``...), for
        the error.
    :param truncate: return the first ``limit`` bytes of a larger file
        (as the kernel serves at most a page of a sysfs attribute) rather
        than refuse it.
    :raises FileNotFoundError: it does not exist (callers decide whether
        that is an error).
    :raises FileInputError: not a regular file, larger than ``limit``, or
        unreadable, naming it.
    """
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            # never open it: a FIFO blocks, a device may stream forever
            raise exception.FileInputError(
                what=what, path=path, reason='it is %s, not a regular file'
                % _kind(before.st_mode))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            after = os.fstat(fd)
            if not stat.S_ISREG(after.st_mode):  # replaced since stat()
                raise exception.FileInputError(
                    what=what, path=path, reason='it is %s, not a regular '
                    'file' % _kind(after.st_mode))
            data = read_fd(fd, limit)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise exception.FileInputError(
            what=what, path=path, reason='cannot read it: %s'
            % (err.strerror or err)) from None
    if len(data) > limit:
        if truncate:
            return data[:limit]
        raise exception.FileInputError(
            what=what, path=path, reason='larger than %d bytes' % limit)
    return data


def read_fd(fd: int, limit: int) -> bytes:
    """At most ``limit + 1`` bytes from ``fd``: more than ``limit`` says
    the file is larger than allowed, without reading it all.

    :raises OSError: the read failed.
    """
    chunks = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b''.join(chunks)


def decode_text(data: bytes, path: str, what: str = 'file') -> str:
    """``data`` (the content of ``path``) as UTF-8 text.

    :raises FileInputError: not UTF-8 or holding NUL bytes, naming the
        offset of the first bad byte.
    """
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as err:
        raise exception.FileInputError(
            what=what, path=path, reason='not UTF-8 text (byte %d is '
            '0x%02x)' % (err.start, data[err.start])) from None
    if '\x00' in text:
        raise exception.FileInputError(
            what=what, path=path, reason='binary data (NUL byte at %d)'
            % text.index('\x00'))
    return text


def read_text(path: str, what: str = 'file',
              limit: int = MAX_INPUT_BYTES) -> str | None:
    """The UTF-8 text of ``path`` (see :func:`read_bytes`), or None when
    it does not exist.

    :raises FileInputError: naming the path when it cannot be used.
    """
    try:
        data = read_bytes(path, what, limit)
    except FileNotFoundError:
        return None
    return decode_text(data, path, what)


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def temp_prefix(pid: int | None = None) -> str:
    """The name prefix of the temporary files of process ``pid`` of this
    host (default: this process)."""
    return '%stmp-%s-%d-' % (TEMP_PREFIX, _host_tag(),
                             os.getpid() if pid is None else pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # someone else's process: alive
        return True
    return True


def is_stale_temp(directory: str, name: str, now: float | None = None
                  ) -> bool:
    """Whether ``name`` in ``directory`` is a temporary file of
    :func:`atomic_write` that no write will finish: its writer (on this
    host) is gone, or, when its writer cannot be asked (another host, or
    a name of the older form without one), it is older than
    :data:`STALE_AFTER`. Never one of this process's own."""
    match = _TEMP_NAME.match(name)
    if match is None:
        return False
    if match.group('pid') is not None and match.group('host') == \
            _host_tag():
        pid = int(match.group('pid'))
        return pid != os.getpid() and not _alive(pid)
    try:
        age = (time.time() if now is None else now) - os.lstat(
            os.path.join(directory, name)).st_mtime
    except OSError:
        return False
    return age > STALE_AFTER


def stale_temps(directories: Iterable[str]) -> list[str]:
    """The stale temporary files (see :func:`is_stale_temp`) in
    ``directories`` (not below them), sorted; a directory that does not
    exist has none."""
    found: list[str] = []
    now = time.time()
    for directory in sorted(set(directories)):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found.extend(os.path.join(directory, name) for name in names
                     if is_stale_temp(directory, name, now))
    return sorted(found)


def remove_stale_temps(directories: Iterable[str]) -> list[str]:
    """Remove the stale temporary files in ``directories``, which an
    interrupted writer (killed, out of disk) left beside its targets.

    :returns: the paths removed.
    :raises AmdgpuVirtError: one cannot be removed (naming it).
    """
    removed = []
    for path in stale_temps(directories):
        if remove(path):
            LOG.info('removed the stale temporary file %s', path)
            removed.append(path)
    return removed


def remove(path: str) -> bool:
    """Remove the file ``path``.

    :returns: False when it was gone already.
    :raises AmdgpuVirtError: it cannot be removed (naming it).
    """
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    except OSError as err:
        raise exception.AmdgpuVirtError('cannot remove %s: %s' % (
            path, err.strerror)) from None
    return True


def atomic_write(path: str, content: str, mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` through a temporary file and a rename.

    The temporary file is named for this host and process, so that a
    later writer can tell one left by a killed process from one being
    written (:func:`remove_stale_temps`).

    :raises OutputError: naming the path when it cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=temp_prefix())
        try:
            with os.fdopen(fd, 'w', encoding='utf-8') as handle:
                handle.write(content)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as err:
        raise exception.OutputError(
            path=path, reason=err.strerror or str(err)) from None
    LOG.debug('wrote %s', path)


def write_if_changed(path: str, content: str, mode: int = 0o644) -> bool:
    """Write ``content`` to ``path`` unless it already holds exactly that.

    :returns: True if the file was written.
    :raises OutputError: naming the path when it cannot be written (or
        what is there is not a regular file).
    """
    try:
        current = read_text(path)
    except exception.FileInputError as err:
        # a directory, FIFO or device where the file should go
        raise exception.OutputError(
            path=path, reason=err.kwargs.get('reason', str(err))) from None
    if current == content:
        LOG.debug('%s is up to date', path)
        return False
    atomic_write(path, content, mode)
    return True
