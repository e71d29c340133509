"""Atomic, idempotent file writes."""

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt import fileutil


class TestFileUtil(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def test_read_text(self):
        path = os.path.join(self.tmp, 'a')
        self.assertIsNone(fileutil.read_text(path))
        with open(path, 'w') as handle:
            handle.write('x\n')
        self.assertEqual('x\n', fileutil.read_text(path))
        err = self.assertRaises(exception.FileInputError,
                                fileutil.read_text, self.tmp)
        self.assertIn('cannot read file %s: it is a directory' % self.tmp,
                      str(err))

    def test_write_if_changed_creates_dirs_and_sets_mode(self):
        path = os.path.join(self.tmp, 'd', 'e', 'f.conf')
        self.assertTrue(fileutil.write_if_changed(path, 'a\n', 0o600))
        self.assertEqual(0o600, os.stat(path).st_mode & 0o777)
        mtime = os.stat(path).st_mtime_ns
        self.assertFalse(fileutil.write_if_changed(path, 'a\n', 0o600))
        self.assertEqual(mtime, os.stat(path).st_mtime_ns)
        self.assertTrue(fileutil.write_if_changed(path, 'b\n'))
        self.assertEqual('b\n', fileutil.read_text(path))
        self.assertEqual(['f.conf'], os.listdir(os.path.dirname(path)))

    def test_failed_write_names_the_path_and_leaves_nothing(self):
        blocker = os.path.join(self.tmp, 'file')
        with open(blocker, 'w') as handle:
            handle.write('')
        target = os.path.join(blocker, 'x.conf')
        err = self.assertRaises(exception.AmdgpuVirtError,
                                fileutil.atomic_write, target, 'a')
        self.assertIn('cannot write %s' % target, str(err))
        self.assertEqual(['file'], os.listdir(self.tmp))
