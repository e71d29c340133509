"""What the admission webhook reads from and writes to the API: the GPU
shapes the cluster registers, and Events recording its decisions."""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.admission import intent as pod_intent
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.k8s.api import watch as apiwatch
from amdgpu_virt.model import GpuModel
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)


class EventRecorder:
    """Records intent decisions as Events of the pod (``GpuPlacement``),
    off the admission path.

    A review only queues its Events (one per distinct decision of the
    pod); a thread of its own writes them. The queue holds at most
    ``queue_size`` Events: past that an Event is dropped and counted
    (:attr:`dropped`), never waited for, since the pod's annotations carry
    the same reasons. The Event name is derived from the admission
    request's uid (and the containers), so a retried request writes it
    once. Write failures are logged, never raised.
    """

    reason = 'GpuPlacement'
    name = 'decision events'
    ready = True

    def __init__(self, core_api: Any, component: str = 'amdgpu-virt-webhook',
                 queue_size: int = 1024, timeout: float = 5.0) -> None:
        self.api = core_api
        self.component = component
        self.timeout = timeout
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(
            queue_size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: Events dropped because the queue was full
        self.dropped = 0
        #: Events written (a retried request's counted once)
        self.written = 0

    def __call__(self, namespace: str, pod: str, uid: str,
                 message: str, field_path: str | None = None) -> None:
        """Queue one Event (dropped, and counted, when the queue is full).

        :param uid: the admission request's uid (with the containers'
            names when a request records several decisions).
        :param field_path: the container the decision is for
            (``spec.containers{name}``, as kubelet names containers in
            Events)."""
        digest = hashlib.sha256(uid.encode()).hexdigest()[:16]
        base = (pod.rstrip('-.') or 'pod')[:200]
        now = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
        name = '%s.%s' % (base, digest)
        involved = {'apiVersion': 'v1', 'kind': 'Pod',
                    'namespace': namespace, 'name': pod}
        if field_path:
            involved['fieldPath'] = field_path
        body = {'apiVersion': 'v1', 'kind': 'Event',
                'metadata': {'name': name, 'namespace': namespace},
                'involvedObject': involved,
                'reason': self.reason, 'message': message[:1024],
                'type': 'Normal', 'source': {'component': self.component},
                'firstTimestamp': now, 'lastTimestamp': now, 'count': 1,
                'reportingComponent': self.component}
        self.start()
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            with self._lock:
                self.dropped += 1
                dropped = self.dropped
            if dropped & (dropped - 1) == 0:   # 1, 2, 4, 8... times
                LOG.warning('pod %s/%s: decision Event dropped, %d queued '
                            'already (%d dropped so far)', namespace, pod,
                            self._queue.maxsize, dropped)

    def _write(self, body: dict[str, Any]) -> None:
        namespace = body['metadata']['namespace']
        name = body['metadata']['name']
        try:
            k8s_client.call('POST event %s/%s' % (namespace, name),
                            self.api.create_namespaced_event, namespace, body,
                            _preload_content=False,
                            _request_timeout=self.timeout)
            self.written += 1
        except exception.KubernetesConflict:
            pass   # the same request, retried
        except exception.AmdgpuVirtError as err:
            LOG.warning('pod %s/%s: decision Event not written: %s',
                        namespace, body['involvedObject']['name'], err)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            try:
                if body is None:
                    return
                self._write(body)
            except Exception:  # the writer outlives any one Event
                LOG.exception('decision Event not written')
            finally:
                self._queue.task_done()

    def start(self) -> EventRecorder:
        """Start the writer thread (once)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name='webhook-events')
                self._thread.start()
        return self

    def flush(self) -> None:
        """Wait until every queued Event is written or has failed."""
        if self._thread is not None:
            self._queue.join()

    def stop(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(10)


class ClusterModels:
    """The GPU shapes the cluster's nodes register, kept current by a
    watch of the nodes (never read on the admission path).

    Each node's registration (:data:`hami.NODE_REGISTER`) is bounded
    before it counts: a value longer than :data:`MAX_REGISTRATION`
    characters, more than :data:`MAX_NODE_DEVICES` devices or more than
    :data:`MAX_NODE_SHAPES` distinct shapes leaves the node out (logged,
    naming it): a node may lie about its own GPUs, it may not make every
    review of the cluster slower. The shapes are deduplicated across
    nodes; per shape, the most GPUs one node registers bounds a
    statement's ``gpus`` (:meth:`most`).

    :param wait: seconds a review waits for the first list, once.
    """

    name = 'cluster GPU shapes'

    def __init__(self, core_api: Any, wait: float = 5.0,
                 timeout: int = 300) -> None:
        self.wait = wait
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[pod_intent.ShapeKey, int]] = {}
        self._models: tuple[GpuModel, ...] = ()
        self._most: dict[GpuModel, int] = {}
        #: per node, model name -> the memory enforcement levels its GPUs
        #: register; across nodes in _levels
        self._node_levels: dict[str, dict[str, frozenset[enforcement.Level]]] \
            = {}
        self._levels: dict[str, frozenset[enforcement.Level]] = {}
        self._synced = threading.Event()
        self.api = core_api
        self.timeout = timeout
        self.watcher: apiwatch.Watcher | None = None
        #: nodes left out for an oversized registration
        self.refused: set[str] = set()

    @property
    def ready(self) -> bool:
        return self._synced.is_set()

    def start(self) -> ClusterModels:
        """Start the watch of the nodes (once)."""
        with self._lock:
            if self.watcher is not None:
                return self
            self.watcher = apiwatch.Watcher(
                'nodes (GPU shapes)', self.api.list_node, self._on_list,
                self._on_event, self.timeout)
        self.watcher.start()
        return self

    def stop(self) -> None:
        with self._lock:
            watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.stop()

    def _snapshot(self) -> None:
        """Recompute the models from the nodes' counts (under the lock)."""
        most = pod_intent.most_per_node(self._nodes.values())
        self._most = most
        self._models = tuple(sorted(most, key=_model_order))
        levels: dict[str, set[enforcement.Level]] = {}
        for per_node in self._node_levels.values():
            for name, found in per_node.items():
                levels.setdefault(name, set()).update(found)
        self._levels = {name: frozenset(found)
                        for name, found in levels.items()}

    def _counts(self, node: dict[str, Any]) -> tuple[
            str, dict[pod_intent.ShapeKey, int],
            dict[str, frozenset[enforcement.Level]]]:
        meta = node.get('metadata') or {}
        name = str(meta.get('name') or '?')
        value = (meta.get('annotations') or {}).get(hami.NODE_REGISTER)
        if not value:
            return name, {}, {}
        try:
            devices = registered_devices(name, value)
        except exception.HamiProtocolError as err:
            if name not in self.refused:
                LOG.warning('node %s: its GPUs are left out of the shapes '
                            'stated needs are judged on: %s', name, err)
            self.refused.add(name)
            return name, {}, {}
        self.refused.discard(name)
        counts: dict[pod_intent.ShapeKey, int] = {}
        usable = []
        for device in devices:
            key = pod_intent.shape_key(device)
            if key is not None and fit.usable_device(device) is None:
                counts[key] = counts.get(key, 0) + 1
                usable.append(device)
        return name, counts, pod_intent.levels_from_registrations(usable)

    def _on_list(self, items: list[Any], _version: int | None) -> None:
        read = [self._counts(item) for item in items
                if isinstance(item, dict)]
        with self._lock:
            self._nodes = {n: c for n, c, _levels in read if c}
            self._node_levels = {n: levels for n, c, levels in read if c}
            self._snapshot()
        self._synced.set()

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        name, counts, levels = self._counts(obj)
        if kind == 'DELETED':
            counts, levels = {}, {}
        with self._lock:
            if self._nodes.get(name, {}) == counts and \
                    self._node_levels.get(name, {}) == levels:
                return
            if counts:
                self._nodes[name] = counts
                self._node_levels[name] = levels
            else:
                self._nodes.pop(name, None)
                self._node_levels.pop(name, None)
            self._snapshot()

    def _ready(self) -> None:
        """:raises ClusterShapesUnknown: the first list is not read yet."""
        if self._synced.is_set():
            return
        self.start()
        if not self._synced.wait(self.wait):
            raise exception.ClusterShapesUnknown(
                reason='the webhook has not listed the nodes yet; retry')

    def __call__(self) -> tuple[GpuModel, ...]:
        """The models, now (see :meth:`_ready` for what it raises)."""
        self._ready()
        with self._lock:
            return self._models

    def most(self) -> dict[GpuModel, int]:
        """Per model, the most GPUs of it one node registers."""
        self._ready()
        with self._lock:
            return self._most

    def levels(self) -> dict[str, frozenset[enforcement.Level]]:
        """Model name -> the memory enforcement levels its GPUs register
        (as read with the models)."""
        self._ready()
        with self._lock:
            return self._levels


#: longest node registration read (the API's limit on all of an object's
#: annotations is 256 KiB)
MAX_REGISTRATION = 256 * 1024
#: most devices one node may register (8 GPUs of 8 partitions is 64)
MAX_NODE_DEVICES = 128
#: most distinct GPU shapes one node may register (one GPU type in a few
#: partition modes)
MAX_NODE_SHAPES = 8


def _model_order(model: GpuModel) -> tuple[str, int, int, int]:
    return (model.name, model.compute_units or 0, model.vram_mib or 0,
            model.cu_alloc_unit)


def registered_devices(node: str, value: Any
                       ) -> tuple[hami.DeviceInfo, ...]:
    """The devices node ``node`` registers in ``value``, within bounds.

    :raises HamiProtocolError: not a string, longer than
        :data:`MAX_REGISTRATION`, not a registration, more than
        :data:`MAX_NODE_DEVICES` devices or :data:`MAX_NODE_SHAPES`
        shapes.
    """
    def refuse(reason: str) -> exception.HamiProtocolError:
        return exception.HamiProtocolError('node %s: %s: %s' % (
            node, hami.NODE_REGISTER, reason))

    if not isinstance(value, str) or len(value) > MAX_REGISTRATION:
        raise refuse('longer than %d characters, or not a string'
                     % MAX_REGISTRATION)
    devices = hami.decode_node_register(value)
    if len(devices) > MAX_NODE_DEVICES:
        raise refuse('%d devices, more than the %d a node may register'
                     % (len(devices), MAX_NODE_DEVICES))
    shapes = {pod_intent.shape_key(d) for d in devices} - {None}
    if len(shapes) > MAX_NODE_SHAPES:
        raise refuse('%d distinct GPU shapes, more than the %d a node may '
                     'register' % (len(shapes), MAX_NODE_SHAPES))
    return devices


def _value(text: Any) -> Any:
    try:
        return quantity.value(text)
    except exception.InvalidQuantity:
        return text


def _values(spec: Any) -> Any:
    """A template's ``spec`` with its quantities as values."""
    if not isinstance(spec, dict):
        return spec
    return quantity.map_fields(spec, tuple(
        ('spec',) + p for p in quantity.CLAIM_SPEC_PATHS), _value)


class ClaimTemplates:
    """Makes sure a ResourceClaimTemplate exists, through a
    ``ResourceV1Api`` (the DRA path of stated needs).

    The name is derived from the content, so an existing template of that
    name is reused; one whose spec differs (someone else wrote it) is
    refused rather than trusted. Quantities are compared by value: the API
    server stores them in its own form.
    """

    def __init__(self, resource_api: Any) -> None:
        self.api = resource_api

    def __call__(self, namespace: str, template: dict[str, Any]) -> None:
        name = template['metadata']['name']
        what = 'ResourceClaimTemplate %s/%s' % (namespace, name)
        try:
            k8s_client.call('POST %s' % what,
                            self.api.create_namespaced_resource_claim_template,
                            namespace, template, _preload_content=False)
            return
        except exception.KubernetesConflict:
            pass   # it exists: it must be ours
        response = k8s_client.call(
            'GET %s' % what, self.api.read_namespaced_resource_claim_template,
            name, namespace, _preload_content=False)
        found = json.loads(response.data).get('spec')
        if _values(found) != _values(template['spec']):
            raise exception.KubernetesError(
                request='GET %s' % what,
                reason='it exists with another spec (%s), not the one this '
                'webhook writes; remove it' % json.dumps(found,
                                                         sort_keys=True))
