"""Kernel VRAM caps on a simulated cgroup v2 node (dmem controller)."""

from __future__ import annotations

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import dmem
from tests.functional.fixtures import cgroupfs

GPU = '0000:85:00.0'
OTHER = '0000:05:00.0'
REGION = 'drm/0000:85:00.0/vram'
UID = '0f6e8c1a-3b2d-4c5e-9f00-1234567890ab'
GIB = 1 << 30


class ParseTest(testtools.TestCase):

    def test_region_of_a_gpu(self) -> None:
        self.assertEqual(REGION, dmem.region(GPU))
        self.assertEqual(REGION, dmem.region('0000:85:00.0'.upper()))
        self.assertRaises(exception.InvalidPciAddress, dmem.region, 'x')

    def test_lines(self) -> None:
        self.assertEqual({REGION: None, 'drm/0000:05:00.0/vram': 5},
                         dmem.parse('%s max\ndrm/0000:05:00.0/vram 5\n\n'
                                    % REGION, 'f', True))

    def test_garbage_is_named(self) -> None:
        for text, what in (('%s' % REGION, 'line 1'),
                           ('%s 1 2' % REGION, 'line 1'),
                           ('ok 1\n%s -5' % REGION,
                            "line 2: not a byte count ('-5')"),
                           ('%s 1e9' % REGION, "'1e9'"),
                           ('%s max' % REGION, "'max'"),
                           ('%s %d' % (REGION, 1 << 64), 'not a byte'),
                           ('reg;ion 5', 'line 1'),
                           ('r 1\n' * 5000, 'more than')):
            err = self.assertRaises(exception.DmemError, dmem.parse, text,
                                    '/x/dmem.capacity', False)
            self.assertIn('/x/dmem.capacity', str(err))
            self.assertIn(what, str(err))


class SimTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.root = os.path.join(self.tmp, 'cgroup')

    def node(self, **kwargs: object) -> cgroupfs.SimNode:
        kwargs.setdefault('gpus', {GPU: 192 * GIB, OTHER: 64 * GIB})
        return cgroupfs.SimNode(self.root, **kwargs)  # type: ignore[arg-type]


class ProbeTest(SimTest):

    def test_a_capable_node(self) -> None:
        found = dmem.probe(self.node().fs)
        self.assertTrue(found.available)
        self.assertEqual({REGION: 192 * GIB,
                          'drm/0000:05:00.0/vram': 64 * GIB},
                         dict(found.capacity))
        self.assertTrue(found.covers(GPU))
        self.assertEqual('', found.gpu_reason(GPU))
        self.assertIn('no region drm/0000:86:00.0/vram',
                      found.gpu_reason('0000:86:00.0'))

    def test_no_controller(self) -> None:
        found = dmem.probe(self.node(dmem_controller=False).fs)
        self.assertFalse(found.available)
        self.assertIn('cgroup.controllers lists no dmem controller',
                      found.reason)
        self.assertIn('6.14', found.reason)
        self.assertFalse(found.covers(GPU))

    def test_region_missing_and_no_region_at_all(self) -> None:
        node = self.node(gpus={OTHER: GIB})
        self.assertIn('no region %s' % REGION,
                      dmem.probe(node.fs).gpu_reason(GPU))
        with open(os.path.join(self.root, 'dmem.capacity'), 'w'):
            pass
        found = dmem.probe(node.fs)
        self.assertFalse(found.available)
        self.assertIn('lists no region', found.reason)

    def test_garbage_capacity_and_v1_fail_closed(self) -> None:
        node = self.node()
        with open(os.path.join(self.root, 'dmem.capacity'), 'w') as out:
            out.write('%s lots\n' % REGION)
        found = dmem.probe(node.fs)
        self.assertFalse(found.available)
        self.assertIn('dmem.capacity', found.reason)
        v1 = os.path.join(self.tmp, 'v1')
        os.makedirs(os.path.join(v1, 'memory'))
        found = dmem.probe(cgroups.CgroupFs(v1))
        self.assertFalse(found.available)
        self.assertIn('cgroup v1', found.reason)


class CapTest(SimTest):

    def test_enables_dmem_down_to_the_pod_and_caps_it(self) -> None:
        for driver in cgroups.Driver:
            root = os.path.join(self.tmp, driver.value)
            node = cgroupfs.SimNode(root, driver=driver, enabled=False,
                                    gpus={GPU: 192 * GIB})
            pod = node.pod(UID, cgroups.QosClass.BEST_EFFORT)
            self.assertEqual({}, node.caps(pod))
            dmem.ensure_enabled(node.fs, pod)
            self.assertEqual({REGION: None}, node.caps(pod))
            self.assertTrue(dmem.set_max(node.fs, pod, {REGION: 8 * GIB},
                                         dmem.probe(node.fs).capacity))
            self.assertEqual({REGION: 8 * GIB}, node.caps(pod))
            # idempotent: nothing written the second time
            writes = len(node.fs.writes)
            self.assertFalse(dmem.set_max(node.fs, pod, {REGION: 8 * GIB}))
            self.assertEqual(writes, len(node.fs.writes))

    def test_other_regions_keep_their_value(self) -> None:
        node = self.node()
        pod = node.pod(UID)
        dmem.set_max(node.fs, pod, {REGION: GIB})
        self.assertEqual({REGION: GIB, 'drm/0000:05:00.0/vram': None},
                         node.caps(pod))
        self.assertEqual([(node.fs.where(pod, 'dmem.max'),
                           '%s %d' % (REGION, GIB))], node.fs.writes)

    def test_not_enabled_and_not_enableable(self) -> None:
        node = self.node(enabled=False)
        pod = node.pod(UID)
        err = self.assertRaises(exception.DmemError, dmem.ensure_enabled,
                                node.fs, pod, False)
        self.assertIn('%s/cgroup.subtree_control' % self.root, str(err))
        self.assertRaises(exception.DmemError, dmem.set_max, node.fs, pod,
                          {REGION: GIB})
        # a QoS cgroup that holds a process of its own: EBUSY
        qos = pod[:-1]
        with open(node.fs.where(qos, 'cgroup.procs'), 'w') as out:
            out.write('77\n')
        dmem.ensure_enabled(node.fs, qos)  # its parents are fine
        err = self.assertRaises(exception.DmemError, dmem.ensure_enabled,
                                node.fs, pod)
        self.assertIn(node.fs.where(qos, 'cgroup.subtree_control'),
                      str(err))
        self.assertIn('holds processes of its own', str(err))

    def test_no_controller_cannot_be_enabled(self) -> None:
        node = self.node(dmem_controller=False)
        pod = node.pod(UID)
        err = self.assertRaises(exception.DmemError, dmem.ensure_enabled,
                                node.fs, pod)
        self.assertIn('%s/cgroup.subtree_control' % self.root, str(err))
        self.assertIn('does not offer dmem', str(err))

    def test_unknown_region_and_bad_values_are_refused_before_writing(
            self) -> None:
        node = self.node()
        pod = node.pod(UID)
        capacity = dmem.probe(node.fs).capacity
        err = self.assertRaises(exception.DmemError, dmem.set_max, node.fs,
                                pod, {'drm/0000:99:00.0/vram': GIB},
                                capacity)
        self.assertIn('not one of the node', str(err))
        self.assertRaises(exception.DmemError, dmem.set_max, node.fs, pod,
                          {REGION: -1})
        self.assertRaises(exception.DmemError, dmem.set_max, node.fs, pod,
                          {REGION: True})
        self.assertEqual([], node.fs.writes)
        # without the capacity to check against, the kernel says EINVAL
        err = self.assertRaises(exception.DmemError, dmem.set_max, node.fs,
                                pod, {'drm/0000:99:00.0/vram': GIB})
        self.assertIn('Invalid argument', str(err))

    def test_a_cap_the_kernel_does_not_apply_fails_closed(self) -> None:
        node = self.node(lowering_ignored=True)
        pod = node.pod(UID)
        node.use(pod, REGION, 4 * GIB)
        err = self.assertRaises(exception.DmemError, dmem.set_max, node.fs,
                                pod, {REGION: GIB})
        self.assertIn('reads %s max' % REGION, str(err))
        self.assertIn(node.fs.where(pod, 'dmem.max'), str(err))

    def test_a_page_rounded_read_back_is_applied(self) -> None:
        node = self.node()
        pod = node.pod(UID)
        with open(node.fs.where(pod, 'dmem.max'), 'w') as out:
            out.write('%s %d\n' % (REGION, GIB))
        self.assertFalse(dmem.set_max(node.fs, pod, {REGION: GIB + 100}))
        self.assertTrue(dmem.set_max(node.fs, pod, {REGION: GIB + 4096}))

    def test_a_replaced_dmem_max_is_refused(self) -> None:
        node = self.node()
        pod = node.pod(UID)
        target = os.path.join(self.tmp, 'target')
        with open(target, 'w') as out:
            out.write('%s max\n' % REGION)
        os.unlink(node.fs.where(pod, 'dmem.max'))
        os.symlink(target, node.fs.where(pod, 'dmem.max'))
        err = self.assertRaises(exception.CgroupError, dmem.set_max,
                                node.fs, pod, {REGION: GIB})
        self.assertIn('symbolic link', str(err))
        with open(target) as stream:
            self.assertEqual('%s max\n' % REGION, stream.read())
