"""The scheduler extender's decisions: filter, prioritize and bind.

:class:`Extender` answers kube-scheduler's ``ExtenderArgs`` and
``ExtenderBindingArgs`` (see :mod:`amdgpu_virt.k8s.scheduler.service` for the
protocol). It decides on the
:class:`~amdgpu_virt.k8s.scheduler.cache.cluster.ClusterCache` with
:func:`amdgpu_virt.k8s.fit.placement.decide`, checks every pod against the API
(its UID, its scheduler, that it is not bound yet), and writes through
:class:`~amdgpu_virt.k8s.scheduler.bookings.Bookings`: the record first (the
truth), the mirror annotations after, the node lock and binding at bind. The
HTTP side is :mod:`amdgpu_virt.k8s.scheduler.handler`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.scheduler import bookings as extenderbookings
from amdgpu_virt.k8s.scheduler import fencing
from amdgpu_virt.k8s.scheduler import metrics
from amdgpu_virt.k8s.scheduler import pending as schedpending
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)


def _field(args: Mapping[str, Any], name: str, kind: type) -> Any:
    value = args.get(name)
    if not isinstance(value, kind):
        raise exception.ExtenderRequestError(
            field=name, reason='missing or not a %s' % kind.__name__)
    return value


def gpuless_scores(costs: Mapping[str, float]) -> dict[str, int]:
    """``/prioritize`` scores (0..10) of the nodes for a pod that asks no
    GPU, from the GPU capacity it would leave each node unable to feed
    (:meth:`~amdgpu_virt.k8s.scheduler.cache.cluster.ClusterCache.
    stranding`): 10 where it strands least, 0 where it strands most,
    linear in between; all 10 when it strands nothing anywhere."""
    worst = max(costs.values(), default=0.0)
    best = min(costs.values(), default=0.0)
    if worst - best <= 1e-9:
        return dict.fromkeys(costs, 10)
    span = worst - best
    return {name: int(round(10 * (worst - cost) / span))
            for name, cost in costs.items()}


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
    :param leftover: called with ``(node, pod uid)`` for a booking whose
        removal kept failing (see :class:`~amdgpu_virt.k8s.
        extenderbookings.Bookings`).
    :param namespace_labels: namespace -> its labels (None: namespaces
        require nothing); a namespace labelled
        ``gpu.amd.com/memory-enforcement`` gets its pods' slices only on
        GPUs whose registered memory enforcement meets the label.
    :param gpuless_namespaces: namespaces whose pods that ask no AMD GPU
        are scored by ``/prioritize`` to keep them off the CPU and memory
        that GPUs need (``*``: every namespace; none by default).
    :param pending: the pods waiting for a node as the pod watch shows
        them (see :mod:`~amdgpu_virt.k8s.scheduler.pending`).
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
                 fence: fencing.LeaseFence | None = None,
                 leftover: Callable[[str, str], None] | None = None,
                 namespace_labels: Callable[[str], Mapping[str, str]]
                 | None = None,
                 gpuless_namespaces: Iterable[str] = (),
                 pending: schedpending.PendingPods | None = None) -> None:
        self.cache = cache
        #: the unbound pods as the pod watch shows them (None: the
        #: filter reads every pod from the API)
        self.pending = pending
        self.namespace_labels = namespace_labels
        #: namespaces whose pods without GPUs /prioritize scores by the
        #: GPU capacity they would strand ('*': every namespace)
        self.gpuless_namespaces = frozenset(gpuless_namespaces)
        self.api = core_api
        self.locker = locker or nodelock.NodeLocker(core_api)
        self.default_node_policy = default_node_policy
        self.default_gpu_policy = default_gpu_policy
        self.records = records or recordstore.RecordStore(core_api)
        self.scheduler_name = scheduler_name
        self.fence = fence
        self.metrics = metrics.Metrics(cache)
        self.bookings = extenderbookings.Bookings(
            cache, core_api, self.records, self.locker, leftover)

    def _verified_pod(self, namespace: str, name: str, uid: Any,
                      field: str) -> dict[str, Any]:
        """The pod as the API has it, if it is the one asked about and
        ours to place.

        :raises ExtenderRequestError: a UID that is not the pod's, a pod
            of another scheduler.
        :raises KubernetesError: the pod cannot be read (or is gone).
        """
        pod = self.bookings.read_pod(namespace, name)
        self._check_pod(pod, '%s/%s' % (namespace, name), uid, field)
        return pod

    def _check_pod(self, pod: Mapping[str, Any], key: str, uid: Any,
                   field: str) -> None:
        """:raises ExtenderRequestError: ``uid`` is not the pod's, or the
        pod is another scheduler's."""
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

    def _fenced(self) -> None:
        if self.fence is not None:
            self.fence.check()

    def _request(self, pod: Mapping[str, Any]) -> fit.PodRequest:
        return fit.pod_request(pod, self.default_node_policy,
                               self.default_gpu_policy)

    def _namespace_rules(self, namespace: str,
                         request: fit.PodRequest) -> fit.PodRequest:
        """``request`` with what the pod's namespace requires of its
        slices' memory enforcement.

        :raises KubernetesError: the namespace cannot be read (fail
            closed: its requirement cannot be checked).
        :raises ExtenderRequestError: the label's value is no
            requirement (fail closed, naming the label).
        """
        if self.namespace_labels is None:
            return request
        labels = self.namespace_labels(namespace)
        wanted, problem = enforcement.namespace_requirement(labels)
        if problem is not None:
            raise exception.ExtenderRequestError(
                field='namespace %s' % namespace, reason=problem)
        if wanted is None:
            return request
        return dataclasses.replace(
            request, memory_enforcement=wanted,
            memory_enforcement_why='namespace %r (label %s=%s)' % (
                namespace, enforcement.NAMESPACE_LABEL, wanted.value))

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
        # the request's pod is only a name: decide on the API's pod, as
        # the pod watch shows it when it can (the mirror's patch then
        # carries its version: a stale one is refused, and the filter
        # decides again on the pod read from the API)
        seen = None if self.pending is None else self.pending.get(
            namespace, name, meta.get('uid'))
        held: str | None = None
        if seen is not None:
            self._check_pod(seen[0], key, meta.get('uid'), 'Pod.metadata.uid')
            try:
                return self._place(args, names, as_nodes, key, seen[0],
                                   seen[1])
            except exception.KubernetesConflict as err:
                LOG.info('pod %s changed since the watch showed it; '
                         'deciding again on the API\'s pod', key)
                # a record that holds the pod already (perhaps this
                # filter's own write, its answer lost): that booking is
                # an earlier one for the decision on the API's pod
                node = err.kwargs.get('node')
                held = node if isinstance(node, str) else None
        pod = self._verified_pod(namespace, name, meta.get('uid'),
                                 'Pod.metadata.uid')
        return self._place(args, names, as_nodes, key, pod, None, held)

    def _place(self, args: Mapping[str, Any], names: list[str],
               as_nodes: bool, key: str, pod: Mapping[str, Any],
               version: str | None, held: str | None = None
               ) -> tuple[dict[str, Any], str]:
        """Decide, book and mirror ``pod`` (of ``version``, when it is
        the watch's: the mirror's precondition). ``held``: a node whose
        record holds the pod though neither the cache nor the pod says
        so (removed there when the pod goes elsewhere or nowhere).

        :raises KubernetesConflict: the pod changed since ``version``
            (its booking undone), or may have (:class:`~amdgpu_virt.
            exception.WatchBehind`: it was placed before, nothing
            written).
        """
        namespace, name = key.split('/', 1)
        bound = (pod.get('spec') or {}).get('nodeName')
        if bound:
            raise exception.ExtenderRequestError(
                field='Pod', reason='pod %s is already bound to node %s; '
                'it is not placed again' % (key, bound))
        uid = str((pod.get('metadata') or {}).get('uid') or '')
        request = self._request(pod)
        if not request.wants_gpus:
            return self._answer(args, names, as_nodes, {}, {}), 'ignored'
        request = self._namespace_rules(namespace, request)
        earlier = {self.cache.placement(key), ((pod.get('metadata') or {})
                   .get('annotations') or {}).get(hami.VGPU_NODE), held}
        if version is not None and earlier - {None}:
            # placed before: what to undo is decided on the API's pod
            raise exception.WatchBehind(obj='pod %s' % key,
                                        reason='it was placed before')
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
                self.bookings.forget(pod, uid, key, {
                    str(n) for n in earlier if n})
                return self._answer(args, [], as_nodes, failed,
                                    decision.unresolvable), 'nofit'
            node = decision.fit.node
            try:
                grants = self.bookings.book(node, uid, namespace, name,
                                            decision.fit.containers,
                                            first=version is not None)
                break
            except exception.WatchBehind:
                # nothing written now: the record holds a booking of the
                # pod (an earlier one, or this one whose answer was lost)
                self.cache.cancel(key)
                raise
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
            except exception.AmdgpuVirtError as err:
                self.cache.cancel(key)
                if isinstance(err, exception.KubernetesError) and \
                        not isinstance(err, exception.AllocationRecordError):
                    # the write may have taken effect, its answer lost: a
                    # booking nobody knows of would hold the GPUs until
                    # the sweep
                    self.bookings.unbook(node, uid, key)
                raise
        for other in earlier - {None, node}:
            self.bookings.unbook(str(other), uid, key)
        try:
            written = self.bookings.mirror(name, namespace, node,
                                           decision.fit.containers, grants,
                                           version)
        except exception.KubernetesError:
            self.cache.cancel(key)
            self.bookings.unbook(node, uid, key)
            raise
        self.cache.confirm(key, written)
        LOG.info('pod %s -> node %s: %s', key, node,
                 hami.encode_pod_devices(decision.fit.containers))
        return self._answer(args, [node], as_nodes, decision.failed,
                            decision.unresolvable), 'fit'

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
        binpack, idler for spread); for a pod that asks no AMD GPU, of a
        namespace of ``gpuless_namespaces``, by how little GPU capacity its
        CPU and memory would leave unfed (:func:`gpuless_scores`), 0
        everywhere for the others (no preference)."""
        if not isinstance(args, Mapping):
            raise exception.ExtenderRequestError(field='(body)',
                                                 reason='not an object')
        pod = _field(args, 'Pod', Mapping)
        names, _as_nodes = _node_names(args)
        try:
            request = self._request(pod)
        except exception.ExtenderRequestError:
            return [{'Host': n, 'Score': 0} for n in names]
        if not request.wants_gpus:
            return self._prioritize_gpuless(pod, request, names)
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

    def _prioritize_gpuless(self, pod: Mapping[str, Any],
                            request: fit.PodRequest,
                            names: list[str]) -> list[dict[str, Any]]:
        """Scores a pod without AMD GPU: where its host request strands
        least GPU capacity (the request's pod is trusted here: a score
        writes nothing)."""
        namespace = (pod.get('metadata') or {}).get('namespace')
        wanted = self.gpuless_namespaces
        if request.host is None or not (
                '*' in wanted or namespace in wanted):
            self.metrics.decisions.labels('prioritize', 'ignored').inc()
            return [{'Host': n, 'Score': 0} for n in names]
        scores = gpuless_scores(self.cache.stranding(names, request.host))
        self.metrics.decisions.labels('prioritize', 'gpuless').inc()
        # a node the cache does not know holds no GPU it knows of
        return [{'Host': n, 'Score': scores.get(n, 10)} for n in names]

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
            self.bookings.binding(name, namespace, uid, node)
            return
        self.locker.acquire(node, namespace, name, uid)
        try:
            self.bookings.allocating(name, namespace)
            self.bookings.binding(name, namespace, uid, node)
        except exception.AmdgpuVirtError as err:
            # a lost answer may hide a binding that went through: look
            state = self.bookings.state(name, namespace, uid)
            if state == node:
                LOG.info('pod %s is bound to %s although the bind answered '
                         '%s', key, node, err)
                return
            self.bookings.undo(node, namespace, name, uid, state, err)
            raise
        LOG.info('pod %s bound to %s', key, node)

