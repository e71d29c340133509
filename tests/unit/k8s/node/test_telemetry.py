"""The node's metrics collector on a simulated node: attribution, caps,
broken sources, read caching, the allocation record's grants."""

from __future__ import annotations

import os

import testtools

from amdgpu_virt.inventory import podcgroups
from amdgpu_virt.inventory import simnode
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import attribution
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import telemetry
from amdgpu_virt.k8s.record import allocation as allocrecord
from tests.unit.inventory import fixtures as inv_fixtures


def uid(n: int) -> str:
    return '0b6f0c55-6a1e-4b2c-9d7a-%012x' % n


def cid(n: int) -> str:
    return '%064x' % (n + 1)


def pod(n: int, containers: int, node: str = 'n1') -> dict:
    return {'metadata': {'uid': uid(n), 'namespace': 'ns%d' % n,
                         'name': 'p%d' % n},
            'spec': {'nodeName': node},
            'status': {'containerStatuses': [
                {'name': 'c%d' % k, 'containerID': 'cri-o://' + cid(
                    n * 100 + k)} for k in range(containers)]}}


def samples(collector: telemetry.NodeTelemetry) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in collector.registry.collect():
        for sample in family.samples:
            found.setdefault(sample.name, []).append(
                (sample.labels, sample.value))
    return found


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class CollectorTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec(hostname='n1', gpus=2)))
        self.root = host.root
        self.units = devices.units_from_inventory(host.expected)
        self.gpu = self.units[1].gpu_address
        self.cgroups = simnode.enable_dmem(self.root, {self.gpu: 1 << 30})
        self.pods: list[dict] = []
        self.record: allocrecord.Record | None = None
        self.clock = Clock()

    def collector(self, **limits: int) -> telemetry.NodeTelemetry:
        return telemetry.NodeTelemetry(
            'n1', self.units, 10, self.root, self.cgroups,
            pods=lambda: self.pods, record=lambda: self.record,
            limits=telemetry.Limits(min_read_interval=0, **limits),
            clock=self.clock)

    def add(self, n: int, containers: int,
            driver: podcgroups.Driver = podcgroups.Driver.SYSTEMD) -> None:
        self.pods.append(pod(n, containers))
        for k in range(containers):
            simnode.add_container(self.root, uid(n), cid(n * 100 + k),
                                  driver=driver, runtime='crio',
                                  current={self.gpu: n * 10 + k},
                                  limit={self.gpu: None})

    def test_containers_are_attributed_and_capped(self) -> None:
        self.add(1, 3)
        self.add(2, 1, driver=podcgroups.Driver.CGROUPFS)
        self.add(3, 1)
        collector = self.collector(max_containers=3,
                                   max_containers_per_pod=2)
        found = samples(collector)
        used = {(labels['namespace'], labels['container']): value
                for labels, value in found['hami_vgpu_memory_used_bytes']}
        # pod 1 is capped at 2 containers; 3 containers in all
        self.assertEqual({('ns1', 'c0'): 10, ('ns1', 'c1'): 11,
                          ('ns2', 'c0'): 20}, used)
        # dmem.max "max" is no limit: no limit series
        self.assertNotIn('hami_vgpu_memory_limit_bytes', found)
        dropped = {labels['reason']: value for labels, value in found[
            'amdgpu_virt_node_telemetry_dropped_series_total']}
        self.assertEqual({'max_containers_per_pod': 1,
                          'max_containers': 1}, dropped)

    def test_a_pod_of_another_node_is_not_attributed(self) -> None:
        self.add(1, 1)
        self.pods[0]['spec']['nodeName'] = 'n2'
        found = samples(self.collector())
        self.assertNotIn('hami_vgpu_memory_used_bytes', found)
        self.assertEqual([({'reason': 'unattributed'}, 1.0)], found[
            'amdgpu_virt_node_telemetry_dropped_series_total'])

    def test_record_only_pods_and_grants(self) -> None:
        self.add(1, 1)
        del self.pods[0]['status']
        unit = self.units[1]
        self.record = allocrecord.Record('n1', {uid(1): allocrecord.PodGrants(
            uid(1), 'ns1', 'p1', 5, ((allocrecord.Grant(unit.uuid, 4096,
                                                        (1 << 38) - 1),),
                                     ))})
        self.pods = []
        found = samples(self.collector())
        (labels, value), = found['hami_vgpu_memory_used_bytes']
        # the API does not list the pod: named by the record, the
        # container by its short runtime id
        self.assertEqual(('ns1', 'p1', cid(100)[:attribution.SHORT_ID],
                          unit.uuid), (labels['namespace'], labels['pod'],
                                       labels['container'],
                                       labels['device_uuid']))
        grants = {(lb['pod'], lb['container_index']): v for lb, v in found[
            'hami_vgpu_memory_allocated_bytes']}
        self.assertEqual({('p1', '0'): 4096 << 20}, grants)
        self.assertEqual(38, found[
            'amdgpu_virt_vgpu_compute_units_allocated'][0][1])
        shared = {lb['device_uuid']: v for lb, v in found[
            'hami_gpu_shared_count']}
        self.assertEqual({self.units[0].uuid: 0, unit.uuid: 1}, shared)
        ratio = {lb['device_uuid']: v for lb, v in found[
            'hami_gpu_core_allocated_ratio']}
        self.assertEqual(12.5, ratio[unit.uuid])

    def test_failing_sources_are_counted_and_reads_reused(self) -> None:
        def broken() -> list:
            raise OSError('API down')

        collector = telemetry.NodeTelemetry(
            'n1', self.units, 10, self.root, self.cgroups, pods=broken,
            enforcement=lambda address: 1 / 0,  # type: ignore[return-value]
            limits=telemetry.Limits(min_read_interval=5), clock=self.clock)
        os.unlink(os.path.join(simnode.device_dir(self.root, self.gpu),
                               'mem_info_vram_used'))
        found = samples(collector)
        errors = {lb['source']: v for lb, v in found[
            'amdgpu_virt_node_telemetry_errors_total']}
        self.assertEqual({'pods': 1, 'enforcement': 2, 'vram': 1}, errors)
        self.assertEqual(1, len(found['hami_host_gpu_memory_used_bytes']))
        # within min_read_interval a scrape reuses the read
        samples(collector)
        self.assertEqual(1, collector.reads)
        self.clock.now += 5
        samples(collector)
        self.assertEqual(2, collector.reads)

    def test_no_dmem_controller_no_container_series(self) -> None:
        self.add(1, 1)
        os.unlink(os.path.join(self.cgroups, 'cgroup.controllers'))
        found = samples(self.collector())
        self.assertNotIn('hami_vgpu_memory_used_bytes', found)
        self.assertEqual(0, found['amdgpu_virt_node_dmem_available'][0][1])
