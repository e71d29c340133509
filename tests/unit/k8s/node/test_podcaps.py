"""The pod caps PreStartContainer writes (simulated cgroup v2 node)."""

from __future__ import annotations

import os
import types
from collections.abc import Sequence
from typing import Any

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.k8s.node import podcaps
from amdgpu_virt.k8s.record import allocation as allocrecord
from tests.functional.fixtures import cgroupfs

MIB = 1 << 20
UID = '0f6e8c1a-3b2d-4c5e-9f00-1234567890ab'


def _units(partitions: int = 1) -> tuple[devices.GpuUnit, ...]:
    spec = simulate.HostSpec(hostname='n1', gpus=2,
                             mode='cpx' if partitions > 1 else 'spx')
    return devices.units_from_inventory(simulate.design_host(spec))


def _grants(*containers: Sequence[allocrecord.Grant]
            ) -> allocrecord.PodGrants:
    return allocrecord.PodGrants(UID, 'team', 'job', 1, tuple(
        tuple(c) for c in containers))


class PodCapsTest(testtools.TestCase):

    def test_sum_of_the_pods_slices_per_gpu(self) -> None:
        units = _units()
        a, b = units
        grants = _grants(
            [allocrecord.Grant(a.uuid, 8192, 0b1111)],          # init
            [allocrecord.Grant(a.uuid, 16384, 0b11110000),
             allocrecord.Grant(b.uuid, 4096, 0b1)],             # app
            [])
        self.assertEqual({dmem.region(a.gpu_address): 24576 * MIB,
                          dmem.region(b.gpu_address): 4096 * MIB},
                         podcaps.pod_caps(grants, units))

    def test_whole_gpus_need_no_cap(self) -> None:
        units = _units()
        whole = (1 << units[0].compute_units) - 1
        self.assertEqual({}, podcaps.pod_caps(_grants(
            [allocrecord.Grant(units[0].uuid, units[0].vram_mib, whole)]),
            units))

    def test_partitions_of_one_gpu_share_its_region(self) -> None:
        units = _units(partitions=8)
        first, second = units[0], units[1]
        self.assertEqual(first.gpu_address, second.gpu_address)
        whole = (1 << second.compute_units) - 1
        caps = podcaps.pod_caps(_grants(
            [allocrecord.Grant(first.uuid, 1024, 0b11)],
            [allocrecord.Grant(second.uuid, second.vram_mib, whole)]),
            units)
        self.assertEqual({dmem.region(first.gpu_address):
                          (1024 + second.vram_mib) * MIB}, caps)

    def test_a_gpu_of_another_node(self) -> None:
        self.assertRaises(exception.DevicePluginError, podcaps.pod_caps,
                          _grants([allocrecord.Grant('feed', 1, 1)]),
                          _units())


class _Shared:
    """What PodCaps reads of the plugin's SharedServer."""

    def __init__(self, served: dict[tuple[str, ...], tuple[str, int]],
                 record: allocrecord.Record) -> None:
        self.served = served
        self.source = types.SimpleNamespace(
            allocation_record=lambda: record)

    def served_to(self, ids: Sequence[str]) -> tuple[str, int] | None:
        return self.served.get(tuple(sorted(ids)))


class ApplyTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.units = _units()
        a = self.units[0]
        self.region = dmem.region(a.gpu_address)
        self.grants = _grants([allocrecord.Grant(a.uuid, 2048, 0b111)])
        self.shared = _Shared({('x-0',): (UID, 0)}, allocrecord.Record(
            'n1', {UID: self.grants}))

    def node(self, name: str, **kwargs: Any) -> cgroupfs.SimNode:
        return cgroupfs.SimNode(os.path.join(self.tmp, name), gpus={
            u.gpu_address: u.vram_mib * MIB for u in self.units}, **kwargs)

    def caps(self, node: cgroupfs.SimNode, **kwargs: Any
             ) -> podcaps.PodCaps:
        return podcaps.PodCaps(node.fs, dmem.probe(node.fs), self.units,
                               **kwargs)

    def test_every_driver_and_qos_class(self) -> None:
        for driver in cgroups.Driver:
            for qos in cgroups.QosClass:
                node = self.node('%s-%s' % (driver.value, qos.value),
                                 driver=driver, enabled=False)
                pod = node.pod(UID, qos)
                applied = self.caps(node).apply(['x-0'], self.shared)
                self.assertEqual({self.region: 2048 * MIB, dmem.region(
                    self.units[1].gpu_address): None}, node.caps(pod),
                    (driver, qos))
                self.assertTrue(applied.written)
                self.assertEqual(node.fs.where(pod), applied.cgroup)
                again = self.caps(node, driver=driver).apply(['x-0'],
                                                             self.shared)
                self.assertFalse(again.written)

    def test_ids_never_served_fail_closed(self) -> None:
        node = self.node('n')
        node.pod(UID)
        err = self.assertRaises(exception.DevicePluginError,
                                self.caps(node).apply, ['y-1'], self.shared)
        self.assertIn('y-1', str(err))

    def test_a_pod_gone_from_the_record(self) -> None:
        node = self.node('n')
        shared = _Shared({('x-0',): (UID, 0)}, allocrecord.Record('n1'))
        self.assertIn('not in the allocation record', str(self.assertRaises(
            exception.DevicePluginError, self.caps(node).apply, ['x-0'],
            shared)))

    def test_no_pod_cgroup(self) -> None:
        node = self.node('n')
        self.assertIn('pod uid %s' % UID, str(self.assertRaises(
            exception.CgroupNotFound, self.caps(node).apply, ['x-0'],
            self.shared)))

    def test_prepare_enables_dmem_for_the_qos_cgroups(self) -> None:
        node = self.node('n', enabled=False)
        self.caps(node).prepare()
        for qos in cgroups.QosClass:
            parts = cgroups.qos_cgroup(cgroups.Driver.SYSTEMD, qos)
            self.assertIn('dmem', node.fs.read(
                parts, 'cgroup.subtree_control').split())

    def test_a_gpu_without_a_region_is_left_to_the_hook(self) -> None:
        node = cgroupfs.SimNode(os.path.join(self.tmp, 'n'), gpus={
            self.units[1].gpu_address: 1 << 30})
        pod = node.pod(UID)
        applied = self.caps(node).apply(['x-0'], self.shared)
        self.assertIsNone(applied.cgroup)
        self.assertEqual({dmem.region(self.units[1].gpu_address): None},
                         node.caps(pod))
