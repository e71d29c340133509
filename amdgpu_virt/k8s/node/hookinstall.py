"""Install the memory-limit hook library on a node.

``amdgpu-virt k8s install-hook --from SRC --to DST`` runs in an init
container of the node pods (the chart's ``node.memoryHook.install``) and
copies HAMi's ``libamvgpu.so`` from an image onto the host, where kubelet
mounts it into shared containers (``LD_AUDIT``). :func:`install`:

* checks the source with the node's own check (:func:`.memhook.validate`:
  a regular file, an ELF shared object for this host's class, byte order
  and machine, whole) before anything is written;
* leaves the target alone when it already holds the same bytes (only its
  mode is corrected), so a restart of the node pods rewrites nothing;
* otherwise writes a temporary file in the target's directory, fsyncs it,
  checks that copy again and renames it over the target, then fsyncs the
  directory: a process loading the library sees the old file or the new
  one, never half of one, and a running process keeps the file it mapped;
* works through a descriptor of the target directory opened without
  following a symbolic link (a directory replaced by a link is refused),
  never follows a link at the target (it is replaced, not written
  through), and holds an exclusive ``flock`` on the directory, so two
  installers on one node (two pods of a rolling update, the device plugin
  and the DRA plugin) take turns; a temporary file left by a killed run is
  removed by the next one.

Every refusal is a :class:`~amdgpu_virt.exception.HookInstallError`
naming the file: the source (missing, not a usable library), the target
(its directory missing or a link, not writable, no room) or the lock.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import memhook
import contextlib

LOG = logging.getLogger(__name__)

#: name prefix of the temporary copies (``.<prefix><name>.<random>``)
TEMP_PREFIX = '.amdgpu-virt-hook.'
#: the installed library's mode: read and map for everyone, no writes
MODE = 0o555
#: default seconds to wait for another installer's lock
LOCK_TIMEOUT = 30.0
_CHUNK = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Installed:
    """What :func:`install` did.

    :param action: ``installed`` (there was no library), ``replaced``
        (there was another file) or ``unchanged`` (the same bytes).
    """

    path: str
    source: str
    action: str
    size: int
    sha256: str

    def __str__(self) -> str:
        facts = '%d bytes, sha256 %s' % (self.size, self.sha256)
        if self.action == 'unchanged':
            return '%s is up to date (%s)' % (self.path, facts)
        return '%s %s from %s (%s)' % (self.action, self.path, self.source,
                                       facts)


def _target_error(path: str, reason: str) -> exception.HookTargetError:
    return exception.HookTargetError(path=path, reason=reason)


def _open_source(source: str,
                 host: tuple[int, str, int | None] | None) -> int:
    """A descriptor of the checked source (the caller closes it)."""
    try:
        memhook.validate(source, host)
    except exception.MemoryHookError as err:
        reason = str(err.kwargs.get('reason', err))
        if reason == 'no such file' or reason.startswith('cannot '):
            raise exception.HookSourceMissing(path=source,
                                              reason=reason) from None
        raise exception.HookSourceInvalid(path=source,
                                          reason=reason) from None
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise exception.HookSourceMissing(
            path=source, reason='cannot open it (%s)' % err.strerror
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise exception.HookSourceInvalid(
            path=source, reason='it changed into a non-regular file')
    return fd


def _open_directory(target: str) -> int:
    directory = os.path.dirname(target)
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY |
                       os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ENOENT:
            reason = 'its directory %s does not exist' % directory
        elif err.errno in (errno.ELOOP, errno.ENOTDIR):
            reason = ('its directory %s is a symbolic link or not a '
                      'directory; give the real directory' % directory)
        else:
            reason = 'cannot open its directory %s (%s)' % (
                directory, err.strerror)
        raise _target_error(target, reason) from None


def _lock(dir_fd: int, target: str, timeout: float,
          clock: Callable[[], float],
          sleep: Callable[[float], None]) -> None:
    deadline = clock() + timeout
    while True:
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if clock() >= deadline:
                raise exception.HookInstallBusy(
                    path=target, seconds=timeout) from None
            sleep(0.05)


def _remove_stale(dir_fd: int, name: str) -> None:
    """Temporary copies a killed run left (we hold the lock)."""
    prefix = TEMP_PREFIX + name + '.'
    for entry in os.listdir(dir_fd):
        if not entry.startswith(prefix):
            continue
        try:
            info = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(entry, dir_fd=dir_fd)
                LOG.info('removed %s, left by an interrupted install',
                         entry)
        except FileNotFoundError:
            continue


def _what_is(dir_fd: int, name: str) -> str:
    """What is at the target now (never following a link)."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return 'absent'
    if stat.S_ISLNK(info.st_mode):
        return 'a symbolic link'
    if stat.S_ISDIR(info.st_mode):
        return 'a directory'
    if not stat.S_ISREG(info.st_mode):
        return 'not a regular file'
    return 'another file'


def _same_bytes(src_fd: int, dir_fd: int, name: str) -> tuple[bool, str]:
    """(whether the target holds the source's bytes, what it is now)."""
    found = _what_is(dir_fd, name)
    if found != 'another file':
        return False, found
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return False, 'absent'
    try:
        info = os.fstat(fd)
        if (not stat.S_ISREG(info.st_mode) or
                info.st_size != os.fstat(src_fd).st_size):
            return False, found
        offset = 0
        while True:
            theirs = os.pread(fd, _CHUNK, offset)
            ours = os.pread(src_fd, _CHUNK, offset)
            if theirs != ours:
                return False, found
            if not ours:
                break
            offset += len(ours)
        if stat.S_IMODE(info.st_mode) != MODE:
            os.fchmod(fd, MODE)
        return True, 'the same file'
    finally:
        os.close(fd)


def _copy(src_fd: int, dir_fd: int, tmp: str,
          source: str) -> tuple[int, str]:
    """Copy the source into the new file ``tmp``: (size, sha256)."""
    digest = hashlib.sha256()
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                  os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    size = 0
    try:
        while True:
            chunk = os.pread(src_fd, _CHUNK, size)
            if not chunk:
                break
            size += len(chunk)
            if size > memhook.MAX_SIZE:
                raise exception.HookSourceInvalid(
                    path=source, reason='it grew past %d bytes while being '
                    'copied' % memhook.MAX_SIZE)
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
        os.fchmod(out, MODE)
        os.fsync(out)
    finally:
        os.close(out)
    return size, digest.hexdigest()


def _sha256(fd: int) -> tuple[int, str]:
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return offset, digest.hexdigest()


def install(source: str, target: str,
            host: tuple[int, str, int | None] | None = None,
            lock_timeout: float = LOCK_TIMEOUT,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> Installed:
    """Make ``target`` hold the library ``source``, checked and whole.

    :param host: (ELF class, byte order, e_machine) the library must be
        built for; default: this host's (see :func:`.memhook.validate`).
    :param lock_timeout: seconds to wait for another installer.
    :raises HookSourceMissing: the source cannot be read.
    :raises HookSourceInvalid: the source is not a usable library.
    :raises HookTargetError: the target cannot be written (its directory
        missing or a link, a directory in its place, read-only, full).
    :raises HookInstallBusy: another installer held the lock too long.
    """
    name = os.path.basename(target)
    if not name or name in ('.', '..'):
        raise _target_error(target, 'not a file name')
    target = os.path.abspath(target)
    src_fd = _open_source(source, host)
    try:
        dir_fd = _open_directory(target)
        try:
            _lock(dir_fd, target, lock_timeout, clock, sleep)
            return _install_locked(src_fd, dir_fd, source, target, name,
                                   host)
        finally:
            os.close(dir_fd)  # releases the lock
    finally:
        os.close(src_fd)


def _install_locked(src_fd: int, dir_fd: int, source: str, target: str,
                    name: str, host: tuple[int, str, int | None] | None
                    ) -> Installed:
    try:
        _remove_stale(dir_fd, name)
        same, found = _same_bytes(src_fd, dir_fd, name)
    except OSError as err:
        raise _target_error(target, 'cannot read it or its directory (%s)'
                            % err.strerror) from None
    if same:
        size, sha = _sha256(src_fd)
        LOG.debug('%s already holds %s (%d bytes)', target, source, size)
        return Installed(target, source, 'unchanged', size, sha)
    if found == 'a directory':
        raise _target_error(target, 'it is a directory')
    tmp = '%s%s.%s' % (TEMP_PREFIX, name, secrets.token_hex(8))
    try:
        size, sha = _copy(src_fd, dir_fd, tmp, source)
        # the copy is what processes will load: check it, not the source
        try:
            memhook.validate('/proc/self/fd/%d/%s' % (dir_fd, tmp), host)
        except exception.MemoryHookError as err:
            raise exception.HookSourceInvalid(
                path=source, reason='its copy is not usable (%s); did it '
                'change while being copied?' % err.kwargs.get('reason')
            ) from None
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError as err:
        _unlink_quietly(dir_fd, tmp)
        raise _target_error(target, 'cannot write it (%s)'
                            % err.strerror) from None
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    action = 'installed' if found == 'absent' else 'replaced'
    if found not in ('absent', 'another file'):
        LOG.warning('%s was %s; replaced it with the library', target,
                    found)
    LOG.debug('%s %s from %s (%d bytes)', action, target, source, size)
    return Installed(target, source, action, size, sha)


def _unlink_quietly(dir_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)
