"""The kube-scheduler extender for AMD GPUs (HAMi protocol).

kube-scheduler (``nodeCacheCapable: true``) calls

* ``POST /filter`` with ``ExtenderArgs{Pod, Nodes, NodeNames}``: the pod's
  AMD GPU request is placed on ONE node by :func:`amdgpu_virt.k8s.fit.decide`
  over the :class:`~amdgpu_virt.k8s.schedcache.ClusterCache` (reserved
  there at once), the pod gets ``hami.io/amd-devices-to-allocate``,
  ``hami.io/amd-devices-allocated``, ``hami.io/vgpu-node`` (also a label)
  and ``hami.io/vgpu-time``, and the answer is
  ``ExtenderFilterResult{NodeNames: [node], FailedNodes,
  FailedAndUnresolvableNodes, Error}``;
* ``POST /prioritize``: ``[HostPriority{Host, Score}]``, 0..10;
* ``POST /bind`` with ``ExtenderBindingArgs{PodName, PodNamespace, PodUID,
  Node}``: node lock, ``hami.io/bind-phase: allocating`` and
  ``hami.io/bind-time``, then ``pods/binding``; on failure the lock is
  released and ``ExtenderBindingResult{Error}`` says why.

The truth of what a pod holds is the node's allocation record
(:mod:`amdgpu_virt.k8s.allocrecord`), never the pod's annotations: the
filter books the pod's GPUs, memory and concrete CU ranges in the record
of the chosen node (a ``resourceVersion``-guarded write that a second
extender cannot overwrite) before it writes the annotations as a mirror;
bind refuses a pod the record of its node does not hold. Both read the
pod from the API rather than trusting the request: its UID, its
scheduler (``[kubernetes] scheduler_name``) and that it is not bound yet.
With a leader lease configured, both refuse while the kube-scheduler of
this pod does not lead.

``GET /healthz``, ``GET /readyz`` (once the cache is synced) and
``GET /metrics`` (Prometheus) complete the HTTP side.
"""

from __future__ import annotations

import http.server
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import prometheus_client

from amdgpu_virt import exception
from amdgpu_virt.k8s import allocrecord
from amdgpu_virt.k8s import fencing
from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s import httpserver
from amdgpu_virt.k8s import nodelock
from amdgpu_virt.k8s import labels
from amdgpu_virt.k8s import pods
from amdgpu_virt.k8s import recordgc
from amdgpu_virt.k8s import recordstore
from amdgpu_virt.k8s import schedcache
from amdgpu_virt.k8s import watching
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The extender's Prometheus metrics, in a registry of their own."""

    def __init__(self, cache: schedcache.ClusterCache) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.filter_seconds = prometheus_client.Histogram(
            'amdgpu_virt_extender_filter_seconds',
            'Time to answer /filter (decision and annotation write).',
            buckets=_BUCKETS, registry=self.registry)
        self.decide_seconds = prometheus_client.Histogram(
            'amdgpu_virt_extender_decide_seconds',
            'Time of the /filter decision on the cache alone.',
            buckets=_BUCKETS, registry=self.registry)
        self.bind_seconds = prometheus_client.Histogram(
            'amdgpu_virt_extender_bind_seconds',
            'Time to answer /bind (node lock, bind phase, binding).',
            buckets=_BUCKETS, registry=self.registry)
        self.decisions = prometheus_client.Counter(
            'amdgpu_virt_extender_decisions',
            'Answers by verb and result (fit, nofit, bound, error, '
            'ignored).', ['verb', 'result'], registry=self.registry)
        nodes = prometheus_client.Gauge(
            'amdgpu_virt_extender_cache_nodes', 'Nodes in the cache.',
            registry=self.registry)
        nodes.set_function(cache.node_count)
        gpu_pods = prometheus_client.Gauge(
            'amdgpu_virt_extender_cache_pods',
            'Live pods holding AMD GPUs in the cache.',
            registry=self.registry)
        gpu_pods.set_function(cache.pod_count)
        reserved = prometheus_client.Gauge(
            'amdgpu_virt_extender_cache_reservations',
            'Filter decisions not yet seen back through the watch.',
            registry=self.registry)
        reserved.set_function(cache.reservation_count)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


def _field(args: Mapping[str, Any], name: str, kind: type) -> Any:
    value = args.get(name)
    if not isinstance(value, kind):
        raise exception.ExtenderRequestError(
            field=name, reason='missing or not a %s' % kind.__name__)
    return value


def _node_names(args: Mapping[str, Any]) -> tuple[list[str], bool]:
    """(node names, whether they came as ``Nodes``)."""
    names = args.get('NodeNames')
    if isinstance(names, list):
        if not all(isinstance(n, str) for n in names):
            raise exception.ExtenderRequestError(
                field='NodeNames', reason='not a list of names')
        return names, False
    nodes = args.get('Nodes')
    if isinstance(nodes, Mapping) and isinstance(nodes.get('items'), list):
        result = []
        for number, node in enumerate(nodes['items']):
            name = ((node or {}).get('metadata') or {}).get('name') \
                if isinstance(node, Mapping) else None
            if not isinstance(name, str):
                raise exception.ExtenderRequestError(
                    field='Nodes.items[%d].metadata.name' % number,
                    reason='missing')
            result.append(name)
        return result, True
    raise exception.ExtenderRequestError(
        field='NodeNames', reason='neither NodeNames nor Nodes.items given')


class Extender:
    """Filter, prioritize and bind over a cache and a ``CoreV1Api``.

    :param cache: the cluster view (fed by watchers).
    :param core_api: the API client for annotation writes and bindings.
    :param locker: node locks (default: a :class:`NodeLocker` on
        ``core_api``).
    :param default_node_policy: used when a pod does not say.
    :param default_gpu_policy: used when a pod does not say.
    """

    #: nodes one filter call tries when their allocation records refuse
    #: what the cache chose (kube-scheduler retries the pod after that)
    RECORD_TRIES = 3

    def __init__(self, cache: schedcache.ClusterCache, core_api: Any,
                 locker: nodelock.NodeLocker | None = None,
                 default_node_policy: str =
                 hami.DEFAULT_NODE_SCHEDULER_POLICY,
                 default_gpu_policy: str = hami.DEFAULT_GPU_SCHEDULER_POLICY,
                 records: recordstore.RecordStore | None = None,
                 scheduler_name: str | None = None,
                 fence: fencing.LeaseFence | None = None) -> None:
        self.cache = cache
        self.api = core_api
        self.locker = locker or nodelock.NodeLocker(core_api)
        self.default_node_policy = default_node_policy
        self.default_gpu_policy = default_gpu_policy
        self.records = records or recordstore.RecordStore(core_api)
        self.scheduler_name = scheduler_name
        self.fence = fence
        self.metrics = Metrics(cache)

    def _read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        response = pods.call('GET pod %s/%s' % (namespace, name),
                             self.api.read_namespaced_pod, name, namespace,
                             _preload_content=False)
        pod: dict[str, Any] = json.loads(response.data)
        return pod

    def _verified_pod(self, namespace: str, name: str, uid: Any,
                      field: str) -> dict[str, Any]:
        """The pod as the API has it, if it is the one asked about and
        ours to place.

        :raises ExtenderRequestError: a UID that is not the pod's, a pod
            of another scheduler.
        :raises KubernetesError: the pod cannot be read (or is gone).
        """
        key = '%s/%s' % (namespace, name)
        pod = self._read_pod(namespace, name)
        meta = pod.get('metadata') or {}
        if uid and uid != meta.get('uid'):
            raise exception.ExtenderRequestError(
                field=field, reason='%s is not the uid of pod %s (%s); it '
                'was deleted and created again, or the request is forged'
                % (str(uid)[:64], key, meta.get('uid')))
        scheduler = (pod.get('spec') or {}).get('schedulerName')
        if self.scheduler_name and scheduler != self.scheduler_name:
            raise exception.ExtenderRequestError(
                field='pod %s spec.schedulerName' % key,
                reason='%r is not this extender\'s profile %r' % (
                    scheduler, self.scheduler_name))
        return pod

    def _fenced(self) -> None:
        if self.fence is not None:
            self.fence.check()

    def _request(self, pod: Mapping[str, Any]) -> fit.PodRequest:
        return fit.pod_request(pod, self.default_node_policy,
                               self.default_gpu_policy)

    # -- filter ----------------------------------------------------------

    def filter(self, args: Any) -> dict[str, Any]:
        """Answer ``ExtenderArgs`` with an ``ExtenderFilterResult``."""
        started = time.perf_counter()
        try:
            result, outcome = self._filter(args)
        except exception.AmdgpuVirtError as err:
            LOG.warning('filter refused: %s', err)
            result, outcome = {'NodeNames': None, 'Nodes': None,
                               'FailedNodes': {},
                               'FailedAndUnresolvableNodes': {},
                               'Error': str(err)}, 'error'
        self.metrics.decisions.labels('filter', outcome).inc()
        self.metrics.filter_seconds.observe(time.perf_counter() - started)
        return result

    def _filter(self, args: Any) -> tuple[dict[str, Any], str]:
        if not isinstance(args, Mapping):
            raise exception.ExtenderRequestError(field='(body)',
                                                 reason='not an object')
        pod = _field(args, 'Pod', Mapping)
        names, as_nodes = _node_names(args)
        meta = pod.get('metadata') or {}
        namespace, name = meta.get('namespace'), meta.get('name')
        if not isinstance(namespace, str) or not isinstance(name, str) or \
                not name:
            raise exception.ExtenderRequestError(
                field='Pod.metadata', reason='namespace and name required')
        key = '%s/%s' % (namespace, name)
        if not self._request(pod).wants_gpus:
            return self._answer(args, names, as_nodes, {}, {}), 'ignored'
        self._fenced()
        if not self.cache.synced:
            raise exception.ExtenderRequestError(
                field='(cache)', reason='the node and pod cache is not '
                'synced yet; retry')
        # the request's pod is only a name: decide on the API's pod
        pod = self._verified_pod(namespace, name, meta.get('uid'),
                                 'Pod.metadata.uid')
        bound = (pod.get('spec') or {}).get('nodeName')
        if bound:
            raise exception.ExtenderRequestError(
                field='Pod', reason='pod %s is already bound to node %s; '
                'it is not placed again' % (key, bound))
        uid = str((pod.get('metadata') or {}).get('uid') or '')
        request = self._request(pod)
        if not request.wants_gpus:
            return self._answer(args, names, as_nodes, {}, {}), 'ignored'
        earlier = {self.cache.placement(key), ((pod.get('metadata') or {})
                   .get('annotations') or {}).get(hami.VGPU_NODE)}
        refused: dict[str, str] = {}
        candidates = list(names)
        while True:
            began = time.perf_counter()
            decision = self.cache.decide_and_reserve(key, request,
                                                     candidates)
            self.metrics.decide_seconds.observe(time.perf_counter() - began)
            if decision.fit is None:
                failed = {**decision.failed, **refused}
                LOG.info('pod %s fits no node: %s', key, '; '.join(
                    '%s: %s' % item for item in sorted(
                        {**failed, **decision.unresolvable}.items())[:5]))
                self._forget(pod, uid, key, earlier - {None})
                return self._answer(args, [], as_nodes, failed,
                                    decision.unresolvable), 'nofit'
            node = decision.fit.node
            try:
                grants = self._book(node, uid, namespace, name,
                                    decision.fit.containers)
                break
            except exception.SharingError as err:
                # the record wins: another writer booked these GPUs first,
                # or holds a booking this cache does not see yet (one the
                # sweep has still to remove); try the next node that fits
                self.cache.cancel(key)
                refused[node] = 'refused by its allocation record ' \
                    '(booked concurrently by another pod or scheduler; ' \
                    'retry): %s' % err
                LOG.info('pod %s: node %s refused by its record: %s', key,
                         node, err)
                candidates = [n for n in candidates if n != node]
                if len(refused) >= self.RECORD_TRIES or not candidates:
                    failed = dict(decision.failed)
                    failed.update(refused)
                    return self._answer(args, [], as_nodes, failed,
                                        decision.unresolvable), 'nofit'
            except exception.AmdgpuVirtError:
                self.cache.cancel(key)
                raise
        for other in earlier - {None, node}:
            self._unbook(str(other), uid, key)
        value = hami.encode_pod_devices(decision.fit.containers)
        pod_labels: dict[str, str | None] = {}
        if labels.is_label_value(node):
            pod_labels[hami.VGPU_NODE] = node
        body = {'metadata': {'labels': pod_labels, 'annotations': {
            hami.DEVICES_TO_ALLOCATE: value, hami.DEVICES_ALLOCATED: value,
            hami.VGPU_NODE: node,
            hami.VGPU_TIME: hami.encode_unix_time(time.time()),
            # the mirror shows the booked ranges at once
            hami.CU_ALLOCATED: hami.encode_cu_allocated(grants.masks()),
            hami.BIND_PHASE: None}}}
        try:
            response = pods.call(
                'PATCH pod %s' % key, self.api.patch_namespaced_pod, name,
                namespace, body, _content_type=pods.MERGE_PATCH,
                _preload_content=False)
        except exception.KubernetesError:
            self.cache.cancel(key)
            self._unbook(node, uid, key)
            raise
        try:
            version: int | None = int(json.loads(response.data).get(
                'metadata', {}).get('resourceVersion'))
        except (TypeError, ValueError):
            version = None
        self.cache.confirm(key, version)
        LOG.info('pod %s -> node %s: %s', key, node, value)
        return self._answer(args, [node], as_nodes, decision.failed,
                            decision.unresolvable), 'fit'

    def _book(self, node: str, uid: str, namespace: str, name: str,
              containers: hami.PodDevices) -> allocrecord.PodGrants:
        """Book ``containers`` for the pod in the record of ``node``.

        :raises SharingError: the record has no room (another writer).
        """
        view = self.cache.view(node)
        capacity = allocrecord.capacity_of(
            gpu.info for gpu in (view.gpus if view is not None else ()))
        when = int(time.time())
        record = self.records.update(node, lambda record: allocrecord.book(
            record, uid, namespace, name, when, containers, capacity,
            self.cache.strategy))
        return record.pods[uid]

    def _forget(self, pod: dict[str, Any], uid: str, key: str,
                nodes: set[str | None]) -> None:
        """A pod placed before that fits nowhere now holds nothing: its
        bookings, its reservation and its mirror annotations go."""
        if not nodes:
            return
        self.cache.cancel(key)
        for node in nodes:
            self._unbook(str(node), uid, key)
        meta = pod.get('metadata') or {}
        try:
            pods.call('PATCH pod %s' % key, self.api.patch_namespaced_pod,
                      meta.get('name'), meta.get('namespace'),
                      {'metadata': {
                          'uid': uid, 'labels': {hami.VGPU_NODE: None},
                          'annotations': dict.fromkeys((
                              hami.DEVICES_TO_ALLOCATE,
                              hami.DEVICES_ALLOCATED, hami.VGPU_NODE,
                              hami.CU_ALLOCATED))}},
                      _content_type=pods.MERGE_PATCH, _preload_content=False)
        except exception.AmdgpuVirtError as err:
            LOG.warning('pod %s: mirror annotations not removed: %s', key,
                        err)

    def _unbook(self, node: str, uid: str, key: str) -> None:
        """Best effort: the pod no longer holds anything on ``node``
        (what is left is removed by the record collector)."""
        try:
            self.records.update(node, lambda record: allocrecord.without(
                record, uid))
        except exception.AmdgpuVirtError as err:
            LOG.warning('pod %s: not removed from the record of node %s: %s',
                        key, node, err)

    @staticmethod
    def _answer(args: Mapping[str, Any], names: list[str], as_nodes: bool,
                failed: Mapping[str, str],
                unresolvable: Mapping[str, str]) -> dict[str, Any]:
        result: dict[str, Any] = {
            'NodeNames': None if as_nodes else names, 'Nodes': None,
            'FailedNodes': dict(failed),
            'FailedAndUnresolvableNodes': dict(unresolvable), 'Error': ''}
        if as_nodes:
            wanted = set(names)
            nodes = dict(args['Nodes'])
            nodes['items'] = [n for n in args['Nodes']['items']
                              if n['metadata']['name'] in wanted]
            result['Nodes'] = nodes
        return result

    # -- prioritize --------------------------------------------------------

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        """``[HostPriority{Host, Score}]``: 10 for the node the filter
        chose, else by the pod's node policy (busier nodes higher for
        binpack, idler for spread)."""
        if not isinstance(args, Mapping):
            raise exception.ExtenderRequestError(field='(body)',
                                                 reason='not an object')
        pod = _field(args, 'Pod', Mapping)
        names, _as_nodes = _node_names(args)
        try:
            request = self._request(pod)
        except exception.ExtenderRequestError:
            return [{'Host': n, 'Score': 0} for n in names]
        chosen = self.cache.placement(schedcache.pod_key(pod))
        result = []
        for name in names:
            view = self.cache.view(name)
            if name == chosen:
                score = 10
            elif view is None or not view.gpus:
                score = 0
            else:
                usage = view.usage if request.node_policy == 'binpack' \
                    else 1.0 - view.usage
                score = max(0, min(9, int(usage * 10)))
            result.append({'Host': name, 'Score': score})
        self.metrics.decisions.labels('prioritize', 'ok').inc()
        return result

    # -- bind --------------------------------------------------------------

    def bind(self, args: Any) -> dict[str, Any]:
        """Answer ``ExtenderBindingArgs`` with ``ExtenderBindingResult``."""
        started = time.perf_counter()
        try:
            self._bind(args)
            result, outcome = {'Error': ''}, 'bound'
        except exception.AmdgpuVirtError as err:
            LOG.warning('bind refused: %s', err)
            result, outcome = {'Error': str(err)}, 'error'
        self.metrics.decisions.labels('bind', outcome).inc()
        self.metrics.bind_seconds.observe(time.perf_counter() - started)
        return result

    def _bind(self, args: Any) -> None:
        if not isinstance(args, Mapping):
            raise exception.ExtenderRequestError(field='(body)',
                                                 reason='not an object')
        name = _field(args, 'PodName', str)
        namespace = _field(args, 'PodNamespace', str)
        node = _field(args, 'Node', str)
        uid = args.get('PodUID')
        if uid is not None and not isinstance(uid, str):
            raise exception.ExtenderRequestError(field='PodUID',
                                                 reason='not a string')
        key = '%s/%s' % (namespace, name)
        self._fenced()
        pod = self._verified_pod(namespace, name, uid, 'PodUID')
        uid = str((pod.get('metadata') or {}).get('uid') or '')
        bound = (pod.get('spec') or {}).get('nodeName')
        if bound == node:
            LOG.info('pod %s was already bound to %s', key, node)
            return
        if bound:
            raise exception.ExtenderRequestError(
                field='Node', reason='pod %s is already bound to node %s, '
                'not %s' % (key, bound, node))
        record, _version = self.records.read(node)
        grants = record.pods.get(uid)
        if grants is None:
            if self._request(pod).wants_gpus:
                raise exception.AllocationRecordError(
                    record=allocrecord.configmap_name(node),
                    reason='it does not place pod %s (uid %s) on node %s: '
                    'the pod was not filtered onto this node by this '
                    'scheduler' % (key, uid, node))
            self._binding(name, namespace, uid, node)
            return
        self.locker.acquire(node, namespace, name, uid)
        try:
            pods.call('PATCH pod %s' % key, self.api.patch_namespaced_pod,
                      name, namespace, {'metadata': {'annotations': {
                          hami.BIND_PHASE: hami.BindPhase.ALLOCATING.value,
                          hami.BIND_TIME: hami.encode_unix_time(
                              time.time())}}},
                      _content_type=pods.MERGE_PATCH,
                      _preload_content=False)
            self._binding(name, namespace, uid, node)
        except exception.AmdgpuVirtError as err:
            # a lost answer may hide a binding that went through: look
            state = self._state(name, namespace, uid)
            if state == node:
                LOG.info('pod %s is bound to %s although the bind answered '
                         '%s', key, node, err)
                return
            self._undo(node, namespace, name, uid, state, err)
            raise
        LOG.info('pod %s bound to %s', key, node)

    def _state(self, name: str, namespace: str, uid: str) -> str | None:
        """Where the pod is bound: its node, ``''`` unbound, None gone
        (or replaced by a pod of another UID); ``'?'`` unknown."""
        for attempt in range(3):
            try:
                pod = self._read_pod(namespace, name)
            except exception.KubernetesNotFound:
                return None
            except exception.KubernetesError:
                time.sleep(0.05 * (attempt + 1))
                continue
            if (pod.get('metadata') or {}).get('uid') != uid:
                return None
            return str((pod.get('spec') or {}).get('nodeName') or '')
        return '?'

    def _binding(self, name: str, namespace: str, uid: str,
                 node: str) -> None:
        body = {'apiVersion': 'v1', 'kind': 'Binding',
                'metadata': {'name': name, 'namespace': namespace,
                             'uid': uid},
                'target': {'apiVersion': 'v1', 'kind': 'Node',
                           'name': node}}
        pods.call('POST pods/binding %s/%s' % (namespace, name),
                  self.api.create_namespaced_pod_binding, name, namespace,
                  body, _preload_content=False)

    def _undo(self, node: str, namespace: str, name: str, uid: str,
              state: str | None, err: Exception) -> None:
        """After a failed bind of a pod that is not bound to ``node``:
        the lock released at once (retried), the pod marked failed unless
        it is bound elsewhere or unknown, and its booking removed if the
        pod is gone."""
        key = '%s/%s' % (namespace, name)
        if state is None:
            LOG.info('pod %s is gone: its booking on %s is removed', key,
                     node)
            self._unbook(node, uid, key)
        elif state == '':
            try:
                pods.call('PATCH pod %s' % key,
                          self.api.patch_namespaced_pod, name, namespace,
                          {'metadata': {
                              'uid': uid, 'annotations': {
                                  hami.BIND_PHASE:
                                  hami.BindPhase.FAILED.value}}},
                          _content_type=pods.MERGE_PATCH,
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


# --- HTTP -------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    # headers and body go out in two writes: without this, Nagle's
    # algorithm and the client's delayed ACK add ~40 ms to small answers
    disable_nagle_algorithm = True
    server: _ExtenderServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        LOG.debug('extender %s - %s', self.address_string(), format % args)

    def _send(self, code: int, data: bytes,
              content_type: str = 'application/json') -> None:
        self.send_response(code)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, code: int, body: Any) -> None:
        self._send(code, json.dumps(body).encode())

    def do_GET(self) -> None:
        path = self.path.split('?')[0].rstrip('/')
        extender = self.server.extender
        if path.endswith('/healthz'):
            self._json(200, {'status': 'ok'})
        elif path.endswith('/readyz'):
            if extender.cache.synced:
                self._json(200, {'status': 'ok'})
            else:
                self._json(503, {'status': 'cache not synced'})
        elif path.endswith('/metrics'):
            self._send(200, extender.metrics.render(),
                       prometheus_client.CONTENT_TYPE_LATEST)
        else:
            self._json(404, {'error': 'no such path %s' % self.path})

    def do_POST(self) -> None:
        verb = self.path.split('?')[0].rstrip('/').rsplit('/', 1)[-1]
        extender = self.server.extender
        handlers = {'filter': extender.filter,
                    'prioritize': extender.prioritize,
                    'bind': extender.bind}
        if verb not in handlers:
            self._json(404, {'error': 'no such path %s' % self.path})
            return
        try:
            args = httpserver.read_json(self)
        except exception.HttpRequestError as err:
            body: Any = {'Error': str(err)}
            if verb == 'filter':
                body.update(NodeNames=None, FailedNodes={})
            self._json(400 if verb == 'prioritize' else 200, body)
            return
        try:
            self._json(200, handlers[verb](args))
        except exception.ExtenderRequestError as err:
            self._json(400, {'Error': str(err)})
        except Exception as err:  # answer rather than drop the connection
            LOG.exception('extender %s failed', verb)
            self._json(500, {'Error': 'internal error: %s' % err})


class _ProbeHandler(_Handler):
    """Only the GET paths: probes and metrics on the pod address."""

    def do_POST(self) -> None:
        self._json(404, {'error': 'no such path %s' % self.path})


class _ExtenderServer(httpserver.Server):
    extender: Extender


def make_server(extender: Extender, host: str = '127.0.0.1',
                port: int = 0, limits: httpserver.Limits | None = None,
                tls: httpserver.TlsFiles | None = None,
                probes_only: bool = False) -> _ExtenderServer:
    """An HTTP(S) server for the extender; call ``serve_forever``.

    :param probes_only: serve only ``GET /healthz``, ``/readyz`` and
        ``/metrics`` (the listener on the pod address).
    """
    server = _ExtenderServer(_ProbeHandler if probes_only else _Handler,
                             host, port, limits, tls,
                             name='metrics' if probes_only else 'extender')
    server.extender = extender
    return server


def lease_fence(conf: Any, core_api: Any) -> fencing.LeaseFence | None:
    """The fence of ``[scheduler] leader_lease``, or None when unset."""
    import os
    import socket

    from kubernetes import client as k8s_client

    group = conf.scheduler
    if not group.leader_lease:
        return None
    identity = group.leader_identity or os.environ.get('POD_NAME') or \
        socket.gethostname()
    return fencing.LeaseFence(
        k8s_client.CoordinationV1Api(core_api.api_client),
        conf.kubernetes.namespace, group.leader_lease, identity)


def _tls(group: Any) -> httpserver.TlsFiles | None:
    """:raises ConfigError: an incomplete or unloadable TLS setting."""
    if not (group.cert_file or group.key_file or group.client_ca_file):
        return None
    if not (group.cert_file and group.key_file):
        raise exception.ConfigError(
            option='[scheduler] cert_file/key_file',
            reason='set both (client_ca_file needs them too)')
    return httpserver.TlsFiles(
        group.cert_file, group.key_file, group.client_ca_file,
        option='[scheduler] cert_file/key_file/client_ca_file')


class Service:
    """The extender, its watchers and its HTTP server, run together.

    :param conf: configuration (``[scheduler]``, ``[sharing]``,
        ``[kubernetes]`` options).
    :param core_api: the API client (default: from ``[kubernetes]
        kubeconfig``).
    """

    def __init__(self, conf: Any, core_api: Any | None = None) -> None:
        import datetime

        from amdgpu_virt.sharing import allocator
        from amdgpu_virt.sharing import packing

        group = conf.scheduler
        if core_api is None:
            from amdgpu_virt.k8s import client as k8s_client
            core_api = k8s_client.core_api(conf)
        mix = packing.Mix(packing.parse_prior(group.packing_prior),
                          group.packing_window,
                          group.packing_prior_weight) \
            if group.packing else None
        self.cache = schedcache.ClusterCache(
            allocator.load_strategy(conf.sharing.cu_strategy),
            conf.kubernetes.resource_name, mix, group.packing_candidates)
        locker = nodelock.NodeLocker(
            core_api, timeout=datetime.timedelta(
                seconds=group.node_lock_timeout),
            wait=group.node_lock_wait, grace=group.node_lock_grace)
        records = recordstore.RecordStore(core_api,
                                          conf.kubernetes.namespace)
        self.extender = Extender(
            self.cache, core_api, locker,
            default_node_policy=group.node_scheduler_policy,
            default_gpu_policy=group.gpu_scheduler_policy,
            records=records, scheduler_name=conf.kubernetes.scheduler_name,
            fence=lease_fence(conf, core_api))
        self.collector = recordgc.Collector(
            records, core_api, interval=group.record_sweep_interval,
            unbound_ttl=group.node_lock_timeout)
        # this process is the extender's own: pause the cyclic collector
        # while a list is read, and after each list keep the loaded objects
        # out of its full passes
        self.watchers = watching.watchers(
            self.cache, core_api, group.watch_timeout,
            after_list=watching.settle_memory,
            pause_collector=True)
        pod_watcher = self.watchers[1]
        feed = pod_watcher.on_event

        def on_pod(kind: str, obj: dict[str, Any]) -> None:
            feed(kind, obj)
            self.collector.pod_event(kind, obj)

        pod_watcher.on_event = on_pod
        limits = httpserver.Limits.from_conf(conf)
        self.servers: list[_ExtenderServer] = []
        try:
            self.server = make_server(self.extender, group.host, group.port,
                                      limits, _tls(group))
            self.servers.append(self.server)
            if group.metrics_port >= 0:
                self.servers.append(make_server(
                    self.extender, group.metrics_host, group.metrics_port,
                    limits, probes_only=True))
        except OSError as err:
            for server in self.servers:
                server.server_close()
            raise exception.ConfigError(
                option='[scheduler] host/port/metrics_host/metrics_port',
                reason=str(err)) from None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """The probe and metrics listener's address (None: none)."""
        if len(self.servers) < 2:
            return None
        host, port = self.servers[1].server_address[:2]
        return str(host), int(port)

    def start(self) -> Service:
        for watcher in self.watchers:
            watcher.start()
        self.collector.start()
        for server in self.servers:
            server.start()
        LOG.info('Scheduler extender listening on %s:%d (%s)', *self.address,
                 'HTTPS' if self.server.tls else 'HTTP')
        if self.metrics_address:
            LOG.info('Probes and metrics on %s:%d', *self.metrics_address)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for watcher in self.watchers:
            watcher.stop()
        self.collector.stop()
