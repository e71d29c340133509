"""Where kubelet puts pod and container cgroups: the names, both ways
(pure).

Kubelet (``--cgroups-per-qos``, the default) nests pods under QoS
cgroups below its cgroup root (``--cgroup-root``, ``/`` by default), named
by its cgroup driver:

* ``systemd``: a slice per level, each name repeating its parents'
  (``kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid>.slice``), with ``-`` in a name part written
  ``_`` (so ``<uid>`` has ``_`` where the pod UID has ``-``); Guaranteed
  pods sit directly below ``kubepods.slice``
  (``kubepods.slice/kubepods-pod<uid>.slice``); with ``--cgroup-root
  /kubelet`` every name starts with ``kubelet-``;
* ``cgroupfs``: plain directories (``kubepods/burstable/pod<uid>``,
  ``kubepods/besteffort/pod<uid>``, ``kubepods/pod<uid>``), below the
  root's directories.

A container's cgroup sits below its pod's, made by the OCI runtime:
``<runtime>-<id>.scope`` with systemd (containerd, CRI-O, Docker), the
bare id with cgroupfs.

The device plugin writes caps on the cgroup :func:`pod_cgroup` names; the
node's telemetry walks the same names back (:func:`pod_uid_in`,
:func:`container_id_of`), so the two can never disagree on a layout.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence

from amdgpu_virt import exception

#: what a cgroup's directory name may be (no '/', no '.' or '..', no NUL)
NAME = re.compile(r'^(?!\.\.?$)[A-Za-z0-9_.:@+,-]{1,255}$')
#: a pod UID as the API serves it (a UUID), or a static pod's hash
_UID = re.compile(r'^[A-Za-z0-9-]{1,64}$')
#: runtime prefixes of container scopes (containerd, CRI-O, Docker)
_CONTAINER_SYSTEMD = re.compile(r'^(?:cri-containerd|crio|docker)-'
                                r'([0-9a-f]{64})\.scope$')
_CONTAINER_CGROUPFS = re.compile(r'^([0-9a-f]{64})$')
_SLICE = '.slice'

#: a cgroup's directories below the cgroup root
Parts = tuple[str, ...]


class Driver(str, enum.Enum):
    """kubelet's ``--cgroup-driver``."""

    __hash__ = str.__hash__

    SYSTEMD = 'systemd'
    CGROUPFS = 'cgroupfs'


class QosClass(str, enum.Enum):
    """A pod's ``status.qosClass``."""

    __hash__ = str.__hash__

    GUARANTEED = 'Guaranteed'
    BURSTABLE = 'Burstable'
    BEST_EFFORT = 'BestEffort'


#: the QoS level's name part (Guaranteed pods have none)
_QOS_PART = {QosClass.GUARANTEED: None, QosClass.BURSTABLE: 'burstable',
             QosClass.BEST_EFFORT: 'besteffort'}


def kubelet_root_parts(cgroup_root: str) -> Parts:
    """kubelet's ``--cgroup-root`` as name parts (``/`` -> none).

    :raises ConfigError: a part that is not a plain name.
    """
    parts = tuple(p for p in cgroup_root.split('/') if p)
    for part in parts:
        if not NAME.match(part) or part.endswith(_SLICE):
            raise exception.ConfigError(
                option='[kubernetes] kubelet_cgroup_root',
                reason='%r is not a cgroup name (give kubelet\'s '
                '--cgroup-root, e.g. / or /kubelet)' % cgroup_root)
    return parts


def cgroup_path(driver: Driver, names: Sequence[str]) -> Parts:
    """The directories of the cgroup kubelet names ``names``."""
    if driver is Driver.CGROUPFS:
        return tuple(names)
    escaped = [name.replace('-', '_') for name in names]
    return tuple('-'.join(escaped[:n]) + _SLICE
                 for n in range(1, len(escaped) + 1))


def _qos_names(qos: QosClass, root: Sequence[str]) -> list[str]:
    names = [*root, 'kubepods']
    level = _QOS_PART[qos]
    if level is not None:
        names.append(level)
    return names


def kubepods_cgroup(driver: Driver, root: Sequence[str] = ()) -> Parts:
    """The cgroup kubelet makes for all pods (``kubepods``)."""
    return cgroup_path(driver, [*root, 'kubepods'])


def qos_cgroup(driver: Driver, qos: QosClass,
               root: Sequence[str] = ()) -> Parts:
    """The QoS cgroup's directories (``kubepods`` for Guaranteed)."""
    return cgroup_path(driver, _qos_names(qos, root))


def pod_cgroup(driver: Driver, qos: QosClass, uid: str,
               root: Sequence[str] = ()) -> Parts:
    """The pod cgroup's directories.

    :raises CgroupNotFound: a UID that cannot be part of a name.
    """
    if not _UID.match(uid or ''):
        raise exception.CgroupNotFound(
            owner='pod uid %.80r' % uid, reason='not a pod UID')
    return cgroup_path(driver, [*_qos_names(qos, root), 'pod%s' % uid])


def pod_uid_in(name: str, driver: Driver, qos: QosClass,
               root: Sequence[str] = ()) -> str | None:
    """The UID of the pod whose cgroup directory below its QoS cgroup is
    ``name`` (the inverse of :func:`pod_cgroup`), or None when ``name``
    is no pod cgroup of that class (another class's QoS cgroup, a
    runtime's own directory)."""
    if driver is Driver.CGROUPFS:
        uid = name[3:] if name.startswith('pod') else None
    else:
        prefix = qos_cgroup(driver, qos, root)[-1][:-len(_SLICE)] + '-pod'
        uid = name[len(prefix):-len(_SLICE)].replace('_', '-') \
            if name.startswith(prefix) and name.endswith(_SLICE) else None
    return uid if uid and _UID.match(uid) else None


def container_id_of(name: str) -> str | None:
    """The runtime's id of the container whose cgroup directory is
    ``name`` (64 hex digits), or None."""
    match = _CONTAINER_SYSTEMD.match(name) or _CONTAINER_CGROUPFS.match(name)
    return match.group(1) if match is not None else None


def container_cgroup_name(driver: Driver, container_id: str,
                          runtime: str = 'cri-containerd') -> str:
    """The directory name the OCI runtime gives a container's cgroup."""
    if driver is Driver.CGROUPFS:
        return container_id
    return '%s-%s.scope' % (runtime, container_id)


def driver_setting(value: str) -> Driver | None:
    """``[kubernetes] cgroup_driver`` as a driver (None: ``auto``, either
    one)."""
    return None if value == 'auto' else Driver(value)
