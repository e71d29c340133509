"""What the scheduler extender writes, and how each write is undone.

The extender's decisions (:mod:`amdgpu_virt.k8s.scheduler.core`) go out
through :class:`Bookings`, in this order, each step undone when a later
one fails:

* :meth:`Bookings.book`: the pod's GPUs, memory and concrete CU ranges in
  the allocation record of the chosen node (a ``resourceVersion``-guarded
  write; :class:`~amdgpu_virt.exception.SharingError` when another writer
  took the room first);
* :meth:`Bookings.mirror`: the HAMi annotations on the pod, a mirror of
  the booking for HAMi's tools;
* at bind, the node lock (``hami.io/mutex.lock``), ``hami.io/bind-phase:
  allocating`` and the ``pods/binding`` (:meth:`Bookings.binding`), the
  lock released by the device plugin once every container is served.

Undoing: :meth:`Bookings.unbook` removes a booking (retried, then handed
to the record collector: a booking left behind holds its GPUs, unseen by
every cache, until the collector's sweep); :meth:`Bookings.forget`
removes a pod's bookings and mirror when it fits nowhere any more;
:meth:`Bookings.undo` follows a failed bind once :meth:`Bookings.state`
has read where the pod really is (a lost answer may hide a binding that
went through).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.api import labels
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

#: the annotations :meth:`Bookings.mirror` writes and
#: :meth:`Bookings.forget` removes
MIRROR_ANNOTATIONS = (hami.DEVICES_TO_ALLOCATE, hami.DEVICES_ALLOCATED,
                      hami.VGPU_NODE, hami.CU_ALLOCATED)


class Bookings:
    """The extender's writes: records, mirror annotations, locks, bindings.

    :param cache: the cluster view (capacities of the nodes, the CU
        strategy).
    :param core_api: the API client.
    :param records: the allocation records.
    :param locker: node locks.
    :param leftover: called with ``(node, pod uid)`` when a booking could
        not be removed after :attr:`UNBOOK_TRIES` attempts (the record
        collector retries it); None: the next sweep removes it.
    """

    #: attempts of one booking removal before it is left to ``leftover``
    UNBOOK_TRIES = 3

    def __init__(self, cache: schedcache.ClusterCache, core_api: Any,
                 records: recordstore.RecordStore,
                 locker: nodelock.NodeLocker,
                 leftover: Callable[[str, str], None] | None = None) -> None:
        self.cache = cache
        self.api = core_api
        self.records = records
        self.locker = locker
        self.leftover = leftover

    # -- pods --------------------------------------------------------------

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        response = k8s_client.call('GET pod %s/%s' % (namespace, name),
                                   self.api.read_namespaced_pod, name,
                                   namespace, _preload_content=False)
        pod: dict[str, Any] = json.loads(response.data)
        return pod

    def state(self, name: str, namespace: str, uid: str) -> str | None:
        """Where the pod is bound: its node, ``''`` unbound, None gone
        (or replaced by a pod of another UID); ``'?'`` unknown."""
        for attempt in range(3):
            try:
                pod = self.read_pod(namespace, name)
            except exception.KubernetesNotFound:
                return None
            except exception.KubernetesError:
                time.sleep(0.05 * (attempt + 1))
                continue
            if (pod.get('metadata') or {}).get('uid') != uid:
                return None
            return str((pod.get('spec') or {}).get('nodeName') or '')
        return '?'

    # -- the record --------------------------------------------------------

    def book(self, node: str, uid: str, namespace: str, name: str,
             containers: hami.PodDevices,
             first: bool = False) -> allocrecord.PodGrants:
        """Book ``containers`` for the pod in the record of ``node``.

        :param first: only if the record holds nothing of the pod yet
            (the pod was seen by the watch: undoing this booking must
            not take away one it made before).
        :raises SharingError: the record has no room (another writer).
        :raises WatchBehind: ``first``, and the record holds the pod
            (its ``kwargs['node']`` names ``node``: the caller's next
            decision must treat that booking as an earlier one).
        """
        view = self.cache.view(node)
        capacity = allocrecord.capacity_of(
            gpu.info for gpu in (view.gpus if view is not None else ()))
        when = int(time.time())

        def change(record: allocrecord.Record) -> allocrecord.Record:
            if first and uid in record.pods:
                # maybe this very booking: a write whose answer was lost
                # is sent again by the client and refused as a conflict
                raise exception.WatchBehind(
                    obj='pod %s/%s' % (namespace, name),
                    reason='the record of node %s holds it already' % node,
                    node=node)
            return allocrecord.book(record, uid, namespace, name, when,
                                    containers, capacity,
                                    self.cache.strategy)

        record = self.records.update(node, change)
        return record.pods[uid]

    def unbook(self, node: str, uid: str, key: str) -> None:
        """The pod no longer holds anything on ``node``: retried a few
        times, then handed to ``leftover`` (a booking left behind would
        keep its GPUs from every other pod while no cache sees it)."""
        for attempt in range(self.UNBOOK_TRIES):
            if attempt:
                time.sleep(0.05 * 2 ** attempt)
            try:
                self.records.update(node, lambda record: allocrecord.without(
                    record, uid))
                return
            except exception.AmdgpuVirtError as err:
                LOG.warning('pod %s: not removed from the record of node %s '
                            '(attempt %d of %d): %s', key, node, attempt + 1,
                            self.UNBOOK_TRIES, err)
        if self.leftover is not None:
            self.leftover(node, uid)

    def forget(self, pod: Mapping[str, Any], uid: str, key: str,
               nodes: Iterable[str]) -> None:
        """A pod placed before that fits nowhere now holds nothing: its
        bookings on ``nodes``, its reservation and its mirror annotations
        go."""
        nodes = sorted(set(nodes))
        if not nodes:
            return
        self.cache.cancel(key)
        for node in nodes:
            self.unbook(node, uid, key)
        meta = pod.get('metadata') or {}
        try:
            body = {'metadata': {
                'uid': uid, 'labels': {hami.VGPU_NODE: None},
                'annotations': dict.fromkeys(MIRROR_ANNOTATIONS)}}
            k8s_client.call('PATCH pod %s' % key,
                            self.api.patch_namespaced_pod, meta.get('name'),
                            meta.get('namespace'), body,
                            _content_type=k8s_client.MERGE_PATCH,
                            _preload_content=False)
        except exception.AmdgpuVirtError as err:
            LOG.warning('pod %s: mirror annotations not removed: %s', key,
                        err)

    # -- the mirror --------------------------------------------------------

    def mirror(self, name: str, namespace: str, node: str,
               containers: hami.PodDevices,
               grants: allocrecord.PodGrants,
               version: str | None = None) -> int | None:
        """Write the HAMi annotations of the booking on the pod (at
        ``version`` only, when given);
        :returns: the pod's new ``resourceVersion`` (None: unreadable).

        :raises KubernetesConflict: the pod is no longer at ``version``.
        :raises KubernetesError: the patch failed (it may have taken
            effect when the answer was lost).
        """
        value = hami.encode_pod_devices(containers)
        pod_labels: dict[str, str | None] = {}
        if labels.is_label_value(node):
            pod_labels[hami.VGPU_NODE] = node
        meta: dict[str, Any] = {'labels': pod_labels, 'annotations': {
            hami.DEVICES_TO_ALLOCATE: value, hami.DEVICES_ALLOCATED: value,
            hami.VGPU_NODE: node,
            hami.VGPU_TIME: hami.encode_unix_time(time.time()),
            # the mirror shows the booked ranges at once
            hami.CU_ALLOCATED: hami.encode_cu_allocated(grants.masks()),
            hami.BIND_PHASE: None}}
        if version is not None:
            meta['resourceVersion'] = version
        body = {'metadata': meta}
        response = k8s_client.call(
            'PATCH pod %s/%s' % (namespace, name),
            self.api.patch_namespaced_pod, name, namespace, body,
            _content_type=k8s_client.MERGE_PATCH, _preload_content=False)
        try:
            return int(json.loads(response.data).get(
                'metadata', {}).get('resourceVersion'))
        except (TypeError, ValueError, AttributeError):
            return None

    # -- bind --------------------------------------------------------------

    def allocating(self, name: str, namespace: str) -> None:
        """``hami.io/bind-phase: allocating`` and ``bind-time``."""
        k8s_client.call('PATCH pod %s/%s' % (namespace, name),
                        self.api.patch_namespaced_pod, name, namespace,
                        {'metadata': {'annotations': {
                            hami.BIND_PHASE: hami.BindPhase.ALLOCATING.value,
                            hami.BIND_TIME: hami.encode_unix_time(
                                time.time())}}},
                        _content_type=k8s_client.MERGE_PATCH,
                        _preload_content=False)

    def binding(self, name: str, namespace: str, uid: str,
                node: str) -> None:
        """``pods/binding`` of the pod (with its UID) to ``node``."""
        body = {'apiVersion': 'v1', 'kind': 'Binding',
                'metadata': {'name': name, 'namespace': namespace,
                             'uid': uid},
                'target': {'apiVersion': 'v1', 'kind': 'Node',
                           'name': node}}
        k8s_client.call('POST pods/binding %s/%s' % (namespace, name),
                        self.api.create_namespaced_pod_binding, name,
                        namespace, body, _preload_content=False)

    def undo(self, node: str, namespace: str, name: str, uid: str,
             state: str | None, err: Exception) -> None:
        """After a failed bind of a pod that is not bound to ``node``:
        the lock released at once (retried), the pod marked failed unless
        it is bound elsewhere or unknown, and its booking removed if the
        pod is gone."""
        key = '%s/%s' % (namespace, name)
        if state is None:
            LOG.info('pod %s is gone: its booking on %s is removed', key,
                     node)
            self.unbook(node, uid, key)
        elif state == '':
            try:
                k8s_client.call('PATCH pod %s' % key,
                                self.api.patch_namespaced_pod, name, namespace,
                                {'metadata': {
                                    'uid': uid, 'annotations': {
                                        hami.BIND_PHASE:
                                        hami.BindPhase.FAILED.value}}},
                                _content_type=k8s_client.MERGE_PATCH,
                                _preload_content=False)
            except exception.AmdgpuVirtError as second:
                LOG.warning('pod %s: bind phase not marked failed: %s',
                            key, second)
        for attempt in range(5):
            try:
                self.locker.release(node, namespace, name)
                return
            except exception.AmdgpuVirtError as second:
                LOG.warning('node %s: lock of %s not released after %s '
                            '(attempt %d): %s', node, key, err, attempt + 1,
                            second)
                time.sleep(0.05 * (attempt + 1))
