"""Reading kubelet's container cgroups and their device memory (dmem).

The cgroup v2 hierarchy is the host's (``[kubernetes] cgroup_root``, the
one the device plugin writes caps in). Where the kernel has the ``dmem``
controller (Linux 6.14+, listed in the root's ``cgroup.controllers``),
every cgroup below the root where it is enabled has ``dmem.current`` and
``dmem.max``, one line per device memory region (``drm/<PCI
address>/vram`` for amdgpu).

:func:`containers` finds the container cgroups kubelet made below the pod
cgroups, with either cgroup driver and below kubelet's own cgroup root
(the names of :mod:`amdgpu_virt.inventory.podcgroups`, which the device
plugin's caps use too); what a path says names the pod by UID and the
container by runtime id only: attributing it to a pod's
namespace, name and container is the caller's job. The walk is bounded
(pods and containers looked at) and never follows a link.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import podcgroups
from amdgpu_virt.inventory import readings

#: bytes read of one dmem file (one line per region)
MAX_BYTES = 16 * 1024
#: directory names looked at in one cgroup directory
MAX_ENTRIES = 4096


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


def containers(cgroup_root: str, max_containers: int = 4096,
               kubelet_root: Sequence[str] = (),
               drivers: Sequence[podcgroups.Driver] = tuple(
                   podcgroups.Driver)
               ) -> tuple[list[readings.ContainerCgroup],
                          list[tuple[str, str]]]:
    """The container cgroups below kubelet's pod cgroups.

    :param max_containers: the walk stops after this many (a problem
        says so).
    :param kubelet_root: kubelet's ``--cgroup-root`` as name parts
        (:func:`~amdgpu_virt.inventory.podcgroups.kubelet_root_parts`).
    :param drivers: kubelet's cgroup driver, or both when not known.
    :returns: (container cgroups sorted by path, problems).
    """
    problems: list[tuple[str, str]] = []
    found: list[readings.ContainerCgroup] = []
    for driver in drivers:
        top = podcgroups.kubepods_cgroup(driver, kubelet_root)
        if not _is_dir(cgroup_root, top):
            continue
        for qos in podcgroups.QosClass:
            parts = podcgroups.qos_cgroup(driver, qos, kubelet_root)
            if not _is_dir(cgroup_root, parts):
                continue
            rel_where = os.path.join(*parts)
            where = os.path.join(cgroup_root, rel_where)
            for pod_dir in _subdirs(where, problems):
                uid = podcgroups.pod_uid_in(pod_dir, driver, qos,
                                            kubelet_root)
                if uid is None:
                    continue
                for name in _subdirs(os.path.join(where, pod_dir),
                                     problems):
                    cid = podcgroups.container_id_of(name)
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
                        qos=qos.value))
    return sorted(found), problems


def _is_dir(cgroup_root: str, parts: Sequence[str]) -> bool:
    """Whether every directory of ``parts`` below the root is one (no
    link on the way)."""
    path = cgroup_root
    for part in parts:
        path = os.path.join(path, part)
        if os.path.islink(path) or not os.path.isdir(path):
            return False
    return True


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
