"""Where the device plugin reads and writes HAMi's pod and node state.

:class:`PodSource` is the contract; :class:`KubernetesPodSource` reads the
API through the ``kubernetes`` client. Pods and nodes are plain dicts, as
the API serves them, so that :mod:`amdgpu_virt.k8s.node.sharedalloc` stays
pure.
"""

from __future__ import annotations

import abc
import logging
import random
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import TypeVar

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

T = TypeVar('T')


class PodSource(abc.ABC):
    """The node's pods and its HAMi node lock.

    :param node_name: the node this device plugin runs on.
    """

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name

    @abc.abstractmethod
    def node_lock(self) -> str | None:
        """The node's ``hami.io/mutex.lock`` value, or None.

        :raises KubernetesError: the node cannot be read.
        """

    def node_lock_holder(self) -> tuple[str | None, str | None]:
        """(the node lock value, the UID it was taken for) from one read
        of the node; either may be None.

        :raises KubernetesError: the node cannot be read.
        """
        return self.node_lock(), None

    @abc.abstractmethod
    def pods_on_node(self) -> list[dict[str, Any]]:
        """Every pod bound to the node (any phase).

        :raises KubernetesError: the pods cannot be listed.
        """

    @abc.abstractmethod
    def annotate_pod(self, pod: Mapping[str, Any],
                     annotations: Mapping[str, str | None]) -> None:
        """Write ``annotations`` on ``pod`` if it is unchanged since read.

        :raises KubernetesConflict: the pod changed (stale resourceVersion).
        :raises KubernetesError: any other failure.
        """

    @abc.abstractmethod
    def release_lock(self, namespace: str, name: str,
                     uid: str | None = None) -> None:
        """Remove the node lock if that pod holds it (else do nothing);
        with ``uid``, only if the lock was taken for that UID (or names
        none).

        :raises KubernetesError: the node cannot be read or written.
        """

    def allocation_record(self) -> Any:
        """The node's :class:`~amdgpu_virt.k8s.record.allocation.Record`.

        :raises AllocationRecordError: it cannot be read (fail closed).
        :raises KubernetesError: the API failed.
        """
        raise exception.DevicePluginError(
            resource=self.node_name, reason='this pod source has no '
            'allocation record')


class KubernetesPodSource(PodSource):
    """A :class:`PodSource` over a ``kubernetes.client.CoreV1Api``.

    A request whose answer was lost, or that the API server answered
    with 429 or 5xx, is made again, up to ``attempts`` times with a short
    backoff: each one is idempotent (reads, merge patches, conditional
    writes), and kubelet's admission of a pod fails at the first Allocate
    error, so a passing fault must not fail it.

    :param attempts: tries per request (at least 1).
    :param sleep: how to wait between tries.
    """

    def __init__(self, node_name: str, core_api: Any,
                 namespace: str = 'amdgpu-virt', attempts: int = 5,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(node_name)
        self.api = core_api
        self.namespace = namespace
        self.attempts = max(1, attempts)
        self.sleep = sleep

    def _again(self, what: str, func: Callable[[], T]) -> T:
        """``func()``, tried again on transient failures."""
        delay = 0.02
        for attempt in range(1, self.attempts + 1):
            try:
                return func()
            except exception.KubernetesError as err:
                if attempt == self.attempts or not k8s_client.transient(err):
                    raise
                LOG.debug('%s failed (%s); trying again (%d of %d)', what,
                          err, attempt + 1, self.attempts)
            self.sleep(delay * (1 + random.random()))  # noqa: S311
            delay = min(delay * 2, 0.5)
        raise AssertionError('not reached')

    def allocation_record(self) -> Any:
        store = recordstore.RecordStore(self.api, self.namespace)
        return self._again('read the allocation record of %s'
                           % self.node_name,
                           lambda: store.read(self.node_name)[0])

    def _node(self) -> dict[str, Any]:
        what = 'GET node %s' % self.node_name
        response = k8s_client.call(what, self.api.read_node, self.node_name,
                                   _preload_content=False)
        node: dict[str, Any] = k8s_client.json_body(what, response)
        return node

    def node_lock(self) -> str | None:
        return self.node_lock_holder()[0]

    def node_lock_holder(self) -> tuple[str | None, str | None]:
        annotations = self._again('GET node %s' % self.node_name,
                                  self._node).get('metadata', {}).get(
            'annotations') or {}
        return annotations.get(hami.NODE_LOCK), nodelock.lock_uid(annotations)

    def pods_on_node(self) -> list[dict[str, Any]]:
        what = 'LIST pods on node %s' % self.node_name

        def listed() -> list[dict[str, Any]]:
            response = k8s_client.call(
                what, self.api.list_pod_for_all_namespaces,
                field_selector='spec.nodeName=%s' % self.node_name,
                _preload_content=False)
            return list(k8s_client.json_body(what, response).get(
                'items') or [])

        return self._again(what, listed)

    def annotate_pod(self, pod: Mapping[str, Any],
                     annotations: Mapping[str, str | None]) -> None:
        meta = pod.get('metadata') or {}
        body: dict[str, Any] = {'metadata': {
            'annotations': dict(annotations)}}
        # a precondition when the caller read the pod; an unconditional
        # write (for a mirror) otherwise
        for field in ('resourceVersion', 'uid'):
            if meta.get(field):
                body['metadata'][field] = meta[field]
        what = 'PATCH pod %s/%s' % (meta.get('namespace'), meta.get('name'))
        self._again(what, lambda: k8s_client.call(
            what, self.api.patch_namespaced_pod, meta.get('name'),
            meta.get('namespace'), body,
            _content_type=k8s_client.MERGE_PATCH, _preload_content=False))

    def release_lock(self, namespace: str, name: str,
                     uid: str | None = None) -> None:
        what = 'PATCH node %s' % self.node_name
        for _attempt in range(5):
            # a lost answer to the PATCH is found out by the next read:
            # the lock is gone then
            node = self._again('GET node %s' % self.node_name, self._node)
            meta = node.get('metadata') or {}
            annotations = meta.get('annotations') or {}
            value = annotations.get(hami.NODE_LOCK)
            if not value:
                return
            try:
                lock = hami.decode_node_lock(value)
            except exception.HamiProtocolError:
                lock = None
            if lock is not None and not lock.held_by(namespace, name):
                return
            held_for = nodelock.lock_uid(annotations)
            if uid and held_for and held_for != uid:
                return   # the lock of another pod of that name
            body = {'metadata': {'resourceVersion': meta.get(
                'resourceVersion'), 'annotations': {
                    hami.NODE_LOCK: None, nodelock.LOCK_UID: None}}}
            try:
                k8s_client.call(what, self.api.patch_node, self.node_name,
                                body, _content_type=k8s_client.MERGE_PATCH,
                                _preload_content=False)
                return
            except exception.KubernetesConflict:
                LOG.debug('node %s changed; retrying lock release',
                          self.node_name)
            except exception.KubernetesError as err:
                if not k8s_client.transient(err):
                    raise
                LOG.debug('%s failed (%s); reading the node again', what,
                          err)
                self.sleep(0.02 * (1 + random.random()))  # noqa: S311
        raise exception.KubernetesError(
            request=what, reason='the node lock could not be released '
            'after 5 attempts')
