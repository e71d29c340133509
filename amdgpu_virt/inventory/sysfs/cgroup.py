"""Reading kubelet's container cgroups and their device memory (dmem).

The cgroup v2 hierarchy is below the sysfs root (``fs/cgroup``, or a root
of its own). Where the kernel has the ``dmem`` controller (Linux 6.14+,
listed in the root's ``cgroup.controllers``), every cgroup below the root
where it is enabled has ``dmem.current`` and ``dmem.max``, one line per
device memory region (``drm/<PCI address>/vram`` for amdgpu).

:func:`containers` finds the container cgroups kubelet made below the pod
cgroups, with both cgroup drivers (see
:mod:`amdgpu_virt.inventory.readings`); what a path says names the pod
by UID and the container by runtime id only: attributing it to a pod's
namespace, name and container is the caller's job. The walk is bounded
(pods and containers looked at) and never follows a link.
"""

from __future__ import annotations

import os

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import readings

#: bytes read of one dmem file (one line per region)
MAX_BYTES = 16 * 1024
#: directory names looked at in one cgroup directory
MAX_ENTRIES = 4096

_SYSTEMD_TOP = 'kubepods.slice'
_CGROUPFS_TOP = 'kubepods'


def default_root(sysfs_root: str) -> str:
    """The cgroup v2 root below a sysfs root."""
    return os.path.join(sysfs_root, layout.CGROUP_ROOT)


def has_dmem(cgroup_root: str) -> bool:
    """Whether the kernel lists the ``dmem`` controller."""
    try:
        raw = fileutil.read_bytes(os.path.join(
            cgroup_root, layout.CGROUP_CONTROLLERS), 'cgroup file', 4096,
            truncate=True)
    except (FileNotFoundError, exception.FileInputError):
        return False
    return 'dmem' in raw.decode('ascii', 'replace').split()


def _subdirs(path: str, problems: list[tuple[str, str]]) -> list[str]:
    try:
        with os.scandir(path) as entries:
            names: list[str] = []
            for entry in entries:
                if len(names) >= MAX_ENTRIES:
                    problems.append(('cgroup', '%s: more than %d entries; '
                                     'the rest ignored' % (path,
                                                           MAX_ENTRIES)))
                    break
                if entry.is_dir(follow_symlinks=False):
                    names.append(entry.name)
    except FileNotFoundError:
        return []
    except OSError as err:
        problems.append(('cgroup', '%s: cannot list: %s' % (
            path, err.strerror or err)))
        return []
    return sorted(names)


def containers(cgroup_root: str, max_containers: int = 4096
               ) -> tuple[list[readings.ContainerCgroup],
                          list[tuple[str, str]]]:
    """The container cgroups below kubelet's pod cgroups.

    :param max_containers: the walk stops after this many (a problem
        says so).
    :returns: (container cgroups sorted by path, problems).
    """
    problems: list[tuple[str, str]] = []
    found: list[readings.ContainerCgroup] = []
    for top, systemd in ((_SYSTEMD_TOP, True), (_CGROUPFS_TOP, False)):
        base = os.path.join(cgroup_root, top)
        if not os.path.isdir(base) or os.path.islink(base):
            continue
        for qos in readings.QOS_CLASSES:
            qdir = readings.qos_dir(qos, systemd)
            where = os.path.join(base, qdir) if qdir else base
            rel_where = os.path.join(top, qdir) if qdir else top
            for pod_dir in _subdirs(where, problems):
                uid = readings.pod_uid_of(pod_dir)
                if uid is None:
                    continue
                pod_path = os.path.join(where, pod_dir)
                for name in _subdirs(pod_path, problems):
                    cid = readings.container_id_of(name)
                    if cid is None:
                        continue
                    if len(found) >= max_containers:
                        problems.append(('cgroup', '%s: more than %d '
                                         'containers; the rest ignored'
                                         % (cgroup_root, max_containers)))
                        return sorted(found), problems
                    found.append(readings.ContainerCgroup(
                        pod_uid=uid, container_id=cid,
                        path=os.path.join(rel_where, pod_dir, name),
                        qos=qos))
    return sorted(found), problems


def read_dmem(cgroup_root: str, path: str, name: str
              ) -> tuple[dict[str, int | None] | None, str | None]:
    """(region -> bytes, problem) of the dmem file ``name`` of the cgroup
    ``path``; the mapping is None when the file is missing or bad."""
    full = os.path.join(cgroup_root, path, name)
    try:
        raw = fileutil.read_bytes(full, 'cgroup file', MAX_BYTES)
    except FileNotFoundError:
        return None, None
    except exception.FileInputError as err:
        return None, '%s: unreadable: %s' % (full, err.kwargs.get('reason'))
    try:
        return readings.parse_dmem(raw, full), None
    except exception.SysfsValueError as err:
        return None, '%s: bad value %r: %s' % (
            full, err.kwargs.get('value'), err.kwargs.get('reason'))
