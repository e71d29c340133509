"""HAMi's node lock (``hami.io/mutex.lock``) as the extender's bind takes it.

One pod at a time may be between bind and the device plugin's Allocate on
a node: the lock says which. Kubelet's Allocate names no pod, so the
device plugin serves the pod the lock names, and the lock must therefore
never pass to another pod while the kubelet may still send the holder's
Allocate. :class:`NodeLocker` sets it with a merge patch that carries the
node's resourceVersion (a conflict is retried with backoff), writing the
holder's UID next to it (:data:`LOCK_UID`, so that a pod deleted and
created again under the same name is not taken for the holder), and
refuses a lock that is held, as HAMi does, even by the same pod, unless
it is *stale*:

* expired: older than the lock timeout (HAMi: 5 minutes);
* its owner pod has finished or was allocated (``hami.io/bind-phase:
  success``: the device plugin's release was lost);
* its owner pod exists, with the UID the lock names, but is not bound to
  the node, once the lock is older than ``grace`` seconds: within the
  grace a bind in progress (the lock is taken before the binding) keeps
  its lock; after it, a failed bind whose release was lost does not hold
  the node for the whole timeout.

A lock whose owner is *gone* (deleted, or replaced by a pod of another
UID under its name) is not stale before it expires, however old: the
pod may have been bound, and its late Allocate must still find the lock
that names it, so that the device plugin refuses it instead of serving
it the next pod's allocation. The device plugin retires such a lock once
it refused an Allocate under it (kubelet's admission of the pod then
failed: no further Allocate comes for it); the extender's own failed
bind releases its lock at once.

A lock value that cannot be read is refused, as HAMi refuses it: it may
be a live lock of a writer we do not understand, and two pods allocating
on one node at once would confuse the device plugin. The error names the
value; removing the annotation by hand frees the node.

While the lock is held by another live pod, :meth:`NodeLocker.acquire`
waits with backoff up to ``wait`` seconds and then gives up with
:class:`~amdgpu_virt.exception.NodeLockError` naming the holder. With a
:class:`~amdgpu_virt.k8s.record.lockboard.LockBoard` fed by the node
watch, the node is read from the board (a stale one makes the guarded
patch fail with ``409``, and the node is then read from the API) and a
wait ends as soon as the board shows the node changed.
"""

from __future__ import annotations

import datetime
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.sharing import hami

if TYPE_CHECKING:
    from amdgpu_virt.k8s.record import lockboard

LOG = logging.getLogger(__name__)

DONE_PHASES = ('Succeeded', 'Failed')
#: node annotation next to HAMi's node lock: ``<pod UID> <lock value>``,
#: the UID of the pod the lock was taken for (written and removed with
#: the lock; the lock value pairs it with that very lock, so a lock
#: another writer such as HAMi's scheduler took over is not given a UID
#: that is not its own)
LOCK_UID = 'amdgpu-virt.io/node-lock-uid'


def encode_lock_uid(uid: str, lock_value: str) -> str:
    """The :data:`LOCK_UID` value for ``uid`` holding ``lock_value``."""
    return '%s %s' % (uid, lock_value)


def lock_uid(annotations: Mapping[str, Any]) -> str | None:
    """The UID the node lock in ``annotations`` was taken for, or None
    (no UID, or one written for another lock value)."""
    value, lock = annotations.get(LOCK_UID), annotations.get(hami.NODE_LOCK)
    if not isinstance(value, str) or not isinstance(lock, str):
        return None
    uid, _sep, held = value.partition(' ')
    return uid if uid and held == lock else None


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class NodeLocker:
    """Takes and releases node locks through a ``CoreV1Api``.

    :param core_api: the API client.
    :param timeout: age after which a lock has expired.
    :param wait: seconds :meth:`acquire` waits for a held lock.
    :param grace: seconds before the lock of a pod that exists but is not
        bound to the node is stale.
    :param clock: current time (aware).
    :param sleep: how to wait between attempts.
    :param board: the nodes' locks as the node watch shows them (None:
        every read goes to the API, every wait polls).
    """

    def __init__(self, core_api: Any,
                 timeout: datetime.timedelta = hami.NODE_LOCK_TIMEOUT,
                 wait: float = 10.0,
                 grace: float = 0.0,
                 clock: Callable[[], datetime.datetime] = _utcnow,
                 sleep: Callable[[float], None] = time.sleep,
                 board: lockboard.LockBoard | None = None) -> None:
        self.api = core_api
        self.timeout = timeout
        self.wait = wait
        self.grace = datetime.timedelta(seconds=grace)
        self.clock = clock
        self.sleep = sleep
        self.board = board
        #: node -> the queue of this process's binds of it
        self._queues: dict[str, threading.Lock] = {}
        self._queues_lock = threading.Lock()

    def _node(self, node: str, fresh: bool = True) -> dict[str, Any]:
        """The node; from the board unless ``fresh`` (or not on it)."""
        if not fresh and self.board is not None:
            seen = self.board.node(node)
            if seen is not None:
                return seen
        response = k8s_client.call('GET node %s' % node, self.api.read_node,
                                   node, _preload_content=False)
        obj: dict[str, Any] = json.loads(response.data)
        if self.board is not None:
            self.board.observe(obj)
        return obj

    def _observe(self, node: str, response: Any) -> None:
        """Show the board the node a write answered with."""
        if self.board is None:
            return
        try:
            self.board.observe(json.loads(response.data))
        except ValueError:
            self.board.forget(node)

    def _pause(self, node: str, version: Any, seconds: float) -> bool:
        """Wait ``seconds``, or less when the board shows a newer
        version of the node; :returns: whether it did (else the node is
        read from the API next: the watch may be behind or down)."""
        if self.board is None:
            self.sleep(seconds)
            return False
        return self.board.wait(node, version, seconds)

    def _owner_state(self, lock: hami.NodeLock, node: str,
                     uid: str | None = None) -> str:
        """``'live'``, ``'done'`` (finished), ``'gone'`` (deleted, or
        replaced by a pod of another UID than ``uid``) or ``'unbound'``
        (bound to no or another node)."""
        if not lock.namespace or not lock.pod:
            return 'live'
        try:
            response = k8s_client.call('GET pod %s/%s' % (lock.namespace,
                                                    lock.pod),
                                 self.api.read_namespaced_pod, lock.pod,
                                 lock.namespace, _preload_content=False)
        except exception.KubernetesNotFound:
            return 'gone'
        pod = json.loads(response.data)
        meta = pod.get('metadata') or {}
        if uid and meta.get('uid') != uid:
            return 'gone'
        annotations = meta.get('annotations') or {}
        if (pod.get('status') or {}).get('phase') in DONE_PHASES or \
                annotations.get(hami.BIND_PHASE) == \
                hami.BindPhase.SUCCESS.value:
            # finished, or every container allocated (a release was lost)
            return 'done'
        if node != '?' and (pod.get('spec') or {}).get('nodeName') != node:
            return 'unbound'
        return 'live'

    def holder(self, value: str, now: datetime.datetime, node: str = '?',
               requester: str = '?', uid: str | None = None
               ) -> hami.NodeLock | None:
        """The live lock ``value`` stands for, or None when it is stale.

        :param uid: the UID the lock was taken for (:data:`LOCK_UID`), if
            known.
        :raises NodeLockError: the value cannot be read (naming ``node``
            and the ``requester`` pod).
        """
        try:
            lock = hami.decode_node_lock(value)
        except exception.HamiProtocolError as err:
            raise exception.NodeLockError(
                node=node, pod=requester,
                reason='unreadable lock (%s); remove the annotation to free '
                'the node' % err) from None
        if lock.expired(now, self.timeout):
            LOG.info('Node lock %r expired (older than %s)', value,
                     self.timeout)
            return None
        state = self._owner_state(lock, node, uid)
        # unbound counts only with a grace: the lock is taken before the
        # binding; gone never does (its late Allocate must find the lock)
        if state == 'done' or state == 'unbound' and self.grace and \
                now - lock.time >= self.grace:
            LOG.info('Node lock %r is stale: pod %s/%s is %s (node %s)',
                     value, lock.namespace, lock.pod, state, node)
            return None
        return lock

    def acquire(self, node: str, namespace: str, pod: str,
                uid: str | None = None) -> None:
        """Lock ``node`` for pod ``namespace/pod`` (of UID ``uid``).

        :raises NodeLockError: held by another live pod (or by this pod:
            HAMi refuses that too) for longer than ``wait``, or the node
            keeps changing.
        :raises KubernetesError: the node cannot be read or written.
        """
        deadline = time.monotonic() + self.wait
        # this process's binds of one node queue here, one at a time
        # before the API: a lock passed on wakes one waiter, not all
        queue = self._queue(node)
        if not queue.acquire(timeout=max(0.0, self.wait)):
            raise exception.NodeLockError(
                node=node, pod='%s/%s' % (namespace, pod),
                reason='other binds of this node went first; gave up '
                'after %.1f s' % self.wait)
        try:
            self._acquire(node, namespace, pod, uid, deadline)
        finally:
            queue.release()

    def _queue(self, node: str) -> threading.Lock:
        with self._queues_lock:
            queue = self._queues.get(node)
            if queue is None:
                queue = self._queues[node] = threading.Lock()
            return queue

    def _acquire(self, node: str, namespace: str, pod: str,
                 uid: str | None, deadline: float) -> None:
        delay = 0.01
        fresh = self.board is None
        while True:
            obj = self._node(node, fresh)
            fresh = False
            meta = obj.get('metadata') or {}
            annotations = meta.get('annotations') or {}
            value = annotations.get(hami.NODE_LOCK)
            now = self.clock()
            held = self.holder(value, now, node, '%s/%s' % (
                namespace, pod), lock_uid(annotations)) \
                if value else None
            if held is None:
                lock = hami.encode_node_lock(hami.NodeLock(now, namespace,
                                                           pod))
                body = {'metadata': {
                    'resourceVersion': meta.get('resourceVersion'),
                    'annotations': {hami.NODE_LOCK: lock, LOCK_UID:
                                    encode_lock_uid(uid, lock)
                                    if uid else None}}}
                try:
                    response = k8s_client.call(
                        'PATCH node %s' % node, self.api.patch_node, node,
                        body, _content_type=k8s_client.MERGE_PATCH,
                        _preload_content=False)
                except exception.KubernetesConflict:
                    LOG.debug('node %s changed while locking; retrying',
                              node)
                    reason = 'the node kept changing (409 Conflict)'
                    # decide again on the node as the API has it
                    fresh = True
                else:
                    self._observe(node, response)
                    return
            else:
                reason = 'held by %s/%s since %s' % (
                    held.namespace or '?', held.pod or '?',
                    hami.format_rfc3339(held.time))
            if time.monotonic() >= deadline:
                raise exception.NodeLockError(
                    node=node, pod='%s/%s' % (namespace, pod),
                    reason='%s; gave up after %.1f s' % (reason, self.wait))
            fresh = fresh or not self._pause(
                node, meta.get('resourceVersion'),
                delay * (1 + random.random()))  # noqa: S311
            delay = min(delay * 2, 0.5)

    def release(self, node: str, namespace: str, pod: str) -> bool:
        """Remove the lock if that pod holds it.

        :returns: True if a lock was removed.
        :raises KubernetesError: the node cannot be read or written.
        """
        for _attempt in range(10):
            obj = self._node(node)
            meta = obj.get('metadata') or {}
            value = (meta.get('annotations') or {}).get(hami.NODE_LOCK)
            if not value:
                return False
            try:
                lock = hami.decode_node_lock(value)
            except exception.HamiProtocolError:
                return False
            if not lock.held_by(namespace, pod):
                return False
            body = {'metadata': {'resourceVersion': meta.get(
                'resourceVersion'), 'annotations': {hami.NODE_LOCK: None,
                                                    LOCK_UID: None}}}
            try:
                response = k8s_client.call(
                    'PATCH node %s' % node, self.api.patch_node, node, body,
                    _content_type=k8s_client.MERGE_PATCH,
                    _preload_content=False)
                self._observe(node, response)
                return True
            except exception.KubernetesConflict:
                self.sleep(0.01 * (1 + random.random()))  # noqa: S311
        raise exception.KubernetesError(
            request='PATCH node %s' % node,
            reason='the node lock could not be released after 10 conflicts')
