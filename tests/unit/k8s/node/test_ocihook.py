"""The createRuntime hook's inputs: OCI state, /proc/<pid>/cgroup, caps."""

from __future__ import annotations

import json
import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import ocihook
from tests.functional.fixtures import cgroupfs

REGION = 'drm/0000:85:00.0/vram'


class InputTest(testtools.TestCase):

    def test_state(self) -> None:
        state = ocihook.parse_state(json.dumps({
            'ociVersion': '1.2.0', 'id': 'abc', 'status': 'creating',
            'pid': 42, 'bundle': '/b'}))
        self.assertEqual(ocihook.OciState(42, 'abc', 'creating'), state)
        for bad, field in (('[]', '(stdin)'), ('{', '(stdin)'),
                           ('{"pid": 0}', 'pid'), ('{"pid": true}', 'pid'),
                           ('{"pid": "42"}', 'pid'),
                           (' ' * (ocihook.MAX_STATE + 1), '(stdin)')):
            err = self.assertRaises(exception.OciStateError,
                                    ocihook.parse_state, bad)
            self.assertIn(': %s:' % field, str(err))

    def test_unified_path(self) -> None:
        self.assertEqual(('kubepods', 'pod1', 'c1'), ocihook.unified_path(
            '12:memory:/x\n0::/kubepods/pod1/c1\n', 'f'))
        for bad in ('4:memory:/kubepods/pod1/c1\n', '0::/\n',
                    '0::/kubepods/../../etc\n', '0::relative\n'):
            self.assertRaises(exception.CgroupError, ocihook.unified_path,
                              bad, 'f')
        self.assertIn('cgroup v1', str(self.assertRaises(
            exception.CgroupError, ocihook.unified_path, '1:cpu:/x', 'f')))

    def test_caps(self) -> None:
        self.assertEqual({REGION: 3}, ocihook.parse_caps(
            ['%s=1' % REGION, '%s=2' % REGION]))
        for bad in ([], ['%s=-1' % REGION], ['%s=1G' % REGION],
                    ['/etc/passwd=1'], ['drm/x/vram=%d' % (1 << 64)]):
            self.assertRaises(exception.UsageError, ocihook.parse_caps, bad)


class RunTest(testtools.TestCase):
    """run() on a host tree whose dmem controller is enabled down to the
    container (as runc leaves it)."""

    def setUp(self) -> None:
        super().setUp()
        self.host = self.useFixture(fixtures.TempDir()).path
        self.node = cgroupfs.SimNode(os.path.join(
            self.host, 'sys', 'fs', 'cgroup'), driver=cgroups.Driver.CGROUPFS)
        pod = self.node.pod('u1', cgroups.QosClass.GUARANTEED)
        self.parts = self.node.container(pod, 'c1', 42)
        os.makedirs(os.path.join(self.host, 'proc', '42'))
        with open(os.path.join(self.host, 'proc', '42', 'cgroup'),
                  'w') as out:
            out.write('0::/%s\n' % '/'.join(self.parts))

    def test_caps_the_container(self) -> None:
        where, written = ocihook.run('{"pid": 42}', {REGION: 1 << 30},
                                     self.host)
        self.assertTrue(written)
        self.assertEqual(self.node.fs.where(self.parts), where)
        self.assertEqual({REGION: 1 << 30}, self.node.caps(self.parts))
        self.assertFalse(ocihook.run('{"pid": 42}', {REGION: 1 << 30},
                                     self.host)[1])

    def test_a_region_the_node_lacks(self) -> None:
        self.assertIn('not one of the node', str(self.assertRaises(
            exception.DmemError, ocihook.run, '{"pid": 42}',
            {'drm/0000:01:00.0/vram': 1}, self.host)))

    def test_a_huge_proc_file(self) -> None:
        with open(os.path.join(self.host, 'proc', '42', 'cgroup'),
                  'wb') as out:
            out.truncate(ocihook.MAX_PROC + 1)
        self.assertIn('proc/42/cgroup', str(self.assertRaises(
            exception.CgroupError, ocihook.run, '{"pid": 42}',
            {REGION: 1}, self.host)))
