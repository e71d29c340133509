"""The simulated cgroup v2 node behaves as the kernel where tests rely
on it."""

from __future__ import annotations

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import dmem
from tests.functional.fixtures import cgroupfs

REGION = 'drm/0000:85:00.0/vram'
UID = 'aaaa-bbbb'


class SimNodeTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.root = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                 'cg')

    def test_children_get_dmem_files_only_when_the_parent_enables_it(
            self) -> None:
        node = cgroupfs.SimNode(self.root, enabled=False)
        pod = node.pod(UID)
        self.assertFalse(os.path.exists(node.fs.where(pod, 'dmem.max')))
        for depth in range(len(pod)):
            node.fs.write(pod[:depth], 'cgroup.subtree_control', ['+dmem'])
        self.assertEqual({REGION: None}, node.caps(pod))
        node.fs.write(pod[:-1], 'cgroup.subtree_control', ['-dmem'])
        self.assertFalse(os.path.exists(node.fs.where(pod, 'dmem.max')))

    def test_kernel_refusals(self) -> None:
        node = cgroupfs.SimNode(self.root, dmem_controller=False)
        pod = node.pod(UID)
        err = self.assertRaises(exception.CgroupError, node.fs.write, (),
                                'cgroup.subtree_control', ['+dmem'])
        self.assertIn('No such file', str(err))
        node = cgroupfs.SimNode(self.root + '2')
        pod = node.pod(UID)
        container = node.container(pod, 'c1')
        # a cgroup holding processes cannot enable controllers (EBUSY)
        err = self.assertRaises(exception.CgroupError, node.fs.write,
                                container, 'cgroup.subtree_control',
                                ['+memory'])
        self.assertIn('busy', str(err))
        err = self.assertRaises(exception.CgroupError, node.fs.write, pod,
                                'dmem.max', ['drm/0000:01:00.0/vram 5'])
        self.assertIn('Invalid argument', str(err))

    def test_dmem_max_keeps_every_region(self) -> None:
        node = cgroupfs.SimNode(self.root, gpus={
            '0000:85:00.0': 10, '0000:05:00.0': 20})
        pod = node.pod(UID)
        node.fs.write(pod, 'dmem.max', [REGION + ' 5'])
        node.fs.write(pod, 'dmem.max', [REGION + ' 6'])
        self.assertEqual({REGION: 6, 'drm/0000:05:00.0/vram': None},
                         node.caps(pod))

    def test_a_container_cgroup_as_runc_makes_it(self) -> None:
        for driver in cgroups.Driver:
            node = cgroupfs.SimNode(os.path.join(self.root, driver.value),
                                    driver=driver, enabled=False)
            pod = node.pod(UID, cgroups.QosClass.BEST_EFFORT)
            container = node.container(pod, 'abc', pid=99)
            self.assertEqual({REGION: None}, node.caps(container))
            self.assertEqual('99', node.fs.read(container,
                                                'cgroup.procs').strip())
            self.assertTrue(dmem.probe(node.fs).available)
