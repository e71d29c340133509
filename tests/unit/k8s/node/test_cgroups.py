"""Where kubelet puts pod cgroups, and safe access to a cgroup tree."""

from __future__ import annotations

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node.cgroups import Driver
from amdgpu_virt.k8s.node.cgroups import QosClass
from tests.functional.fixtures import cgroupfs

UID = '0f6e8c1a-3b2d-4c5e-9f00-1234567890ab'
UNDERSCORED = UID.replace('-', '_')


class LayoutTest(testtools.TestCase):

    def test_systemd_every_qos_class(self) -> None:
        self.assertEqual(
            ('kubepods.slice', 'kubepods-pod%s.slice' % UNDERSCORED),
            cgroups.pod_cgroup(Driver.SYSTEMD, QosClass.GUARANTEED, UID))
        self.assertEqual(
            ('kubepods.slice', 'kubepods-burstable.slice',
             'kubepods-burstable-pod%s.slice' % UNDERSCORED),
            cgroups.pod_cgroup(Driver.SYSTEMD, QosClass.BURSTABLE, UID))
        self.assertEqual(
            ('kubepods.slice', 'kubepods-besteffort.slice',
             'kubepods-besteffort-pod%s.slice' % UNDERSCORED),
            cgroups.pod_cgroup(Driver.SYSTEMD, QosClass.BEST_EFFORT, UID))

    def test_cgroupfs_every_qos_class(self) -> None:
        self.assertEqual(('kubepods', 'pod' + UID), cgroups.pod_cgroup(
            Driver.CGROUPFS, QosClass.GUARANTEED, UID))
        self.assertEqual(('kubepods', 'burstable', 'pod' + UID),
                         cgroups.pod_cgroup(Driver.CGROUPFS,
                                            QosClass.BURSTABLE, UID))
        self.assertEqual(('kubepods', 'besteffort', 'pod' + UID),
                         cgroups.pod_cgroup(Driver.CGROUPFS,
                                            QosClass.BEST_EFFORT, UID))

    def test_kubelet_cgroup_root(self) -> None:
        root = cgroups.kubelet_root_parts('/kubelet')
        self.assertEqual(
            ('kubelet.slice', 'kubelet-kubepods.slice',
             'kubelet-kubepods-besteffort.slice',
             'kubelet-kubepods-besteffort-pod%s.slice' % UNDERSCORED),
            cgroups.pod_cgroup(Driver.SYSTEMD, QosClass.BEST_EFFORT, UID,
                               root))
        self.assertEqual(('kubelet', 'kubepods', 'pod' + UID),
                         cgroups.pod_cgroup(Driver.CGROUPFS,
                                            QosClass.GUARANTEED, UID, root))
        self.assertEqual((), cgroups.kubelet_root_parts('/'))
        self.assertRaises(exception.ConfigError, cgroups.kubelet_root_parts,
                          '/a/../b')

    def test_a_uid_never_makes_a_path(self) -> None:
        for bad in ('', '../x', 'a/b', 'x' * 65, 'a b'):
            self.assertRaises(exception.CgroupNotFound, cgroups.pod_cgroup,
                              Driver.CGROUPFS, QosClass.BURSTABLE, bad)

    def test_qos_of(self) -> None:
        self.assertIs(QosClass.BEST_EFFORT, cgroups.qos_of(
            {'status': {'qosClass': 'BestEffort'}}))
        self.assertIsNone(cgroups.qos_of({'status': {'qosClass': 'Gold'}}))
        self.assertIsNone(cgroups.qos_of({'status': 'x'}))


class TreeTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.root = os.path.join(self.tmp, 'cgroup')

    def node(self, **kwargs: object) -> cgroupfs.SimNode:
        return cgroupfs.SimNode(self.root, **kwargs)  # type: ignore[arg-type]

    def test_finds_every_pod_of_both_drivers(self) -> None:
        for driver in Driver:
            root = os.path.join(self.tmp, driver.value)
            node = cgroupfs.SimNode(root, driver=driver)
            self.assertIs(driver, cgroups.detect_driver(node.fs))
            for n, qos in enumerate(QosClass):
                uid = UID[:-1] + str(n)
                made = node.pod(uid, qos)
                self.assertEqual(made, cgroups.find_pod(node.fs, driver, uid))
                self.assertEqual(made, cgroups.find_pod(node.fs, driver, uid,
                                                        qos))

    def test_a_missing_pod_cgroup_is_named(self) -> None:
        node = self.node()
        err = self.assertRaises(exception.CgroupNotFound, cgroups.find_pod,
                                node.fs, Driver.SYSTEMD, UID)
        self.assertIn('kubepods-burstable-pod%s.slice' % UNDERSCORED,
                      str(err))
        self.assertIn('kubepods-pod%s.slice' % UNDERSCORED, str(err))

    def test_a_symlinked_pod_cgroup_is_never_followed(self) -> None:
        node = self.node()
        outside = os.path.join(self.tmp, 'elsewhere')
        os.mkdir(outside)
        with open(os.path.join(outside, 'dmem.max'), 'w') as out:
            out.write('drm/0000:85:00.0/vram max\n')
        parts = cgroups.pod_cgroup(Driver.SYSTEMD, QosClass.BURSTABLE, UID)
        os.symlink(outside, os.path.join(self.root, *parts))
        err = self.assertRaises(exception.CgroupError, cgroups.find_pod,
                                node.fs, Driver.SYSTEMD, UID)
        self.assertIn('symbolic link', str(err))
        self.assertIn(parts[-1], str(err))
        self.assertRaises(exception.CgroupError, node.fs.write, parts,
                          'dmem.max', ['drm/0000:85:00.0/vram 1'])
        with open(os.path.join(outside, 'dmem.max')) as stream:
            self.assertEqual('drm/0000:85:00.0/vram max\n', stream.read())

    def test_a_symlinked_parent_is_never_followed(self) -> None:
        node = self.node()
        os.rename(os.path.join(self.root, 'kubepods.slice'),
                  os.path.join(self.tmp, 'moved'))
        os.symlink(os.path.join(self.tmp, 'moved'),
                   os.path.join(self.root, 'kubepods.slice'))
        err = self.assertRaises(exception.CgroupError, node.fs.read,
                                ('kubepods.slice',), 'cgroup.controllers')
        self.assertIn('kubepods.slice: a symbolic link', str(err))

    def test_a_symlinked_file_is_never_followed(self) -> None:
        node = self.node()
        os.unlink(os.path.join(self.root, 'dmem.capacity'))
        os.symlink('/etc/hostname', os.path.join(self.root, 'dmem.capacity'))
        err = self.assertRaises(exception.CgroupError, node.fs.read, (),
                                'dmem.capacity')
        self.assertIn('dmem.capacity: a symbolic link', str(err))

    def test_huge_garbage_and_special_files(self) -> None:
        node = self.node()
        path = os.path.join(self.root, 'dmem.capacity')
        with open(path, 'wb') as out:
            out.truncate(cgroups.MAX_FILE_BYTES * 1000)   # sparse
        err = self.assertRaises(exception.CgroupError, node.fs.read, (),
                                'dmem.capacity')
        self.assertIn('larger than', str(err))
        with open(path, 'wb') as out:
            out.write(b'\xff\xfe')
        self.assertIn('not ASCII', str(self.assertRaises(
            exception.CgroupError, node.fs.read, (), 'dmem.capacity')))
        os.unlink(path)
        os.mkfifo(path)
        self.assertIn('not a regular file', str(self.assertRaises(
            exception.CgroupError, node.fs.read, (), 'dmem.capacity')))

    def test_a_name_with_a_slash_or_dots_is_refused(self) -> None:
        node = self.node()
        for bad in ('..', '.', 'a/b', ''):
            self.assertRaises(exception.CgroupError, node.fs.is_dir, (bad,))

    def test_no_kubepods_and_two_kubepods(self) -> None:
        os.makedirs(self.root)
        with open(os.path.join(self.root, 'cgroup.controllers'), 'w') as out:
            out.write('cpu memory dmem\n')
        fs = cgroups.CgroupFs(self.root)
        err = self.assertRaises(exception.CgroupNotFound,
                                cgroups.detect_driver, fs)
        self.assertIn('kubepods.slice and %s/kubepods do not exist'
                      % self.root, str(err))
        os.mkdir(os.path.join(self.root, 'kubepods'))
        os.mkdir(os.path.join(self.root, 'kubepods.slice'))
        self.assertIn('set [kubernetes] cgroup_driver', str(
            self.assertRaises(exception.CgroupNotFound,
                              cgroups.detect_driver, fs)))
        self.assertIs(Driver.CGROUPFS,
                      cgroups.detect_driver(fs, Driver.CGROUPFS))

    def test_cgroup_v1_is_detected(self) -> None:
        for layout in (('memory', 'cpu,cpuacct', 'systemd'),
                       ('memory', 'unified')):
            root = os.path.join(self.tmp, '-'.join(layout))
            for name in layout:
                os.makedirs(os.path.join(root, name))
            err = self.assertRaises(exception.CgroupError, cgroups.check_v2,
                                    cgroups.CgroupFs(root))
            self.assertIn('cgroup v1', str(err))
            self.assertIn(root, str(err))
