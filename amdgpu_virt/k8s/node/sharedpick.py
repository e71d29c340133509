"""Which pod and container kubelet's Allocate is for.

Kubelet's device manager (``pkg/kubelet/cm/devicemanager/manager.go``;
the rules are written down in the contributor guide, "Kubelet's device
manager") calls Allocate at pod admission, once per container and
resource, in pod order: init containers (sidecars included), then
containers. Each call carries device IDs only, and device IDs are not
pods:

* the IDs of a (non-restartable) init container are handed again to the
  next container of its pod (``devicesToReuse``): an app container
  usually gets exactly its init container's IDs;
* a sidecar (an init container with ``restartPolicy: Always``) keeps its
  IDs, and so does a container: no later container of the pod gets them;
* once a pod leaves kubelet's active set (it ended on the node, was
  rejected or deleted) its IDs are free, before the API shows the pod's
  phase, and the next pod may get them.

So what the plugin served before (:class:`~.sharedalloc.Served`) never
decides alone. :func:`decide`:

1. With a live node lock, the pod is its holder H (a live pod the record
   places here, by name and UID). The call is a retry of H's container c
   (its answer was lost) when the IDs are exactly those c was served and
   c is not one whose IDs kubelet hands on: a container or a sidecar, or
   an init container once H has nothing left to serve or its next
   container has another number of GPUs. IDs served to another pod X
   that may still be being admitted (live, no container started, not
   being deleted) make the call ambiguous: refused. Otherwise the call is
   H's next container in HAMi order, which must have as many GPUs as the
   call carries.
2. Without a live lock (H's last container was served and the lock
   released) only a retry is answered: the IDs were served to a container
   c of a live pod X as in 1, X started no container and is not being
   deleted, and no other pod on the node may be the one kubelet admits (a
   pod bound here, not finished, that started no container and has
   containers left to serve, or asks for the resource unbooked).

Everything here is pure: pods are plain dicts as the API serves them.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.record import allocation as allocrecord


class Kind(enum.Enum):
    """What kubelet does with a container's device IDs."""

    #: runs to completion first; its IDs go to the next container
    INIT = 'init'
    #: an init container with ``restartPolicy: Always``: keeps its IDs
    SIDECAR = 'sidecar'
    #: keeps its IDs
    CONTAINER = 'container'


@dataclasses.dataclass(frozen=True)
class Pick:
    """The pod and container an Allocate is for.

    :ivar pod: the pod as the API serves it.
    :ivar retry: the container was served before (the answer was lost).
    """

    grants: allocrecord.PodGrants
    index: int
    pod: Mapping[str, Any]
    retry: bool = False


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get('metadata')
    return meta if isinstance(meta, Mapping) else {}


def _items(obj: Any, field: str) -> list[Mapping[str, Any]]:
    items = obj.get(field) if isinstance(obj, Mapping) else None
    if not isinstance(items, list):
        return []
    return [item if isinstance(item, Mapping) else {} for item in items]


def kinds(pod: Mapping[str, Any]) -> tuple[Kind, ...]:
    """The kind of each container of ``pod`` in HAMi order (init
    containers, then containers)."""
    spec = pod.get('spec')
    found = [Kind.SIDECAR if c.get('restartPolicy') == 'Always'
             else Kind.INIT for c in _items(spec, 'initContainers')]
    found += [Kind.CONTAINER] * len(_items(spec, 'containers'))
    return tuple(found)


def record_kinds(grants: allocrecord.PodGrants, pod: Mapping[str, Any],
                 request: str) -> tuple[Kind, ...]:
    """:func:`kinds` of the pod the record's ``grants`` are for.

    :raises DevicePluginError: the record and the pod disagree on the
        number of containers (which one kubelet allocates is unknown).
    """
    found = kinds(pod)
    if len(found) != len(grants.containers):
        raise exception.DevicePluginError(
            resource=request, reason='%s: the allocation record gives %d '
            'containers, the pod has %d (init containers, then '
            'containers); refusing rather than guessing which container '
            'kubelet allocates' % (grants.describe(), len(grants.containers),
                                   len(found)))
    return found


def started(pod: Mapping[str, Any]) -> bool:
    """Whether the API shows a container of ``pod`` that ran (kubelet
    then admitted it: every Allocate of the pod was answered)."""
    status = pod.get('status')
    for field in ('initContainerStatuses', 'containerStatuses'):
        for entry in _items(status, field):
            state = entry.get('state')
            last = entry.get('lastState')
            restarts = entry.get('restartCount')
            if isinstance(state, Mapping) and (
                    'running' in state or 'terminated' in state) or \
                    isinstance(last, Mapping) and 'terminated' in last or \
                    isinstance(restarts, int) and restarts > 0:
                return True
    return False


def leaving(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is being deleted."""
    return bool(_meta(pod).get('deletionTimestamp'))


def asks_for(pod: Mapping[str, Any], resource: str) -> bool:
    """Whether a container of ``pod`` has ``resource`` in its limits (a
    value that is not a number counts)."""
    spec = pod.get('spec')
    for container in _items(spec, 'initContainers') + _items(
            spec, 'containers'):
        resources = container.get('resources')
        limits = resources.get('limits') if isinstance(
            resources, Mapping) else None
        value = limits.get(resource) if isinstance(limits, Mapping) \
            else None
        if value is None:
            continue
        text = str(value).strip()
        if not text.isdigit() or int(text[:12]) > 0:
            return True
    return False


def _may_be_admitted(pod: Mapping[str, Any]) -> bool:
    return not started(pod) and not leaving(pod)


def _retry_of(grants: allocrecord.PodGrants, pod: Mapping[str, Any],
              served: sharedalloc.Served, hits: Iterable[tuple[str, int]],
              count: int, request: str) -> int | None:
    """The container of ``grants`` a call with these checkpoint ``hits``
    retries, or None (no hit, or an init container's IDs handed on)."""
    own = [index for uid, index in hits if uid == grants.uid]
    if not own:
        return None
    kind = record_kinds(grants, pod, request)
    kept = [index for index in own if kind[index] is not Kind.INIT]
    if kept:
        return kept[-1]
    left = sharedalloc.pending(grants, served.of(grants.uid))
    if not left or len(grants.containers[left[0]]) != count:
        return own[-1]
    return None


def could_be_admitted(pod: Mapping[str, Any], record: allocrecord.Record,
                      served: sharedalloc.Served, resource: str) -> bool:
    """Whether kubelet may be admitting ``pod`` now: bound to the
    record's node, not finished, no container started, and containers
    left to serve (or, without a booking, asking for ``resource``)."""
    if (pod.get('spec') or {}).get('nodeName') != record.node or \
            (pod.get('status') or {}).get('phase') in \
            sharedalloc.DONE_PHASES or started(pod):
        return False
    meta = _meta(pod)
    uid = meta.get('uid')
    grants = record.pods.get(uid) if isinstance(uid, str) else None
    if grants is not None and grants.namespace == meta.get('namespace') \
            and grants.name == meta.get('name'):
        return bool(sharedalloc.pending(grants, served.of(grants.uid)))
    return asks_for(pod, resource)


def decide(record: allocrecord.Record, pods: Iterable[Mapping[str, Any]],
           served: sharedalloc.Served, lock_value: str | None,
           lock_uid: str | None, device_ids: Sequence[str], resource: str,
           request: str, now: datetime.datetime | None = None) -> Pick:
    """The pod and container an Allocate for ``device_ids`` is for (see
    the module's documentation).

    :param pods: every pod bound to the node.
    :raises LockHolderGone: the lock's pod is gone or was replaced.
    :raises DevicePluginError: naming the pods (or the lock) that make
        the call unanswerable.
    """
    pods = list(pods)
    live = sharedalloc.live_pods(record, pods)
    hits = served.hits(device_ids)
    grants = sharedalloc.holder(record, live, lock_value, request, now,
                                lock_uid)
    if grants is not None:
        return _for_holder(record, live, served, grants, hits,
                           len(device_ids), request)
    return _retry_without_lock(record, pods, live, served, hits,
                               lock_value, len(device_ids), resource,
                               request)


def _for_holder(record: allocrecord.Record,
                live: Mapping[str, Mapping[str, Any]],
                served: sharedalloc.Served, grants: allocrecord.PodGrants,
                hits: list[tuple[str, int]], count: int,
                request: str) -> Pick:
    pod = live[grants.uid]
    record_kinds(grants, pod, request)
    index = _retry_of(grants, pod, served, hits, count, request)
    if index is not None:
        return Pick(grants, index, pod, retry=True)
    for uid, other in hits:
        if uid != grants.uid and uid in live and _may_be_admitted(live[uid]):
            raise exception.DevicePluginError(
                resource=request, reason='%s holds the node lock of %s, '
                'but these device IDs were served to container %d of %s, '
                'which started no container yet: the call may be its '
                'retry as well as the lock holder\'s; refusing rather than '
                'giving either pod the other\'s allocation' % (
                    grants.describe(), record.node, other,
                    record.pods[uid].describe()))
    index = sharedalloc.next_container(grants, served.of(grants.uid), count,
                                       request, record.node)
    return Pick(grants, index, pod)


def _retry_without_lock(record: allocrecord.Record,
                        pods: list[Mapping[str, Any]],
                        live: Mapping[str, Mapping[str, Any]],
                        served: sharedalloc.Served,
                        hits: list[tuple[str, int]],
                        lock_value: str | None, count: int, resource: str,
                        request: str) -> Pick:
    retries: dict[str, int] = {}
    ignored = []
    for uid in dict.fromkeys(uid for uid, _index in hits):
        pod = live.get(uid)
        index = None
        if pod is not None and _may_be_admitted(pod):
            index = _retry_of(record.pods[uid], pod, served, hits, count,
                              request)
        if index is None:
            ignored.append(uid)
        else:
            retries[uid] = index
    if not retries:
        why = '' if not ignored else '; these device IDs were served to ' \
            'pod(s) %s, which kubelet no longer admits (gone, finished, ' \
            'started or being deleted) or whose IDs it hands on' % ', '.join(
                record.pods[uid].describe() if uid in record.pods else uid
                for uid in ignored)
        raise sharedalloc.no_live_lock(record.node, lock_value, request,
                                       why)
    if len(retries) > 1:
        raise sharedalloc.no_live_lock(
            record.node, lock_value, request, '; these device IDs were '
            'served to more than one pod that may be being admitted: %s' %
            ', '.join(record.pods[uid].describe() for uid in retries))
    uid, index = next(iter(retries.items()))
    grants = record.pods[uid]
    for pod in pods:
        if _meta(pod).get('uid') != uid and could_be_admitted(
                pod, record, served, resource):
            raise sharedalloc.no_live_lock(
                record.node, lock_value, request, '; these device IDs '
                'were served to container %d of %s, but pod %s/%s may be '
                'the one kubelet admits' % (
                    index, grants.describe(), _meta(pod).get('namespace'),
                    _meta(pod).get('name')))
    return Pick(grants, index, live[uid], retry=True)
