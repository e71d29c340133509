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


class TestStaleTemps(testtools.TestCase):
    """Which temporary files of atomic writes a later writer removes."""

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def _touch(self, name, age=0.0):
        path = os.path.join(self.tmp, name)
        open(path, 'w').close()
        when = os.stat(path).st_mtime - age
        os.utime(path, (when, when))
        return path

    def test_by_writer_and_age(self):
        import subprocess
        import sys

        gone = subprocess.Popen([sys.executable, '-c', 'pass'])
        gone.wait()
        old = fileutil.STALE_AFTER + 60
        files = {
            # a writer of this host that is gone: stale at once
            fileutil.temp_prefix(gone.pid) + 'abcd1234': True,
            # this process's own, however old: never
            fileutil.temp_prefix() + 'abcd1234': False,
            # the older form and another host's: by age only
            '.amdgpu-virt-siwy9jmk': False,
            '.amdgpu-virt-tmp-00000000-1-abcd1234': False,
            # not temporary files at all
            '.amdgpu-virt-apply.json': False,
            'roles.yaml': False,
        }
        for name in files:
            self._touch(name)
        for name in ('.amdgpu-virt-old12345',
                     '.amdgpu-virt-tmp-00000000-2-abcd1234'):
            self._touch(name, old)
            files[name] = True
        self._touch(fileutil.temp_prefix() + 'efgh5678', old)
        stale = {os.path.join(self.tmp, n) for n, s in files.items() if s}
        self.assertEqual(sorted(stale), fileutil.stale_temps([self.tmp]))
        self.assertEqual(sorted(stale),
                         fileutil.remove_stale_temps([self.tmp, 'nowhere']))
        self.assertEqual([], fileutil.stale_temps([self.tmp]))
        self.assertEqual(len(files) + 1 - len(stale),
                         len(os.listdir(self.tmp)))

    def test_writes_name_their_writer(self):
        seen = []
        real = fileutil.tempfile.mkstemp

        def spy(**kwargs):
            fd, path = real(**kwargs)
            seen.append(os.path.basename(path))
            return fd, path

        self.useFixture(fixtures.MonkeyPatch(
            'amdgpu_virt.fileutil.tempfile.mkstemp', spy))
        fileutil.atomic_write(os.path.join(self.tmp, 'f'), 'x')
        (name,) = seen
        self.assertTrue(name.startswith(fileutil.temp_prefix()), name)
        self.assertFalse(fileutil.is_stale_temp(self.tmp, name))
