"""The device plugin's Allocate for pods the allocation record places here.

:class:`SharedServer` is the I/O around the pure
:mod:`amdgpu_virt.k8s.node.sharedpick` (which pod and container a call
is for) and :mod:`amdgpu_virt.k8s.node.sharedalloc` (what it gets): it
reads the node's allocation record, its pods and its node lock through a
:class:`~amdgpu_virt.k8s.node.podsource.PodSource`, serves exactly the
record's grants, checkpoints what it served (pod UID, container, device
IDs, in order, next to the plugin socket) before the answer leaves,
writes the HAMi annotations as a mirror and releases the node lock once
the pod's last container with GPUs is served.

An Allocate under a lock whose pod is gone, or whose name now belongs to
a pod of another UID, is refused naming that pod (and UID), and the lock
is then released: the refused Allocate was that pod's late one, kubelet's
admission of it failed, and no further Allocate comes for it. The
extender never takes such a lock over by time (see
:mod:`amdgpu_virt.k8s.record.nodelock`), so a late Allocate of a deleted pod is
refused however late it comes, instead of being served the next pod's
allocation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.node import sharedpick
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)


class SharedServer:
    """Allocate from the allocation record, one call at a time.

    :param source: the node's pods, lock and record.
    :param units: the node's GPUs.
    :param share_count: slots per GPU (the record's capacity).
    :param library: the LD_AUDIT library given to shared containers.
    :param checkpoint: the file that records what was served.
    :param resource_name: the extended resource (for error messages).
    """

    def __init__(self, source: podsource.PodSource,
                 units: Sequence[devices.GpuUnit], share_count: int,
                 library: str, checkpoint: str,
                 resource_name: str = hami.RESOURCE_GPU) -> None:
        self.source = source
        self.units = units
        self.share_count = share_count
        self.library = library
        self.checkpoint = checkpoint
        self.resource_name = resource_name
        self._lock = threading.Lock()
        self._served: sharedalloc.Served | None = None

    def _load_served(self) -> sharedalloc.Served:
        if self._served is None:
            text = fileutil.read_text(self.checkpoint)
            self._served = sharedalloc.Served() if text is None else \
                sharedalloc.Served.decode(text, self.checkpoint)
        return self._served

    def _save_served(self, served: sharedalloc.Served) -> None:
        try:
            fileutil.atomic_write(self.checkpoint, served.encode(),
                                  mode=0o600)
        except OSError as err:
            raise exception.DevicePluginError(
                resource=self.resource_name, reason='cannot write the '
                'checkpoint %s: %s' % (self.checkpoint, err)) from None
        self._served = served

    def served_to(self, device_ids: Sequence[str]) -> tuple[str, int] | None:
        """(pod UID, container index) ``device_ids`` were served to last,
        from the served checkpoint; None when they were not. kubelet hands
        IDs to another pod only once their pod left the node, and to the
        next container of the same pod (an init container's), so the last
        serve names the pod whose container is starting.

        :raises DevicePluginError: the checkpoint is unreadable.
        """
        with self._lock:
            return self._load_served().latest(device_ids)

    def allocate(self, device_ids: Sequence[str],
                 request: str) -> devices.ContainerAllocation:
        """Serve what the allocation record gives the container being
        allocated (see :mod:`amdgpu_virt.k8s.node.sharedpick`).

        Idempotent: kubelet's retry of a container whose answer was lost
        (a kubelet or plugin restart in between included) gets the same
        answer and books nothing.

        :raises LockHolderGone: the lock names a pod that is gone or was
            replaced (the lock is released).
        :raises DevicePluginError, AllocationRecordError, KubernetesError:
            naming the pod, the record or the request at fault.
        """
        with self._lock:
            return self._allocate(device_ids, request)

    def _allocate(self, device_ids: Sequence[str],
                  request: str) -> devices.ContainerAllocation:
        source = self.source
        record = source.allocation_record()
        allocrecord.check(record, sharedalloc.capacity(
            self.units, self.share_count))
        lock_value, lock_uid = source.node_lock_holder()
        pods = source.pods_on_node()
        served = self._load_served().only(record.pods)
        try:
            pick = sharedpick.decide(record, pods, served, lock_value,
                                     lock_uid, device_ids,
                                     self.resource_name, request)
        except exception.LockHolderGone as err:
            self._retire(err)
            raise
        grants, index = pick.grants, pick.index
        if pick.retry:
            LOG.info('%s: again for %s container %d (a retry)', request,
                     grants.describe(), index)
        else:
            served = served.add(grants.uid, index, device_ids)
        allocation = sharedalloc.container_allocation(
            grants, index, self.units, self.library)
        # recorded before the answer leaves: a retry after a lost answer
        # or a restart finds it
        self._save_served(served)
        self._mirror(pick.pod, grants, served.of(grants.uid))
        LOG.info('%s container %d: %s', grants.describe(), index,
                 dict(allocation.envs))
        return allocation

    def _retire(self, err: exception.LockHolderGone) -> None:
        """Release the lock of a gone holder after refusing its late
        Allocate (best effort: a failure leaves it to expire)."""
        holder = err.kwargs
        try:
            self.source.release_lock(holder['namespace'], holder['name'],
                                     holder['uid'])
            LOG.info('Released the node lock of gone pod %s/%s (uid %s)',
                     holder['namespace'], holder['name'], holder['uid'])
        except exception.AmdgpuVirtError as second:
            LOG.warning('The node lock of gone pod %s/%s was not released: '
                        '%s', holder['namespace'], holder['name'], second)

    def _mirror(self, pod: Mapping[str, Any],
                grants: allocrecord.PodGrants, served: frozenset[int]
                ) -> None:
        """The HAMi annotations as a mirror; the node lock released once
        every container is served."""
        meta = pod.get('metadata') or {}
        try:
            allocated: hami.PodDevices | None = hami.decode_pod_devices(
                (meta.get('annotations') or {}).get(
                    hami.DEVICES_ALLOCATED, ''))
        except exception.HamiProtocolError:
            allocated = None
        annotations, done = sharedalloc.mirror(grants, served, allocated)
        self.source.annotate_pod({'metadata': {
            'namespace': grants.namespace, 'name': grants.name,
            'uid': grants.uid}}, annotations)
        if done:
            self.source.release_lock(grants.namespace, grants.name,
                                     grants.uid)
