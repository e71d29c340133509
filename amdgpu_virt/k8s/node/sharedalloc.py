"""Allocate for pods the allocation record places on this node.

Kubelet's Allocate carries device IDs only, never the pod. The pod is
the one the node lock (``hami.io/mutex.lock``, with the UID it was taken
for next to it) names, and it must be a live pod bound to this node whose
UID the node's allocation record
(:mod:`amdgpu_virt.k8s.record.allocation`) holds; the container is that
pod's next one not served yet, in HAMi order (init containers, then
containers), as kubelet calls them. A lock whose pod is gone, or whose
name now belongs to a pod of another UID, is refused
(:class:`~amdgpu_virt.exception.LockHolderGone`): the Allocate is that
pod's late one, and the lock stays until this refusal (see
:mod:`amdgpu_virt.k8s.record.nodelock`), so it is never served another
pod's allocation. Pod annotations are never trusted for what a container
gets: the record's grants (GPUs, concrete CU ranges, MiB) are served
exactly, and the annotations are written afterwards as a mirror for HAMi
tools.

Which containers were already served, with which device IDs and in which
order, is the plugin's own checkpoint (:class:`Served`). Device IDs are
not pods (kubelet hands them again to other containers and pods): when a
served checkpoint entry counts as a retry is
:mod:`amdgpu_virt.k8s.node.sharedpick`'s decision.

Everything here is pure: pods are plain dicts as the API serves them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami

DONE_PHASES = allocrecord.DONE_PHASES
_MAX_CHECKPOINT = 4 * 1024 * 1024


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get('metadata')
    return meta if isinstance(meta, Mapping) else {}


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return '%s/%s' % (meta.get('namespace', ''), meta.get('name', ''))


# --- what was served ---------------------------------------------------------

#: the checkpoint's format version (version 1, a plain ``{uid: {index:
#: ids}}`` object, is still read)
CHECKPOINT_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Served:
    """Containers served so far, in the order they were served: (pod UID,
    container index, the device IDs kubelet asked for, sorted)."""

    entries: tuple[tuple[str, int, tuple[str, ...]], ...] = ()

    def lookup(self, device_ids: Iterable[str]) -> tuple[str, int] | None:
        """(pod UID, container) a request for ``device_ids`` was served
        for first, or None."""
        hits = self.hits(device_ids)
        return hits[0] if hits else None

    def hits(self, device_ids: Iterable[str]) -> list[tuple[str, int]]:
        """Every (pod UID, container) served exactly ``device_ids``, in
        the order they were served (kubelet hands the same IDs to more
        than one container: an init container's to the next container of
        its pod, a pod's to a new pod once it left the node)."""
        wanted = tuple(sorted(device_ids))
        return [(uid, index) for uid, index, ids in self.entries
                if ids == wanted]

    def latest(self, device_ids: Iterable[str]) -> tuple[str, int] | None:
        """The (pod UID, container) served ``device_ids`` last, or None."""
        hits = self.hits(device_ids)
        return hits[-1] if hits else None

    def of(self, uid: str) -> frozenset[int]:
        return frozenset(index for owner, index, _ids in self.entries
                         if owner == uid)

    def add(self, uid: str, index: int, device_ids: Iterable[str]
            ) -> Served:
        """With container ``index`` of pod ``uid`` served ``device_ids``
        (last)."""
        kept = tuple(e for e in self.entries if e[:2] != (uid, index))
        return Served(kept + ((uid, index, tuple(sorted(device_ids))),))

    def only(self, uids: Iterable[str]) -> Served:
        """Forget pods that are not in ``uids`` (gone from the record)."""
        keep = set(uids)
        return Served(tuple(e for e in self.entries if e[0] in keep))

    def encode(self) -> str:
        return json.dumps({'version': CHECKPOINT_VERSION, 'served': [
            [uid, index, list(ids)] for uid, index, ids in self.entries]},
            sort_keys=True)

    @classmethod
    def decode(cls, text: str, where: str) -> Served:
        """:raises DevicePluginError: naming ``where`` (fail closed: a
        checkpoint we cannot read could hide what was served)."""
        def bad(reason: str) -> exception.DevicePluginError:
            return exception.DevicePluginError(
                resource=where, reason='checkpoint unreadable: %s' % reason)
        if len(text) > _MAX_CHECKPOINT:
            raise bad('larger than %d bytes' % _MAX_CHECKPOINT)
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as err:
            raise bad(str(err)) from None
        if not isinstance(data, dict):
            raise bad('not an object')
        if 'version' in data:
            return cls(_decode_v2(data, bad))
        entries = []
        for uid, containers in data.items():
            if not isinstance(containers, dict):
                raise bad('pod %r: not an object' % uid[:64])
            for index, ids in containers.items():
                entries.append((uid, _index(index, uid, bad),
                                _ids(ids, uid, index, bad)))
        return cls(tuple(entries))


def _index(index: Any, uid: str, bad: Any) -> int:
    if isinstance(index, int) and not isinstance(index, bool) and \
            0 <= index <= allocrecord.MAX_CONTAINERS:
        return index
    if not isinstance(index, str) or not index.isdigit() or len(index) > 4:
        raise bad('pod %r: bad container %r' % (uid[:64], str(index)[:8]))
    return int(index)


def _ids(ids: Any, uid: str, index: Any, bad: Any) -> tuple[str, ...]:
    if not isinstance(ids, list) or \
            not all(isinstance(i, str) for i in ids):
        raise bad('pod %r: bad container %r' % (uid[:64], str(index)[:8]))
    return tuple(sorted(ids))


def _decode_v2(data: dict[str, Any], bad: Any
               ) -> tuple[tuple[str, int, tuple[str, ...]], ...]:
    if data.get('version') != CHECKPOINT_VERSION or \
            set(data) != {'version', 'served'} or \
            not isinstance(data['served'], list):
        raise bad('not a version %d checkpoint' % CHECKPOINT_VERSION)
    entries = []
    for entry in data['served']:
        if not isinstance(entry, list) or len(entry) != 3 or \
                not isinstance(entry[0], str):
            raise bad('bad entry %r' % str(entry)[:80])
        uid = entry[0]
        entries.append((uid, _index(entry[1], uid, bad),
                        _ids(entry[2], uid, entry[1], bad)))
    return tuple(entries)


# --- choosing the pod and container -----------------------------------------

def live_pods(record: allocrecord.Record, pods: Iterable[Mapping[str, Any]]
              ) -> dict[str, Mapping[str, Any]]:
    """Pods bound to the record's node, not finished, whose UID, namespace
    and name the record holds, by UID."""
    result = {}
    for pod in pods:
        meta = _meta(pod)
        uid = meta.get('uid')
        grants = record.pods.get(uid) if isinstance(uid, str) else None
        if grants is None or grants.namespace != meta.get('namespace') or \
                grants.name != meta.get('name'):
            continue
        if (pod.get('spec') or {}).get('nodeName') != record.node or \
                (pod.get('status') or {}).get('phase') in DONE_PHASES:
            continue
        result[str(uid)] = pod
    return result


def pending(grants: allocrecord.PodGrants, served: frozenset[int]
            ) -> list[int]:
    """Containers of ``grants`` with GPUs that were not served yet, in
    HAMi order (init containers, then containers)."""
    return [n for n, c in enumerate(grants.containers)
            if c and n not in served]


def no_live_lock(node: str, lock_value: str | None, request: str,
                 why: str = '') -> exception.DevicePluginError:
    """The refusal of an Allocate that no live node lock names a pod
    for."""
    return exception.DevicePluginError(
        resource=request, reason='node %s has no live node lock (%s) '
        'naming the pod being allocated; refusing rather than guessing '
        'which booked pod this is%s' % (
            node, 'none' if not lock_value else 'expired, unreadable or '
            'naming no pod: %r' % lock_value[:80], why))


def holder(record: allocrecord.Record, live: Mapping[str, Mapping[str, Any]],
           lock_value: str | None, request: str,
           now: datetime.datetime | None = None,
           lock_uid: str | None = None) -> allocrecord.PodGrants | None:
    """The grants of the pod the live node lock names, or None without a
    live lock.

    The holder (of UID ``lock_uid`` when the lock names one) must be a
    live pod that the record places here.

    :raises LockHolderGone: the lock's pod is gone or was replaced.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    lock = None
    if lock_value:
        try:
            lock = hami.decode_node_lock(lock_value)
        except exception.HamiProtocolError:
            lock = None
    if lock is None or not lock.pod or lock.expired(now):
        return None
    key = '%s/%s' % (lock.namespace, lock.pod)
    for uid in sorted(live):
        grants = record.pods[uid]
        if grants.key == key and lock_uid in (None, '', grants.uid):
            return grants
    raise exception.LockHolderGone(
        resource=request, reason='the node lock of %s is held by pod '
        '%s%s, which is not a live pod that the allocation record '
        'places on this node (deleted, or replaced by a pod of the same '
        'name, mid-allocation); refusing rather than giving its devices '
        'another pod\'s allocation' % (
            record.node, key, ' (uid %s)' % lock_uid if lock_uid else ''),
        namespace=lock.namespace, name=lock.pod, uid=lock_uid or None)


def next_container(grants: allocrecord.PodGrants, served: frozenset[int],
                   count: int, request: str, node: str = '?') -> int:
    """The container of ``grants`` kubelet allocates next: the first one
    in HAMi order not served yet, which must have ``count`` GPUs (kubelet
    calls Allocate per container, in that order).

    :raises DevicePluginError: nothing is left, or the next container has
        another number of GPUs.
    """
    left = pending(grants, served)
    if not left:
        raise exception.DevicePluginError(
            resource=request, reason='pod %s holds the node lock of %s and '
            'has no container left to serve' % (grants.key, node))
    index = left[0]
    if len(grants.containers[index]) != count:
        raise exception.DevicePluginError(
            resource=request, reason='%s: no container left to serve has '
            '%d GPUs next: kubelet allocates containers in order (init '
            'containers, then containers), and the next one, container '
            '%d, has %d GPUs in the record' % (
                grants.describe(), count, index,
                len(grants.containers[index])))
    return index


def choose(record: allocrecord.Record, live: Mapping[str, Mapping[str, Any]],
           served: Served, lock_value: str | None, count: int,
           request: str, now: datetime.datetime | None = None,
           lock_uid: str | None = None
           ) -> tuple[allocrecord.PodGrants, int]:
    """(the pod's grants, the container) a first Allocate is for: the pod
    the live node lock names (see :func:`holder`) and its next container
    (see :func:`next_container`). Without a live lock nothing is served:
    which booked pod kubelet is admitting cannot be known then, and
    guessing could serve one pod another's allocation. Retries are
    :mod:`amdgpu_virt.k8s.node.sharedpick`'s.

    :raises LockHolderGone: the lock's pod is gone or was replaced.
    :raises DevicePluginError: naming the pod (or the lock) at fault.
    """
    grants = holder(record, live, lock_value, request, now, lock_uid)
    if grants is None:
        raise no_live_lock(record.node, lock_value, request)
    return grants, next_container(grants, served.of(grants.uid), count,
                                  request, record.node)


# --- the answer and the mirror ----------------------------------------------

def capacity(units: Sequence[devices.GpuUnit], share_count: int
             ) -> dict[str, allocrecord.Capacity]:
    return {u.uuid.lower(): allocrecord.Capacity(
        share_count, u.vram_mib, u.compute_units, u.cu_unit) for u in units}


def container_allocation(grants: allocrecord.PodGrants, index: int,
                         units: Sequence[devices.GpuUnit],
                         library: str = hami.LD_AUDIT_LIBRARY
                         ) -> devices.ContainerAllocation:
    """Exactly what the record gives container ``index``: its GPUs, their
    CU masks and memory limits (and the ``LD_AUDIT`` library when any is
    shared).

    :raises DevicePluginError: a GPU of the grant is not on this node.
    """
    by_uuid = {unit.uuid.lower(): unit for unit in units}
    chosen: list[devices.GpuUnit] = []
    masks: dict[int, int] = {}
    limits: dict[int, int] = {}
    for local, grant in enumerate(grants.containers[index]):
        unit = by_uuid.get(grant.gpu)
        if unit is None:
            raise exception.DevicePluginError(
                resource=grants.describe(), reason='the record gives GPU %s, '
                'which is not one of this node (%s)' % (
                    grant.gpu, ', '.join(sorted(by_uuid)) or 'none'))
        chosen.append(unit)
        if grant.cus != (1 << unit.compute_units) - 1:
            masks[local] = grant.cus
        if 0 < grant.mem < unit.vram_mib:
            limits[local] = grant.mem
    base = devices.allocation_for(chosen)
    envs = list(base.envs)
    mounts: list[devices.MountSpec] = []
    if masks:
        envs.append((hami.ENV_HSA_CU_MASK, cumask.encode_hsa_cu_mask(masks)))
    for local, mib in sorted(limits.items()):
        envs.append(('%s_%d' % (hami.ENV_HIP_DEVICE_MEMORY_LIMIT, local),
                     '%dm' % mib))
    if masks or limits:
        envs.append((hami.ENV_LD_AUDIT, library))
        mounts.append(devices.MountSpec(library, library, True))
    return devices.ContainerAllocation(envs=tuple(envs), devices=base.devices,
                                       mounts=tuple(mounts))


def mirror(grants: allocrecord.PodGrants, served: frozenset[int],
           allocated: hami.PodDevices | None = None
           ) -> tuple[dict[str, str], bool]:
    """(the HAMi annotations that mirror what was served, all served?).

    :param allocated: the pod's ``hami.io/amd-devices-allocated`` as the
        extender wrote it (for its device types), if readable.
    """
    if allocated is None or len(allocated) != len(grants.containers):
        allocated = tuple(tuple(
            hami.ContainerDevice(g.gpu, 'AMD', g.mem, g.cus.bit_count())
            for g in container) for container in grants.containers)
    remaining = [[] if n in served else list(container)
                 for n, container in enumerate(allocated)]
    done = not pending(grants, served)
    annotations = {hami.DEVICES_TO_ALLOCATE: hami.encode_pod_devices(
        remaining, hami.DEVICES_TO_ALLOCATE)}
    masks = grants.masks()
    if masks:
        annotations[hami.CU_ALLOCATED] = hami.encode_cu_allocated(masks)
    if done:
        annotations[hami.BIND_PHASE] = hami.BindPhase.SUCCESS.value
    return annotations, done
