"""Which pod and container a container cgroup belongs to (pure).

A cgroup path names a pod by UID and a container by its runtime id,
nothing more; anyone able to create cgroups could name any UID. A
container is attributed only when the API knows it: the pod of that UID
is bound to this node and lists the container id in its status (name from
``containerStatuses``, ``initContainerStatuses`` or
``ephemeralContainerStatuses``), or, while the API has not caught up, the
node's allocation record books a pod of that UID (namespace and name from
the record; the container then goes by the first
:data:`SHORT_ID` hex digits of its runtime id, as ``crictl ps`` shows
it). Anything else is unattributed: dropped and counted by the caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from amdgpu_virt.inventory.readings import ContainerCgroup

#: hex digits of a runtime id naming a container the API does not list
SHORT_ID = 13
_STATUS_FIELDS = ('initContainerStatuses', 'containerStatuses',
                  'ephemeralContainerStatuses')


@dataclasses.dataclass(frozen=True, order=True)
class Attributed:
    """A container cgroup with the pod and container it belongs to."""

    namespace: str
    pod: str
    container: str
    cgroup: ContainerCgroup


def _runtime_id(container_id: str) -> str:
    """``containerd://<id>`` -> ``<id>``."""
    return container_id.rpartition('://')[2].lower()


def pod_index(pods: Iterable[Mapping[str, Any]], node: str
              ) -> dict[str, tuple[str, str, dict[str, str]]]:
    """Pod UID -> (namespace, name, container id -> container name) of
    the pods bound to ``node``."""
    index: dict[str, tuple[str, str, dict[str, str]]] = {}
    for pod in pods:
        meta = pod.get('metadata') or {}
        spec = pod.get('spec') or {}
        uid = meta.get('uid')
        if not isinstance(uid, str) or spec.get('nodeName') != node:
            continue
        containers: dict[str, str] = {}
        status = pod.get('status') or {}
        for field in _STATUS_FIELDS:
            for item in status.get(field) or ():
                if not isinstance(item, Mapping):
                    continue
                cid, name = item.get('containerID'), item.get('name')
                if isinstance(cid, str) and isinstance(name, str) and cid:
                    containers[_runtime_id(cid)] = name
        index[uid.lower()] = (str(meta.get('namespace', '')),
                              str(meta.get('name', '')), containers)
    return index


def attribute(cgroups: Sequence[ContainerCgroup],
              pods: Mapping[str, tuple[str, str, dict[str, str]]],
              booked: Mapping[str, tuple[str, str]]
              ) -> tuple[list[Attributed], list[ContainerCgroup]]:
    """(attributed containers, unattributed cgroups).

    :param pods: :func:`pod_index` of the node's pods.
    :param booked: pod UID -> (namespace, name) from the allocation record.

    A cgroup of a known pod whose id its status does not list (the pod
    sandbox's, or a container not reported yet) is neither: it is left
    out silently.
    """
    found: list[Attributed] = []
    unknown: list[ContainerCgroup] = []
    for cgroup in cgroups:
        known = pods.get(cgroup.pod_uid)
        if known is not None:
            name = known[2].get(cgroup.container_id)
            if name is not None:
                found.append(Attributed(known[0], known[1], name, cgroup))
            continue
        record = booked.get(cgroup.pod_uid)
        if record is not None:
            found.append(Attributed(record[0], record[1],
                                    cgroup.container_id[:SHORT_ID], cgroup))
            continue
        unknown.append(cgroup)
    return sorted(found), unknown
