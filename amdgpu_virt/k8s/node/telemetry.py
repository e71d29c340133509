"""The node's Prometheus metrics: GPUs, containers, grants, health.

:class:`NodeTelemetry` is a ``prometheus_client`` collector in a registry
of its own, served by :mod:`.metricsserver`. A scrape reads the node
(at most once per ``min_read_interval``; later scrapes reuse the read):

* per GPU (bound to amdgpu), from sysfs through
  :mod:`amdgpu_virt.inventory.sysfs.telemetry`: VRAM used and total,
  load, memory-controller load, temperatures by sensor, socket power,
  RAS counts by block, health and the memory enforcement level;
* per container, where the kernel has the dmem controller: VRAM used
  (``dmem.current``) and limit (``dmem.max``, left out when ``max``) of
  each GPU region, found below kubelet's pod cgroups
  (:mod:`amdgpu_virt.inventory.sysfs.cgroup`) and attributed to namespace,
  pod and container by :mod:`.attribution`;
* the allocation record's grants: MiB and CUs per pod container and GPU,
  pods sharing each GPU, the GPU's booked memory and CU ratio, its slots.

Names: where a metric means what HAMi's vGPU monitor (v2.9+) or its
scheduler exports, it has HAMi's name and labels (``hami_*``), so
dashboards written for HAMi chart these nodes too; the rest are
``amdgpu_virt_*``. Cardinality is bounded: per-GPU series by the node's
GPUs, container series by ``max_containers`` and
``max_containers_per_pod``, grant series by ``max_pods``; what is cut is
counted in ``amdgpu_virt_node_telemetry_dropped_series_total``. A file
that cannot be read drops its series and is counted in
``amdgpu_virt_node_telemetry_errors_total`` by source; nothing stops the
exporter.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import prometheus_client
from prometheus_client import core as prom

from amdgpu_virt.inventory import podcgroups
from amdgpu_virt.inventory.sysfs import cgroup as sysfs_cgroup
from amdgpu_virt.inventory.sysfs import telemetry as sysfs_telemetry
from amdgpu_virt.inventory import readings
from amdgpu_virt.k8s.node import attribution
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import health as node_health
from amdgpu_virt.model import MIB

LOG = logging.getLogger(__name__)

HOST_LABELS = ('node', 'device_index', 'device_uuid', 'device_type')
MC_LABELS = ('device_index', 'device_uuid', 'device_type')
GPU_LABELS = ('node', 'gpu', 'device_uuid')
VGPU_LABELS = ('namespace', 'pod', 'container', 'vdevice_index',
               'device_uuid')
GRANT_LABELS = ('namespace', 'node', 'pod', 'container_index',
                'device_uuid')
#: address -> enforcement level text (``kernel``, ``hook``...)
Enforcement = Callable[[str], str]


@dataclasses.dataclass(frozen=True)
class Limits:
    """The ``[telemetry]`` caps."""

    max_containers: int = 512
    max_containers_per_pod: int = 16
    max_pods: int = 512
    min_read_interval: float = 5.0

    @classmethod
    def from_conf(cls, conf: Any) -> Limits:
        group = conf.telemetry
        return cls(group.max_containers, group.max_containers_per_pod,
                   group.max_pods, float(group.min_read_interval))


@dataclasses.dataclass(frozen=True)
class GpuIdentity:
    """One GPU as its metrics name it: the address and, for HAMi's
    labels, its first unit (the registration entry of partition 0)."""

    address: str
    index: int
    uuid: str
    device_type: str
    units: tuple[devices.GpuUnit, ...]

    def host_labels(self, node: str) -> tuple[str, ...]:
        return (node, str(self.index), self.uuid, self.device_type)


def identities(units: Sequence[devices.GpuUnit]) -> tuple[GpuIdentity, ...]:
    """One identity per GPU of ``units``, in PCI order."""
    by_gpu: dict[str, list[devices.GpuUnit]] = {}
    for unit in units:
        by_gpu.setdefault(unit.gpu_address, []).append(unit)
    result = []
    for address in sorted(by_gpu):
        first = min(by_gpu[address], key=lambda u: (u.partition, u.index))
        result.append(GpuIdentity(address, first.index, first.uuid,
                                  first.device_type,
                                  tuple(by_gpu[address])))
    return tuple(result)


class _Families:
    """The metric families of one read, created on first use."""

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}

    def gauge(self, name: str, doc: str, labels: Sequence[str]
              ) -> prom.GaugeMetricFamily:
        if name not in self.items:
            self.items[name] = prom.GaugeMetricFamily(name, doc,
                                                      labels=labels)
        family: prom.GaugeMetricFamily = self.items[name]
        return family

    def counter(self, name: str, doc: str, labels: Sequence[str]
                ) -> prom.CounterMetricFamily:
        if name not in self.items:
            self.items[name] = prom.CounterMetricFamily(name, doc,
                                                        labels=labels)
        family: prom.CounterMetricFamily = self.items[name]
        return family


class NodeTelemetry:
    """The node's metrics collector (see the module text).

    :param units: the node's GPU units (registered or not).
    :param share_count: the device plugin's slots per unit.
    :param health: the node's health monitor; None: no health metrics.
    :param enforcement: GPU address -> memory enforcement level; None:
        not exported.
    :param pods: lists the pods bound to the node (API objects).
    :param record: reads the node's allocation record.
    :param cgroup_root: the host's cgroup v2 hierarchy (``[kubernetes]
        cgroup_root``, where the device plugin writes the caps).
    :param kubelet_root: kubelet's ``--cgroup-root`` as name parts.
    :param cgroup_drivers: kubelet's cgroup driver (both when unknown).
    """

    def __init__(self, node: str, units: Sequence[devices.GpuUnit],
                 share_count: int, sysfs_root: str, cgroup_root: str, *,
                 health: node_health.HealthMonitor | None = None,
                 errors: node_health.ErrorCounts | None = None,
                 enforcement: Enforcement | None = None,
                 pods: Callable[[], list[dict[str, Any]]] | None = None,
                 record: Callable[[], Any] | None = None,
                 limits: Limits | None = None,
                 kubelet_root: Sequence[str] = (),
                 cgroup_drivers: Sequence[podcgroups.Driver] = tuple(
                     podcgroups.Driver),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.kubelet_root = tuple(kubelet_root)
        self.cgroup_drivers = tuple(cgroup_drivers)
        self.gpus = identities(units)
        self.share_count = share_count
        self.sysfs_root = sysfs_root
        self.cgroup_root = cgroup_root
        self.health = health
        self.errors = errors or (health.errors if health is not None
                                 else node_health.ErrorCounts())
        self.enforcement = enforcement
        self.pods = pods
        self.record = record
        self.limits = limits or Limits()
        self.clock = clock
        self.dropped: dict[str, int] = {}
        self.reads = 0
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Any]] | None = None
        self.registry = prometheus_client.CollectorRegistry()
        self.registry.register(self)

    # the collector protocol -------------------------------------------
    def describe(self) -> list[Any]:
        return []  # no read at registration

    def collect(self) -> Iterator[Any]:
        with self._lock:
            now = self.clock()
            if self._cached is None or \
                    now - self._cached[0] >= self.limits.min_read_interval:
                started = time.monotonic()
                families = self._read()
                self.reads += 1
                seconds = prom.GaugeMetricFamily(
                    'amdgpu_virt_node_telemetry_read_seconds',
                    'Seconds the last read of the node took.')
                seconds.add_metric([], time.monotonic() - started)
                families.append(seconds)
                self._cached = (now, families)
            cached = list(self._cached[1])
        yield from cached
        yield from self._own()

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)

    def _own(self) -> list[Any]:
        errors = prom.CounterMetricFamily(
            'amdgpu_virt_node_telemetry_errors',
            'Failures to read a telemetry source (a file, the API, the '
            'exporter); the series it would feed are left out.',
            labels=['source'])
        for source, count in sorted(self.errors.snapshot().items()):
            errors.add_metric([source], count)
        dropped = prom.CounterMetricFamily(
            'amdgpu_virt_node_telemetry_dropped_series',
            'Series left out: over a cardinality cap, or a container '
            'cgroup no pod of this node owns.', labels=['reason'])
        with_drops = dict(self.dropped)
        for reason, count in sorted(with_drops.items()):
            dropped.add_metric([reason], count)
        return [errors, dropped]

    def _drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    # one read -----------------------------------------------------------
    def _read(self) -> list[Any]:
        out = _Families()
        for gpu in self.gpus:
            self._gpu(out, gpu)
        pods, booked, record = self._api()
        self._containers(out, pods, booked, record)
        if record is not None:
            self._grants(out, record)
        return list(out.items.values())

    def _gpu(self, out: _Families, gpu: GpuIdentity) -> None:
        node = self.node
        read = sysfs_telemetry.read_gpu(self.sysfs_root, gpu.address)
        for source, message in read.problems:
            self.errors.add(source, message)
        host = gpu.host_labels(node)
        ours = (node, gpu.address, gpu.uuid)
        out.gauge('amdgpu_virt_gpu_info', 'The node\'s GPUs: PCI address, '
                  'HAMi device index and uuid (of partition 0), type and '
                  'units; always 1.', ('node', 'gpu', 'device_index',
                                       'device_uuid', 'device_type',
                                       'units')).add_metric(
            [node, gpu.address, str(gpu.index), gpu.uuid, gpu.device_type,
             str(len(gpu.units))], 1)
        if read.vram_used_bytes is not None:
            out.gauge('hami_host_gpu_memory_used_bytes',
                      'GPU device memory usage in bytes', HOST_LABELS
                      ).add_metric(host, read.vram_used_bytes)
        if read.busy_percent is not None:
            out.gauge('hami_host_gpu_utilization_ratio',
                      'GPU core utilization ratio (0-100)', HOST_LABELS
                      ).add_metric(host, read.busy_percent)
        if read.memory_busy_percent is not None:
            out.gauge('hami_host_gpu_memory_controller_utilization_ratio',
                      'GPU memory controller utilization ratio (0-100)',
                      MC_LABELS).add_metric(host[1:],
                                            read.memory_busy_percent)
        if read.vram_total_bytes is not None:
            out.gauge('amdgpu_virt_gpu_memory_total_bytes',
                      'VRAM of the GPU in bytes (mem_info_vram_total).',
                      GPU_LABELS).add_metric(ours, read.vram_total_bytes)
        for sensor, celsius in read.temperatures:
            out.gauge('amdgpu_virt_gpu_temperature_celsius',
                      'GPU temperature by hwmon sensor label (edge, '
                      'junction, mem).', GPU_LABELS + ('sensor',)
                      ).add_metric(ours + (sensor,), celsius)
        if read.power_watts is not None:
            out.gauge('amdgpu_virt_gpu_power_watts',
                      'Socket power of the GPU in watts (power1_average, '
                      'or power1_input on MI300-class GPUs).', GPU_LABELS
                      ).add_metric(ours, read.power_watts)
        ras = out.counter('amdgpu_virt_gpu_ras_errors',
                          'RAS errors by block and type (uncorrectable, '
                          'correctable, deferred), counted since the '
                          'driver loaded.', GPU_LABELS + ('block', 'type'))
        for count in read.ras or ():
            for kind, value in (('uncorrectable', count.uncorrectable),
                                ('correctable', count.correctable),
                                ('deferred', count.deferred)):
                ras.add_metric(ours + (count.block, kind), value)
        if self.health is not None:
            verdicts = [self.health.unit_verdict(u) for u in gpu.units]
            healthy = all(v.healthy for v in verdicts)
            out.gauge('amdgpu_virt_gpu_healthy', 'Whether the node finds '
                      'the GPU healthy (1) or not (0); see the node\'s '
                      'AMDGPUUnhealthy condition for why.', GPU_LABELS
                      ).add_metric(ours, 1 if healthy else 0)
        if self.enforcement is not None:
            try:
                level = str(self.enforcement(gpu.address))[:32]
            except Exception as err:  # an injected callable may fail
                self.errors.add('enforcement', str(err))
            else:
                out.gauge('amdgpu_virt_gpu_memory_enforcement',
                          'How the GPU\'s memory grants are enforced '
                          '(level: kernel, hook, kernel+hook, none); '
                          'always 1.', GPU_LABELS + ('level',)
                          ).add_metric(ours + (level,), 1)

    def _api(self) -> tuple[dict[str, tuple[str, str, dict[str, str]]],
                            dict[str, tuple[str, str]], Any]:
        pods: dict[str, tuple[str, str, dict[str, str]]] = {}
        booked: dict[str, tuple[str, str]] = {}
        record = None
        if self.pods is not None:
            try:
                pods = attribution.pod_index(self.pods(), self.node)
            except Exception as err:  # the API may fail; keep exporting
                self.errors.add('pods', str(err))
        if self.record is not None:
            try:
                record = self.record()
            except Exception as err:  # a bad record: no grant series
                self.errors.add('record', str(err))
            else:
                booked = {uid.lower(): (g.namespace, g.name)
                          for uid, g in (record.pods.items()
                                         if record is not None else ())}
        return pods, booked, record

    def _unit_of(self, address: str, record: Any, uid: str
                 ) -> str | None:
        """The unit uuid the record grants pod ``uid`` on GPU ``address``
        (None: no grant there)."""
        if record is None:
            return None
        grants = record.pods.get(uid)
        if grants is None:
            return None
        uuids = {u.uuid for g in self.gpus if g.address == address
                 for u in g.units}
        for container in grants.containers:
            for grant in container:
                if grant.gpu.lower() in uuids:
                    return str(grant.gpu.lower())
        return None

    def _containers(self, out: _Families,
                    pods: Mapping[str, tuple[str, str, dict[str, str]]],
                    booked: Mapping[str, tuple[str, str]],
                    record: Any) -> None:
        root = self.cgroup_root
        available = sysfs_cgroup.has_dmem(root)
        out.gauge('amdgpu_virt_node_dmem_available',
                  'Whether the kernel has the dmem cgroup controller '
                  '(per-container VRAM series need it).', ('node',)
                  ).add_metric([self.node], 1 if available else 0)
        if not available:
            return
        limits = self.limits
        cgroups, problems = sysfs_cgroup.containers(
            root, limits.max_containers * 4, self.kubelet_root,
            self.cgroup_drivers)
        for _source, message in problems:
            self.errors.add('cgroup', message)
        found, unknown = attribution.attribute(cgroups, pods, booked)
        if unknown:
            self._drop('unattributed', len(unknown))
        gpus = {g.address: g for g in self.gpus}
        per_pod: dict[str, int] = {}
        exported = 0
        for item in found:
            if exported >= limits.max_containers:
                self._drop('max_containers')
                continue
            uid = item.cgroup.pod_uid
            if per_pod.get(uid, 0) >= limits.max_containers_per_pod:
                self._drop('max_containers_per_pod')
                continue
            current, problem = sysfs_cgroup.read_dmem(
                root, item.cgroup.path, 'dmem.current')
            limit, limit_problem = sysfs_cgroup.read_dmem(
                root, item.cgroup.path, 'dmem.max')
            for text in (problem, limit_problem):
                if text:
                    self.errors.add('dmem', text)
            regions = sorted(a for a in (
                readings.region_address(r) for r in (current or {}))
                if a in gpus)
            if not regions:
                continue
            per_pod[uid] = per_pod.get(uid, 0) + 1
            exported += 1
            for vindex, address in enumerate(regions):
                uuid = self._unit_of(address, record, uid) or \
                    gpus[address].uuid
                labels = (item.namespace, item.pod, item.container,
                          str(vindex), uuid)
                region = readings.vram_region(address)
                used = (current or {}).get(region)
                if used is not None:
                    out.gauge('hami_vgpu_memory_used_bytes',
                              'vGPU device memory usage in bytes',
                              VGPU_LABELS).add_metric(labels, used)
                cap = (limit or {}).get(region)
                if cap is not None:
                    out.gauge('hami_vgpu_memory_limit_bytes',
                              'vGPU device memory limit in bytes',
                              VGPU_LABELS).add_metric(labels, cap)

    def _grants(self, out: _Families, record: Any) -> None:
        node = self.node
        units = {u.uuid: (g, u) for g in self.gpus for u in g.units}
        pods = sorted(record.pods.values(), key=lambda p: (p.time, p.uid))
        if len(pods) > self.limits.max_pods:
            self._drop('max_pods', len(pods) - self.limits.max_pods)
            pods = pods[:self.limits.max_pods]
        holders: dict[str, set[str]] = {}
        mem: dict[str, int] = {}
        cus: dict[str, int] = {}
        grants_mem = out.gauge(
            'hami_vgpu_memory_allocated_bytes',
            'vGPU memory allocated to a pod container in bytes (the '
            'allocation record)', GRANT_LABELS)
        grants_cus = out.gauge(
            'amdgpu_virt_vgpu_compute_units_allocated',
            'CUs granted to a pod container on a GPU unit (the allocation '
            'record).', GRANT_LABELS)
        for pod in pods:
            for index, container in enumerate(pod.containers):
                for grant in container:
                    uuid = grant.gpu.lower()
                    if uuid not in units:
                        continue
                    labels = (pod.namespace, node, pod.name, str(index),
                              uuid)
                    grants_mem.add_metric(labels, grant.mem * MIB)
                    grants_cus.add_metric(labels,
                                          grant.cus.bit_count())
                    holders.setdefault(uuid, set()).add(pod.uid)
                    mem[uuid] = mem.get(uuid, 0) + grant.mem * MIB
                    cus[uuid] = cus.get(uuid, 0) | grant.cus
        shared = out.gauge('hami_gpu_shared_count',
                           'Number of pods sharing the device',
                           ('node', 'device_uuid', 'device_index',
                            'device_type'))
        allocated = out.gauge('hami_gpu_memory_allocated_bytes',
                              'Memory allocated on the device in bytes',
                              ('node', 'device_uuid', 'device_index',
                               'device_cores', 'device_type'))
        ratio = out.gauge('hami_gpu_core_allocated_ratio',
                          'Share of the device\'s CUs allocated (0-100)',
                          ('node', 'device_uuid', 'device_index',
                           'device_type'))
        slots = out.gauge('amdgpu_virt_gpu_slots',
                          'Device plugin slots (pods) the unit offers.',
                          ('node', 'device_uuid'))
        for uuid, (_gpu, unit) in sorted(units.items()):
            base = (node, uuid, str(unit.index))
            shared.add_metric(base + (unit.device_type,),
                              len(holders.get(uuid, ())))
            allocated.add_metric(base + (str(unit.compute_units),
                                         unit.device_type),
                                 mem.get(uuid, 0))
            ratio.add_metric(base + (unit.device_type,), 100.0 * min(
                cus.get(uuid, 0).bit_count(),
                unit.compute_units) / max(unit.compute_units, 1))
            slots.add_metric([node, uuid], self.share_count)
