"""Allocate for HAMi-scheduled pods: CU masks and memory limits.

Kubelet's Allocate carries device IDs only, never the pod. As HAMi's AMD
device plugin does, the pod is found from the node lock
(``hami.io/mutex.lock`` owner) or among the node's pods with
``hami.io/bind-phase: allocating`` and ``hami.io/vgpu-node`` = this node;
the container is the first one with devices left in
``hami.io/amd-devices-to-allocate``. CU occupancy is rebuilt from
``hami.io/amd-cu-allocated`` of the node's live pods (failing closed on
overlaps), free CUs are chosen by the configured strategy, and the
container gets ``HSA_CU_MASK``, ``HIP_DEVICE_MEMORY_LIMIT_<i>`` and the
``LD_AUDIT`` library for a shared GPU.

Everything here is pure: pods are plain dicts as the API serves them, and
the result says which annotations to write.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import devices
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami

DONE_PHASES = ('Succeeded', 'Failed')


@dataclasses.dataclass(frozen=True)
class SharedAllocation:
    """The result of Allocate for one container of a HAMi pod.

    :ivar container: index of the container in the to-allocate list.
    :ivar allocation: what the container gets.
    :ivar annotations: pod annotations to write.
    :ivar done: no container is left to allocate (bind-phase success,
        node lock released).
    """

    container: int
    allocation: devices.ContainerAllocation
    annotations: Mapping[str, str]
    done: bool


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get('metadata') or {}


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    return '%s/%s' % (meta.get('namespace', ''), meta.get('name', ''))


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(pod).get('annotations') or {}


def _bind_time(pod: Mapping[str, Any]) -> int:
    try:
        return hami.decode_unix_time(
            _annotations(pod).get(hami.BIND_TIME, ''))
    except exception.HamiProtocolError:
        return 1 << 62


def find_pod(pods: Iterable[Mapping[str, Any]], node: str,
             lock_value: str | None,
             now: datetime.datetime | None = None
             ) -> Mapping[str, Any] | None:
    """The pod kubelet is allocating for, or None.

    :param pods: the pods bound to ``node``.
    :param lock_value: the node's ``hami.io/mutex.lock``, if any.
    """
    allocating = [
        pod for pod in pods
        if _annotations(pod).get(hami.BIND_PHASE) ==
        hami.BindPhase.ALLOCATING.value
        and _annotations(pod).get(hami.VGPU_NODE) == node
        and (pod.get('status') or {}).get('phase') not in DONE_PHASES]
    if lock_value:
        try:
            lock = hami.decode_node_lock(lock_value)
        except exception.HamiProtocolError:
            lock = None
        now = now or datetime.datetime.now(datetime.UTC)
        if lock is not None and lock.pod and not lock.expired(now):
            for pod in allocating:
                meta = _meta(pod)
                if lock.held_by(meta.get('namespace', ''),
                                meta.get('name', '')):
                    return pod
    if not allocating:
        return None
    return min(allocating, key=lambda p: (_bind_time(p), pod_key(p)))


def _pending_container(pod: Mapping[str, Any]
                       ) -> tuple[int, hami.PodDevices]:
    value = _annotations(pod).get(hami.DEVICES_TO_ALLOCATE)
    if value is None:
        raise exception.AnnotationError(
            key=hami.DEVICES_TO_ALLOCATE, obj='pod %s' % pod_key(pod),
            reason='missing: the pod was not scheduled by a HAMi-compatible '
            'scheduler')
    containers = hami.decode_pod_devices(value, hami.DEVICES_TO_ALLOCATE)
    for index, container in enumerate(containers):
        if container:
            return index, containers
    raise exception.AnnotationError(
        key=hami.DEVICES_TO_ALLOCATE, obj='pod %s' % pod_key(pod),
        reason='no container has devices left to allocate')


def rebuild(units: Sequence[devices.GpuUnit],
            live_pods: Iterable[Mapping[str, Any]],
            strategy: allocator.CuStrategy | None = None
            ) -> dict[str, allocator.CuAllocator]:
    """CU occupancy of the node's units from its live pods.

    Succeeded and Failed pods are left out.

    :raises HamiProtocolError, AllocationConflict: a bad or overlapping
        ``hami.io/amd-cu-allocated`` (fail closed).
    """
    owners = []
    for pod in live_pods:
        if (pod.get('status') or {}).get('phase') in DONE_PHASES:
            continue
        value = _annotations(pod).get(hami.CU_ALLOCATED)
        if value:
            owners.append((pod_key(pod), value))
    return hami.rebuild_allocators(
        {unit.uuid: (unit.compute_units, unit.cu_unit) for unit in units},
        owners, strategy=strategy)


def allocate(pod: Mapping[str, Any], units: Sequence[devices.GpuUnit],
             live_pods: Iterable[Mapping[str, Any]],
             device_ids: Sequence[str], request: str,
             strategy: allocator.CuStrategy | None = None,
             library: str = hami.LD_AUDIT_LIBRARY) -> SharedAllocation:
    """Allocate the pod's next container.

    :param pod: the pod found by :func:`find_pod`.
    :param live_pods: every pod bound to the node (``pod`` included).
    :param device_ids: what kubelet asked for (one per GPU).
    :param library: the LD_AUDIT library, mounted read-only for shared GPUs.
    :raises AnnotationError: no devices to allocate, a device of another
        node, or a device count that differs from kubelet's.
    :raises HamiProtocolError, AllocationConflict: bad CU annotations.
    :raises InsufficientCapacity: the CUs are no longer free.
    """
    key = pod_key(pod)
    index, containers = _pending_container(pod)
    wanted = containers[index]
    if len(wanted) != len(device_ids):
        raise exception.AnnotationError(
            key=hami.DEVICES_TO_ALLOCATE, obj='pod %s' % key,
            reason='container %d has %d devices but kubelet asked for %d '
            '(%s)' % (index, len(wanted), len(device_ids), request))
    by_uuid = {unit.uuid: unit for unit in units}
    others = [p for p in live_pods if pod_key(p) != key]
    occupancy = rebuild(units, others, strategy)
    mine: dict[str, int] = {}
    own = _annotations(pod).get(hami.CU_ALLOCATED)
    if own:
        mine = hami.decode_cu_allocated(own)
        for uuid, mask in mine.items():
            if uuid in occupancy:
                occupancy[uuid].claim_mask(key, mask)
    chosen: list[devices.GpuUnit] = []
    masks: dict[int, int] = {}
    limits: dict[int, int] = {}
    for local, device in enumerate(wanted):
        unit = by_uuid.get(device.uuid.lower())
        if unit is None:
            raise exception.AnnotationError(
                key=hami.DEVICES_TO_ALLOCATE, obj='pod %s' % key,
                reason='GPU %s is not one of this node (%s)' % (
                    device.uuid, ', '.join(sorted(by_uuid)) or 'none'))
        if unit in chosen:
            raise exception.AnnotationError(
                key=hami.DEVICES_TO_ALLOCATE, obj='pod %s' % key,
                reason='GPU %s is listed twice for container %d'
                % (device.uuid, index))
        chosen.append(unit)
        if 0 < device.usedcores < unit.compute_units:
            mask = occupancy[unit.uuid].allocate_mask(
                '%s#%d' % (key, index), device.usedcores)
            masks[local] = mask
            mine[unit.uuid] = mine.get(unit.uuid, 0) | mask
        if 0 < device.usedmem < unit.vram_mib:
            limits[local] = device.usedmem
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
    remaining = [list(c) for c in containers]
    remaining[index] = []
    done = not any(remaining)
    annotations = {hami.DEVICES_TO_ALLOCATE: hami.encode_pod_devices(
        remaining, hami.DEVICES_TO_ALLOCATE)}
    if mine:
        annotations[hami.CU_ALLOCATED] = hami.encode_cu_allocated(mine)
    if done:
        annotations[hami.BIND_PHASE] = hami.BindPhase.SUCCESS.value
    return SharedAllocation(
        container=index,
        allocation=devices.ContainerAllocation(
            envs=tuple(envs), devices=base.devices, mounts=tuple(mounts)),
        annotations=annotations, done=done)
