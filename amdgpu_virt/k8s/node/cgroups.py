"""Finding a pod's cgroup on the node, and reading and writing cgroup
files safely.

Where kubelet puts a pod's cgroup is
:mod:`amdgpu_virt.inventory.podcgroups` (the names, shared with the
node's telemetry); this module finds them on the node. The pod cgroup
exists before kubelet calls the device plugin's ``PreStartContainer``:
kubelet creates it in ``SyncPod`` before the runtime creates any
container.

:class:`CgroupFs` reads and writes the files of a cgroup v2 hierarchy
below a root (``/sys/fs/cgroup``, or a test tree): every directory on the
way is opened with ``O_NOFOLLOW`` relative to its parent, so a symbolic
link planted in the tree never leads out of it; only regular files are
read, within a size bound. Every refusal names the file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.inventory.podcgroups import Driver
from amdgpu_virt.inventory.podcgroups import driver_setting
from amdgpu_virt.inventory.podcgroups import kubelet_root_parts
from amdgpu_virt.inventory.podcgroups import kubepods_cgroup
from amdgpu_virt.inventory.podcgroups import NAME
from amdgpu_virt.inventory.podcgroups import Parts
from amdgpu_virt.inventory.podcgroups import pod_cgroup
from amdgpu_virt.inventory.podcgroups import qos_cgroup
from amdgpu_virt.inventory.podcgroups import QosClass

__all__ = ['CgroupFs', 'Driver', 'Parts', 'QosClass', 'check_v2',
           'detect_driver', 'display', 'driver_setting', 'find_pod',
           'kubelet_root_parts', 'pod_cgroup', 'qos_cgroup', 'qos_of']

#: a cgroup interface file is small; anything larger is not one
MAX_FILE_BYTES = 64 * 1024


def qos_of(pod: Mapping[str, Any]) -> QosClass | None:
    """The pod's ``status.qosClass`` (None when absent or unknown)."""
    status = pod.get('status')
    value = status.get('qosClass') if isinstance(status, Mapping) else None
    try:
        return QosClass(value)
    except ValueError:
        return None


def display(root: str, parts: Sequence[str], name: str | None = None
            ) -> str:
    return os.path.join(root, *parts, *((name,) if name else ()))


class CgroupFs:
    """The files of a cgroup v2 hierarchy below ``root``.

    :param root: where the hierarchy is mounted (``/sys/fs/cgroup`` on a
        node, the host's mounted into a pod, or a test tree). ``root``
        itself may be a link (an administrator's choice); nothing below it
        is followed.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def where(self, parts: Sequence[str], name: str | None = None) -> str:
        return display(self.root, parts, name)

    # -- directories ----------------------------------------------------------
    def _open_root(self) -> int:
        try:
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY
                           | os.O_CLOEXEC)
        except OSError as err:
            raise exception.CgroupError(
                path=self.root, reason='cannot open the cgroup root (%s)'
                % (err.strerror or err)) from None

    def _open_dir(self, parts: Sequence[str]) -> int:
        """A descriptor of the directory ``parts`` below the root.

        :raises FileNotFoundError: a directory on the way is missing.
        :raises CgroupError: a part is a link or not a directory, or not a
            plain name.
        """
        fd = self._open_root()
        try:
            for n, part in enumerate(parts):
                if not isinstance(part, str) or not NAME.match(part):
                    raise exception.CgroupError(
                        path=self.where(parts[:n]),
                        reason='%.80r is not a cgroup name' % (part,))
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY
                                    | os.O_NOFOLLOW | os.O_CLOEXEC,
                                    dir_fd=fd)
                except OSError as err:
                    if err.errno == errno.ENOENT:
                        raise FileNotFoundError(
                            errno.ENOENT, 'no such cgroup',
                            self.where(parts[:n + 1])) from None
                    raise exception.CgroupError(
                        path=self.where(parts[:n + 1]),
                        reason=self._why(err, part, fd)) from None
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _why(err: OSError, name: str, dir_fd: int) -> str:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return err.strerror or str(err)
        if stat.S_ISLNK(info.st_mode):
            return 'a symbolic link (not followed: a cgroup is never a link)'
        if not stat.S_ISDIR(info.st_mode):
            return 'not a directory'
        return err.strerror or str(err)

    def is_dir(self, parts: Sequence[str]) -> bool:
        """Whether the cgroup ``parts`` exists (as a real directory).

        :raises CgroupError: it, or a parent, is a link or not a
            directory (fail closed: something replaced a cgroup).
        """
        try:
            fd = self._open_dir(parts)
        except FileNotFoundError:
            return False
        os.close(fd)
        return True

    def children(self, parts: Sequence[str]) -> Iterator[str]:
        """Names of the sub-directories of a cgroup (links skipped)."""
        fd = self._open_dir(parts)
        try:
            names = os.listdir(fd)
            for name in sorted(names):
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    yield name
        finally:
            os.close(fd)

    # -- files ----------------------------------------------------------------
    def _open_file(self, parts: Sequence[str], name: str, flags: int) -> int:
        dir_fd = self._open_dir(parts)
        try:
            try:
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC
                             | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
            except OSError as err:
                if err.errno == errno.ENOENT:
                    raise FileNotFoundError(
                        errno.ENOENT, 'no such file',
                        self.where(parts, name)) from None
                raise exception.CgroupError(
                    path=self.where(parts, name),
                    reason=self._why(err, name, dir_fd)) from None
        finally:
            os.close(dir_fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise exception.CgroupError(
                path=self.where(parts, name), reason='not a regular file')
        return fd

    def read(self, parts: Sequence[str], name: str,
             limit: int = MAX_FILE_BYTES) -> str:
        """The text of a cgroup file (at most ``limit`` bytes).

        :raises FileNotFoundError: it does not exist.
        :raises CgroupError: a link, not a regular file, larger than
            ``limit``, not text, or unreadable; naming it.
        """
        fd = self._open_file(parts, name, os.O_RDONLY)
        try:
            data = fileutil.read_fd(fd, limit)
        except OSError as err:
            raise exception.CgroupError(
                path=self.where(parts, name), reason='cannot read it (%s)'
                % (err.strerror or err)) from None
        finally:
            os.close(fd)
        if len(data) > limit:
            raise exception.CgroupError(
                path=self.where(parts, name),
                reason='larger than %d bytes: not a cgroup file' % limit)
        try:
            return data.decode('ascii')
        except UnicodeDecodeError:
            raise exception.CgroupError(
                path=self.where(parts, name),
                reason='not ASCII text: not a cgroup file') from None

    def write(self, parts: Sequence[str], name: str,
              lines: Sequence[str]) -> None:
        """Write ``lines``, one ``write()`` each (the kernel takes one
        setting per write), to an existing cgroup file.

        :raises FileNotFoundError: it does not exist.
        :raises CgroupError: naming the file and the kernel's answer.
        """
        fd = self._open_file(parts, name, os.O_WRONLY | os.O_TRUNC)
        try:
            for line in lines:
                data = (line if line.endswith('\n') else line + '\n')
                os.write(fd, data.encode('ascii'))
        except OSError as err:
            raise exception.CgroupError(
                path=self.where(parts, name), reason='the kernel refused '
                '%r: %s' % (lines[0] if len(lines) == 1 else list(lines),
                            os.strerror(err.errno) if err.errno
                            else err), errno=err.errno) from None
        finally:
            os.close(fd)


# -- finding kubelet's cgroups ------------------------------------------------

def check_v2(fs: CgroupFs) -> None:
    """Fail unless ``fs`` is a cgroup v2 (unified) hierarchy.

    :raises CgroupError: a cgroup v1 or hybrid node (naming what was
        found), or no cgroup hierarchy at all.
    """
    try:
        fs.read((), 'cgroup.controllers')
        return
    except FileNotFoundError:
        pass
    v1 = [name for name in ('memory', 'cpu,cpuacct', 'cpu', 'devices',
                            'unified', 'systemd') if fs.is_dir((name,))]
    if v1:
        raise exception.CgroupError(
            path=fs.root, reason='a cgroup v1 (or hybrid) hierarchy (%s); '
            'the dmem controller exists only in the unified cgroup v2 '
            'hierarchy (boot with systemd.unified_cgroup_hierarchy=1)'
            % ', '.join(v1))
    raise exception.CgroupError(
        path=fs.root, reason='no cgroup.controllers: not a cgroup v2 '
        'hierarchy (mount the host\'s /sys/fs/cgroup there)')


def detect_driver(fs: CgroupFs, driver: Driver | None = None,
                  root: Sequence[str] = ()) -> Driver:
    """kubelet's cgroup driver, from the ``kubepods`` cgroup it made.

    :param driver: the configured driver (None: whichever exists).
    :raises CgroupNotFound: no kubepods cgroup of ``driver`` (or of
        either, or of both when none is configured).
    """
    found = [d for d in (driver,) if d is not None] or list(Driver)
    present = [d for d in found if fs.is_dir(kubepods_cgroup(d, root))]
    if len(present) == 1:
        return present[0]
    names = ' and '.join(fs.where(kubepods_cgroup(d, root))
                         for d in found)
    if not present:
        raise exception.CgroupNotFound(
            owner='kubelet\'s pods', reason='%s %s not exist (kubelet '
            'runs without --cgroups-per-qos, with another --cgroup-root, '
            'or the host\'s cgroup hierarchy is not mounted at %s)' % (
                names, 'does' if len(found) == 1 else 'do', fs.root))
    raise exception.CgroupNotFound(
        owner='kubelet\'s pods', reason='both %s exist; set [kubernetes] '
        'cgroup_driver to kubelet\'s --cgroup-driver' % names)


def find_pod(fs: CgroupFs, driver: Driver, uid: str,
             qos: QosClass | None = None,
             root: Sequence[str] = ()) -> Parts:
    """The pod's cgroup: the one of its QoS class (every class when it
    is not known) that exists.

    :raises CgroupNotFound: none exists, or more than one (naming them).
    :raises CgroupError: one is a link or not a directory.
    """
    classes = [qos] if qos is not None else list(QosClass)
    paths = [pod_cgroup(driver, c, uid, root) for c in classes]
    present = [p for p in paths if fs.is_dir(p)]
    if len(present) == 1:
        return present[0]
    owner = 'pod uid %s' % uid
    if not present:
        raise exception.CgroupNotFound(
            owner=owner, reason='%s %s not exist (the pod has not been '
            'created on this node, or has ended)' % (
                ' nor '.join(fs.where(p) for p in paths),
                'does' if len(paths) == 1 else 'do'))
    raise exception.CgroupNotFound(
        owner=owner, reason='it exists in more than one QoS class: %s'
        % ', '.join(fs.where(p) for p in present))
