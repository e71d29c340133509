"""The kube-scheduler extender for AMD GPUs (HAMi protocol).

kube-scheduler (``nodeCacheCapable: true``) calls

* ``POST /filter`` with ``ExtenderArgs{Pod, Nodes, NodeNames}``: the pod's
  AMD GPU request is placed on ONE node by
  :func:`amdgpu_virt.k8s.fit.placement.decide` over the
  :class:`~amdgpu_virt.k8s.scheduler.cache.cluster.ClusterCache` (reserved
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
(:mod:`amdgpu_virt.k8s.record.allocation`), never the pod's annotations: the
filter books the pod's GPUs, memory and concrete CU ranges in the record
of the chosen node (a ``resourceVersion``-guarded write that a second
extender cannot overwrite) before it writes the annotations as a mirror;
bind refuses a pod the record of its node does not hold. Both read the
pod from the API rather than trusting the request: its UID, its
scheduler (``[kubernetes] scheduler_name``) and that it is not bound yet
(the filter from its pod watch when it can, the mirror's patch then
guarded by the pod's resourceVersion: see
:mod:`~amdgpu_virt.k8s.scheduler.pending`).
With a leader lease configured, both refuse while the kube-scheduler of
this pod does not lead.

``GET /healthz``, ``GET /readyz`` (once the cache is synced) and
``GET /metrics`` (Prometheus) complete the HTTP side.

The parts: :mod:`~amdgpu_virt.k8s.scheduler.core` decides (filter,
prioritize, bind), :mod:`~amdgpu_virt.k8s.scheduler.bookings` writes the
records, mirror annotations, node locks and bindings and undoes them,
:mod:`~amdgpu_virt.k8s.scheduler.handler` serves HTTP; this module runs them
with their watchers and record collector as one :class:`Service`
(``amdgpu-virt k8s scheduler``), and keeps the names :class:`Extender`,
:class:`Metrics` and :func:`make_server` importable from here.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import httpserver
from amdgpu_virt.k8s.api import namespaces
from amdgpu_virt.k8s.api import tls as api_tls
from amdgpu_virt.k8s.record import lockboard
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.record import sweep as recordgc
from amdgpu_virt.k8s.scheduler import fencing
from amdgpu_virt.k8s.scheduler import pending as schedpending
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import watching
from amdgpu_virt.k8s.scheduler.core import Extender
from amdgpu_virt.k8s.scheduler.handler import make_server
from amdgpu_virt.k8s.scheduler.metrics import Metrics

__all__ = ['Extender', 'Metrics', 'Service', 'lease_fence', 'make_server']

LOG = logging.getLogger(__name__)


def lease_fence(conf: Any, core_api: Any) -> fencing.LeaseFence | None:
    """The fence of ``[scheduler] leader_lease``, or None when unset."""
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


def metrics_host(group: Any) -> str:
    """The address of the probe and metrics listener: ``[scheduler]
    metrics_host``, else the pod's IP (``POD_IP``), else loopback."""
    return str(group.metrics_host or os.environ.get('POD_IP') or
               '127.0.0.1')


def _tls(group: Any) -> api_tls.TlsFiles | None:
    """:raises ConfigError: an incomplete or unloadable TLS setting."""
    if not (group.cert_file or group.key_file or group.client_ca_file):
        return None
    if not (group.cert_file and group.key_file):
        raise exception.ConfigError(
            option='[scheduler] cert_file/key_file',
            reason='set both (client_ca_file needs them too)')
    return api_tls.TlsFiles(
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
            from amdgpu_virt.k8s.api import client as k8s_client
            core_api = k8s_client.core_api(conf)
        mix = packing.Mix(packing.parse_prior(group.packing_prior),
                          group.packing_window,
                          group.packing_prior_weight) \
            if group.packing else None
        self.cache = schedcache.ClusterCache(
            allocator.load_strategy(conf.sharing.cu_strategy),
            conf.kubernetes.resource_name, mix, group.packing_candidates)
        #: the nodes' locks as the node watch shows them
        self.board = lockboard.LockBoard()
        locker = nodelock.NodeLocker(
            core_api, timeout=datetime.timedelta(
                seconds=group.node_lock_timeout),
            wait=group.node_lock_wait, grace=group.node_lock_grace,
            board=self.board)
        records = recordstore.RecordStore(core_api,
                                          conf.kubernetes.namespace)
        self.collector = recordgc.Collector(
            records, core_api, interval=group.record_sweep_interval,
            unbound_ttl=group.node_lock_timeout)
        #: the unbound pods as the pod watch shows them
        self.pending = schedpending.PendingPods()
        self.extender = Extender(
            self.cache, core_api, locker,
            default_node_policy=group.node_scheduler_policy,
            default_gpu_policy=group.gpu_scheduler_policy,
            records=records, scheduler_name=conf.kubernetes.scheduler_name,
            fence=lease_fence(conf, core_api),
            leftover=self.collector.remove_later,
            # a namespace's memory enforcement label binds within seconds
            namespace_labels=namespaces.NamespaceLabelCache(core_api,
                                                            ttl=5.0),
            gpuless_namespaces=group.gpuless_namespaces,
            pending=self.pending)
        # this process is the extender's own: pause the cyclic collector
        # while a list is read, and after each list keep the loaded objects
        # out of its full passes
        self.watchers = watching.watchers(
            self.cache, core_api, group.watch_timeout,
            after_list=watching.settle_memory,
            pause_collector=True)
        node_watcher, pod_watcher = self.watchers
        node_feed = node_watcher.on_event

        def on_node(kind: str, obj: dict[str, Any]) -> None:
            node_feed(kind, obj)
            if kind == 'DELETED':
                self.board.forget(str((obj.get('metadata') or {}).get(
                    'name')))
            else:
                self.board.observe(obj)

        node_watcher.on_event = on_node
        feed = pod_watcher.on_event

        def on_pod(kind: str, obj: dict[str, Any]) -> None:
            feed(kind, obj)
            self.pending.observe(kind, obj)
            self.collector.pod_event(kind, obj)

        def after_pods() -> None:
            watching.settle_memory()
            # bookings of pods this list no longer has go now
            self.collector.sweep_soon()

        pod_watcher.on_event = on_pod
        pod_watcher.after_list = after_pods
        limits = httpserver.Limits.from_conf(conf)
        self.servers: list[httpserver.Server] = []
        try:
            self.server = make_server(self.extender, group.host, group.port,
                                      limits, _tls(group))
            self.servers.append(self.server)
            if group.metrics_port >= 0:
                self.servers.append(make_server(
                    self.extender, metrics_host(group), group.metrics_port,
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
