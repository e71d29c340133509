"""The node agent: registers the node's GPUs with the scheduler side.

HAMi's scheduler (and ours) learns what a node offers from the node
annotation ``hami.io/node-amd-register``: a JSON array of DeviceInfo,
re-written every 30 seconds by the node side. The agent writes it from
the node's GPU units (:mod:`amdgpu_virt.k8s.node.devices`), with the same
``count`` the device plugin offers kubelet and each GPU's health, and
only when it differs from what the node carries (compared after
decoding, so that an equivalent value written by another encoder is left
alone). Writes carry the node's resourceVersion and are retried on
conflict. :meth:`NodeAgent.cleanup` removes the annotation.

With a role ledger (:mod:`amdgpu_virt.k8s.node.roles`), each registration
reads the ledger again and lists only the GPUs it gives to Kubernetes on
this node: a GPU moved to another role leaves the annotation at the next
registration, which is what ``amdgpu-virt move`` waits for.

Made by :func:`from_conf`, the agent judges GPU health with a
:class:`~amdgpu_virt.k8s.node.health.HealthMonitor` (an unhealthy unit is
registered ``health: false`` with ``custominfo.healthReason``), publishes
it on the node (:mod:`amdgpu_virt.k8s.node.healthpublish`) and, once
started, serves the node's metrics (:mod:`amdgpu_virt.k8s.node.telemetry`)
on ``[telemetry] metrics_port``.
"""

from __future__ import annotations

import abc
import functools
import logging
import threading
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import enforcement
from amdgpu_virt.k8s.node import health as node_health
from amdgpu_virt.k8s.node import healthpublish
from amdgpu_virt.k8s.node import labels as node_labels
from amdgpu_virt.k8s.node import memhook
from amdgpu_virt.k8s.node import roles as noderoles
from amdgpu_virt.k8s.node import telemetry
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

VENDOR = 'amd'
CONFLICT_RETRIES = 5


def registration(units: Sequence[devices.GpuUnit], share_count: int,
                 healthy: Mapping[str, bool], *,
                 reasons: Mapping[str, str] | None = None,
                 levels: Mapping[str, enforcement.Level] | None = None
                 ) -> tuple[hami.DeviceInfo, ...]:
    """The DeviceInfo of every unit, in unit order.

    :param healthy: unit uuid -> health; a missing uuid counts as healthy.
    :param reasons: unit uuid -> why it is unhealthy (custominfo
        ``healthReason`` of an unhealthy unit).
    :param levels: PCI address -> memory enforcement level, published as
        ``custominfo.memoryEnforcement`` (None: not published).
    """
    result = []
    for unit in units:
        custom: dict[str, Any] = {hami.CUSTOMINFO_PCI_BDF: unit.gpu_address}
        if unit.cu_unit > 1:
            custom[hami.CUSTOMINFO_CU_PER_WGP] = unit.cu_unit
        reason = (reasons or {}).get(unit.uuid)
        if not healthy.get(unit.uuid, True) and reason:
            custom[hami.CUSTOMINFO_HEALTH_REASON] = reason
        level = (levels or {}).get(unit.gpu_address)
        if level is not None:
            custom[enforcement.CUSTOMINFO_KEY] = level.value
        result.append(hami.DeviceInfo(
            id=unit.uuid, index=unit.index, count=share_count,
            devmem=unit.vram_mib, devcore=unit.compute_units,
            type=unit.device_type,
            numa=unit.numa_node or 0,
            health=healthy.get(unit.uuid, True), devicevendor=VENDOR,
            custominfo=custom))
    return tuple(result)


class NodeStore(abc.ABC):
    """Reads and annotates the agent's node."""

    @abc.abstractmethod
    def read(self) -> dict[str, Any]:
        """The node object.

        :raises KubernetesError: it cannot be read.
        """

    @abc.abstractmethod
    def annotate(self, node: Mapping[str, Any],
                 annotations: Mapping[str, str | None]) -> None:
        """Write (None: remove) annotations if the node is unchanged.

        :raises KubernetesConflict: the node changed since it was read.
        :raises KubernetesError: any other failure.
        """

    def label(self, node: Mapping[str, Any],
              labels: Mapping[str, str | None]) -> None:
        """Write (None: remove) labels if the node is unchanged.

        :raises KubernetesConflict: the node changed since it was read.
        :raises KubernetesError: any other failure.
        """
        raise NotImplementedError('this node store cannot label nodes')

    def set_condition(self, node: Mapping[str, Any],
                      condition: Mapping[str, Any]) -> None:
        """Write one condition of the node's status (merged by type).

        :raises KubernetesError: it cannot be written.
        """
        raise NotImplementedError('this node store cannot write conditions')

    def record_event(self, body: Mapping[str, Any]) -> None:
        """Create an Event.

        :raises KubernetesConflict: it exists already.
        :raises KubernetesError: any other failure.
        """
        raise NotImplementedError('this node store cannot record events')


class KubernetesNodeStore(NodeStore):
    """A :class:`NodeStore` over a ``kubernetes.client.CoreV1Api``."""

    def __init__(self, node_name: str, core_api: Any) -> None:
        self.node_name = node_name
        self.api = core_api

    def read(self) -> dict[str, Any]:
        what = 'GET node %s' % self.node_name
        response = k8s_client.call(what, self.api.read_node, self.node_name,
                                   _preload_content=False)
        node: dict[str, Any] = k8s_client.json_body(what, response)
        return node

    def annotate(self, node: Mapping[str, Any],
                 annotations: Mapping[str, str | None]) -> None:
        meta = node.get('metadata') or {}
        body = {'metadata': {'resourceVersion': meta.get('resourceVersion'),
                             'annotations': dict(annotations)}}
        k8s_client.call('PATCH node %s' % self.node_name, self.api.patch_node,
                        self.node_name, body,
                        _content_type=k8s_client.MERGE_PATCH,
                        _preload_content=False)

    def label(self, node: Mapping[str, Any],
              labels: Mapping[str, str | None]) -> None:
        meta = node.get('metadata') or {}
        body = {'metadata': {'resourceVersion': meta.get('resourceVersion'),
                             'labels': dict(labels)}}
        k8s_client.call('PATCH node labels %s' % self.node_name,
                        self.api.patch_node, self.node_name, body,
                        _content_type=k8s_client.MERGE_PATCH,
                        _preload_content=False)

    def set_condition(self, node: Mapping[str, Any],
                      condition: Mapping[str, Any]) -> None:
        # strategic merge: conditions merge on "type", kubelet's stay
        body = {'status': {'conditions': [dict(condition)]}}
        k8s_client.call('PATCH node status %s' % self.node_name,
                        self.api.patch_node_status, self.node_name, body,
                        _content_type=k8s_client.STRATEGIC_MERGE_PATCH,
                        _preload_content=False)

    def record_event(self, body: Mapping[str, Any]) -> None:
        namespace = (body.get('metadata') or {}).get('namespace', 'default')
        k8s_client.call('CREATE event %s' % (body.get('metadata') or {}).get(
            'name'), self.api.create_namespaced_event, namespace, dict(body),
            _preload_content=False)


class NodeAgent:
    """Keeps ``hami.io/node-amd-register`` of the node up to date.

    :param store: the node.
    :param units: the node's GPU units.
    :param share_count: ``count`` of every device (the device plugin's).
    :param health: health check per unit; default: all healthy.
    :param interval: seconds between registrations (HAMi: 30).
    :param roles: the role ledger of the node, read at each registration;
        only the GPUs it gives to Kubernetes are registered. None: every
        unit is.
    :param gpus: the node's GPUs by PCI address; when given, the agent
        also keeps AMD node-labeller compatible labels
        (:mod:`amdgpu_virt.k8s.node.labels`) of the registered GPUs.
    """

    def __init__(self, store: NodeStore,
                 units: Sequence[devices.GpuUnit], share_count: int,
                 health: Any = None, interval: float = 30.0,
                 roles: noderoles.NodeRoles | None = None,
                 gpus: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.gpus = gpus
        self.units = tuple(units)
        self.roles = roles
        self.share_count = share_count
        self.health = health or (lambda unit: True)
        self.interval = interval
        #: annotation writes done (a sync that changes nothing writes none)
        self.writes = 0
        #: registrations attempted by the thread (failed ones included)
        self.attempts = 0
        #: the memory-limit hook verdict (set by from_conf; published on
        #: the node by memhook.publish)
        self.memory_hook: memhook.HookStatus | None = None
        #: publishes the GPUs' health on the node (label, condition,
        #: Events); None: not published
        self.health_publisher: healthpublish.HealthPublisher | None = None
        #: makes the metrics listener when the agent starts (None: none)
        self.metrics: Any = None
        self._metrics_server: Any = None
        #: each GPU's memory enforcement (set by from_conf; registered in
        #: custominfo, published on the node by enforcement.publish)
        self.enforcement: enforcement.NodeEnforcement | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def offered_units(self) -> tuple[devices.GpuUnit, ...]:
        """The units to register: those the ledger gives to Kubernetes
        (read again now), or every unit without a ledger."""
        if self.roles is None:
            return self.units
        allowed = self.roles.refresh()
        kept = tuple(u for u in self.units
                     if self.roles.offers(u.gpu_address, allowed))
        withdrawn = sorted({u.gpu_address for u in self.units} -
                           {u.gpu_address for u in kept})
        if withdrawn:
            LOG.debug('Not registering GPUs %s: the ledger does not give '
                      'them to Kubernetes on %s', ', '.join(withdrawn),
                      self.roles.host)
        return kept

    def desired(self, units: Sequence[devices.GpuUnit] | None = None
                ) -> tuple[hami.DeviceInfo, ...]:
        if units is None:
            units = self.offered_units()
        healthy: dict[str, bool] = {}
        reasons: dict[str, str] = {}
        for unit in units:
            try:
                healthy[unit.uuid] = bool(self.health(unit))
            except Exception:  # a failing check is not a healthy GPU
                LOG.exception('Health check of GPU %s failed', unit.rocr_id)
                healthy[unit.uuid] = False
                reasons[unit.uuid] = 'the health check failed'
                continue
            if not healthy[unit.uuid]:
                reasons[unit.uuid] = node_health.reason_of(self.health,
                                                           unit)
        return registration(
            units, self.share_count, healthy, reasons=reasons,
            levels=(self.enforcement.levels
                    if self.enforcement is not None else None))

    def sync_once(self) -> bool:
        """Register the node's GPUs if the node says otherwise.

        :returns: True if the annotation was written.
        :raises KubernetesError: the node cannot be read or written.
        """
        units = self.offered_units()
        desired = self.desired(units)
        if self.gpus is not None:
            self.sync_labels(node_labels.node_labels(self.gpus, units))
        if self.health_publisher is not None:
            self.publish_health(units, desired)
        for _attempt in range(CONFLICT_RETRIES):
            node = self.store.read()
            annotations = (node.get('metadata') or {}).get(
                'annotations') or {}
            current = annotations.get(hami.NODE_REGISTER)
            if current is not None:
                try:
                    if hami.decode_node_register(current) == desired:
                        return False
                except exception.HamiProtocolError as err:
                    LOG.warning('Replacing an unreadable %s: %s',
                                hami.NODE_REGISTER, err)
            try:
                self.store.annotate(node, {
                    hami.NODE_REGISTER: hami.encode_node_register(desired)})
            except exception.KubernetesConflict:
                continue
            self.writes += 1
            LOG.info('Registered %d GPUs in %s', len(desired),
                     hami.NODE_REGISTER)
            return True
        raise exception.KubernetesError(
            request='register GPUs on the node',
            reason='%d conflicts in a row' % CONFLICT_RETRIES)

    def publish_health(self, units: Sequence[devices.GpuUnit],
                       desired: Sequence[hami.DeviceInfo]) -> None:
        """The registered GPUs' health on the node (label, condition,
        Events); a failure is logged, the registration goes on."""
        if self.health_publisher is None:
            return
        healthy = {info.id: info.health for info in desired}
        reasons = {info.id: str(info.custominfo.get(
            hami.CUSTOMINFO_HEALTH_REASON, '')) for info in desired}
        try:
            self.health_publisher.publish(healthpublish.node_health(
                units, healthy, reasons))
        except exception.KubernetesError as err:
            LOG.warning('GPU health not published on the node: %s', err)

    def sync_labels(self, desired: Mapping[str, str]) -> bool:
        """Make the node's ``amd.com/gpu.*`` labels ``desired``.

        :returns: True if the labels were written.
        :raises KubernetesError: the node cannot be read or written.
        """
        for _attempt in range(CONFLICT_RETRIES):
            node = self.store.read()
            current = (node.get('metadata') or {}).get('labels') or {}
            changes = node_labels.label_changes(current, desired)
            if not changes:
                return False
            try:
                self.store.label(node, changes)
            except exception.KubernetesConflict:
                continue
            self.writes += 1
            LOG.info('Updated %d AMD GPU node labels', len(changes))
            return True
        raise exception.KubernetesError(
            request='label the node',
            reason='%d conflicts in a row' % CONFLICT_RETRIES)

    def cleanup(self) -> None:
        """Remove the registration (the node offers no GPU any more).

        :raises KubernetesError: the node cannot be read or written.
        """
        for _attempt in range(CONFLICT_RETRIES):
            node = self.store.read()
            annotations = (node.get('metadata') or {}).get(
                'annotations') or {}
            if hami.NODE_REGISTER not in annotations:
                return
            try:
                self.store.annotate(node, {hami.NODE_REGISTER: None})
                return
            except exception.KubernetesConflict:
                continue
        raise exception.KubernetesError(
            request='remove %s' % hami.NODE_REGISTER,
            reason='%d conflicts in a row' % CONFLICT_RETRIES)

    def start(self) -> NodeAgent:
        """Start registering and, with ``metrics``, serving metrics.

        :raises OSError: the metrics address cannot be bound.
        """
        if self.metrics is not None and self._metrics_server is None:
            self._metrics_server = self.metrics().start()
            LOG.info('Node metrics on %s:%d',
                     *self._metrics_server.server_address[:2])
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='node-agent')
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """Where the metrics listener serves (None: not serving)."""
        if self._metrics_server is None:
            return None
        host, port = self._metrics_server.server_address[:2]
        return str(host), int(port)

    def _run(self) -> None:
        backoff = k8s_client.Backoff(base=min(0.5, self.interval),
                                     cap=self.interval)
        while True:
            wait = self.interval
            try:
                self.sync_once()
                backoff.reset()
            except exception.AmdgpuVirtError as err:
                wait = backoff.next()
                LOG.warning('Node registration failed (retry in %.1f s): '
                            '%s', wait, err)
            except Exception:  # the thread must outlive any failure
                wait = backoff.next()
                LOG.exception('Node registration failed (retry in %.1f s)',
                              wait)
            self.attempts += 1
            if self._stop.wait(wait):
                return


def from_conf(conf: Any, inventory: Any,
              store: NodeStore | None = None,
              levels: telemetry.Enforcement | None = None
              ) -> NodeAgent:
    """A node agent configured by the ``[kubernetes]``, ``[health]`` and
    ``[telemetry]`` options: it judges GPU health with a
    :class:`~amdgpu_virt.k8s.node.health.HealthMonitor`, publishes it on
    the node and, with ``[telemetry] metrics_port`` >= 0, serves the
    node's metrics once started.

    :param levels: GPU address -> memory enforcement level, exported as
        ``amdgpu_virt_gpu_memory_enforcement`` (default: the levels the
        agent judged and registers).
    :raises ConfigError: naming the option at fault.
    """
    group = conf.kubernetes
    core_api = None
    if store is None:
        core_api = k8s_client.core_api(conf)
        store = KubernetesNodeStore(k8s_client.node_name(conf), core_api)
    host = None
    if isinstance(store, KubernetesNodeStore):
        host, core_api = store.node_name, store.api
    units = devices.units_from_inventory(inventory)
    share_count, judged = enforcement.share_count(
        conf, {u.gpu_address for u in units})
    monitor = node_health.monitor_from_conf(conf, units)
    node_agent = NodeAgent(
        store, units, share_count, health=monitor,
        interval=group.registration_interval,
        roles=noderoles.from_conf(conf, host, core_api),
        gpus=({str(g.address): g for g in inventory.gpus}
              if group.node_labels else None))
    node_agent.enforcement = judged
    node_agent.memory_hook = judged.hook if judged is not None else None
    node_agent.health_publisher = healthpublish.HealthPublisher(store)
    if levels is None and judged is not None:
        levels = _level_texts(judged)
    if conf.telemetry.metrics_port >= 0:
        node_agent.metrics = functools.partial(
            _metrics_server, conf, host, core_api, units, share_count,
            monitor, levels)
    return node_agent


def _level_texts(judged: enforcement.NodeEnforcement
                 ) -> telemetry.Enforcement:
    def level(address: str) -> str:
        found = judged.levels.get(address)
        return found.value if found is not None else 'unknown'
    return level


def _metrics_server(conf: Any, node: str | None, core_api: Any,
                    units: Sequence[devices.GpuUnit], share_count: int,
                    monitor: node_health.HealthMonitor,
                    levels: telemetry.Enforcement | None) -> Any:
    """The node's metrics listener (bound now)."""
    from amdgpu_virt.inventory import podcgroups
    from amdgpu_virt.k8s.api import httpserver
    from amdgpu_virt.k8s.node import metricsserver
    from amdgpu_virt.k8s.node import podsource

    pods = record = None
    if node is not None and core_api is not None:
        source = podsource.KubernetesPodSource(node, core_api,
                                               conf.kubernetes.namespace)
        pods, record = source.pods_on_node, source.allocation_record
    group = conf.kubernetes
    driver = podcgroups.driver_setting(group.cgroup_driver)
    collector = telemetry.NodeTelemetry(
        node or conf.inventory.hostname or '', units, share_count,
        conf.inventory.sysfs_root, group.cgroup_root,
        health=monitor, enforcement=levels, pods=pods, record=record,
        limits=telemetry.Limits.from_conf(conf),
        kubelet_root=podcgroups.kubelet_root_parts(
            group.kubelet_cgroup_root),
        cgroup_drivers=(driver,) if driver else tuple(podcgroups.Driver))
    return metricsserver.make_server(
        collector, conf.telemetry.metrics_host, conf.telemetry.metrics_port,
        httpserver.Limits.from_conf(conf))
