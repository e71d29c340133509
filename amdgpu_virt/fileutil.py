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
nothing.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile

from amdgpu_virt import exception

LOG = logging.getLogger(__name__)

#: name prefix of the temporary files of :func:`atomic_write`
TEMP_PREFIX = '.amdgpu-virt-'
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


def atomic_write(path: str, content: str, mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` through a temporary file and a rename.

    :raises OutputError: naming the path when it cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMP_PREFIX)
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
