"""Installing the memory-limit hook library, on real files in temp dirs."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from typing import Any

import _ctypes
import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import hookinstall
from amdgpu_virt.k8s.node import memhook

#: a real shared object of this host: the interpreter's own _ctypes module
REAL_SO = _ctypes.__file__
#: another ELF header: the same library built for aarch64 (e_machine 183)
AARCH64 = (2, '<', 183)


def library(extra: bytes = b'') -> bytes:
    """A loadable library; ``extra`` bytes after its end keep it valid
    (every segment still lies inside the file) but change its bytes."""
    with open(REAL_SO, 'rb') as stream:
        return stream.read() + extra


class InstallTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.useFixture(fixtures.FakeLogger())
        self.image = os.path.join(self.tmp, 'image')
        self.host = os.path.join(self.tmp, 'host', 'vgpu')
        os.makedirs(self.image)
        os.makedirs(self.host)
        self.target = os.path.join(self.host, 'libamvgpu.so')
        self.source = self.write('libamvgpu.so', library())

    def write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.image, name)
        with open(path, 'wb') as stream:
            stream.write(data)
        return path

    def read(self, path: str | None = None) -> bytes:
        with open(path or self.target, 'rb') as stream:
            return stream.read()

    def leftovers(self) -> list[str]:
        return [n for n in os.listdir(self.host)
                if n.startswith(hookinstall.TEMP_PREFIX)]

    def refused(self, error: type[exception.HookInstallError],
                source: str | None = None, target: str | None = None,
                **kwargs: Any) -> str:
        err = self.assertRaises(error, hookinstall.install,
                                source or self.source, target or self.target,
                                **kwargs)
        return str(err)

    # --- what it does ------------------------------------------------------

    def test_installs_a_checked_read_only_copy(self) -> None:
        done = hookinstall.install(self.source, self.target)
        self.assertEqual(('installed', len(library())),
                         (done.action, done.size))
        self.assertEqual(library(), self.read())
        self.assertEqual(0o555, stat.S_IMODE(os.stat(self.target).st_mode))
        self.assertTrue(memhook.check(self.target).usable)
        self.assertIn('installed %s from %s' % (self.target, self.source),
                      str(done))
        self.assertEqual([], self.leftovers())

    def test_same_bytes_are_not_written_again(self) -> None:
        hookinstall.install(self.source, self.target)
        before = os.stat(self.target)
        done = hookinstall.install(self.source, self.target)
        after = os.stat(self.target)
        self.assertEqual('unchanged', done.action)
        self.assertEqual((before.st_ino, before.st_mtime_ns),
                         (after.st_ino, after.st_mtime_ns))
        self.assertIn('is up to date', str(done))
        # a wrong mode is corrected in place, still without a rewrite
        os.chmod(self.target, 0o644)
        self.assertEqual('unchanged', hookinstall.install(
            self.source, self.target).action)
        again = os.stat(self.target)
        self.assertEqual(0o555, stat.S_IMODE(again.st_mode))
        self.assertEqual(before.st_ino, again.st_ino)

    def test_other_bytes_are_replaced_by_rename(self) -> None:
        hookinstall.install(self.source, self.target)
        # a process that loaded the old library keeps its file
        with open(self.target, 'rb') as loaded:
            old_inode = os.fstat(loaded.fileno()).st_ino
            newer = self.write('newer.so', library(b'\0' * 4096))
            done = hookinstall.install(newer, self.target)
            self.assertEqual('replaced', done.action)
            self.assertEqual(library(), loaded.read())
        self.assertNotEqual(old_inode, os.stat(self.target).st_ino)
        self.assertEqual(library(b'\0' * 4096), self.read())

    def test_a_symlinked_source_is_followed(self) -> None:
        link = os.path.join(self.image, 'libamvgpu.so.1')
        os.symlink(self.source, link)
        self.assertEqual('installed', hookinstall.install(
            link, self.target).action)
        self.assertFalse(os.path.islink(self.target))

    # --- hostile sources ---------------------------------------------------

    def test_missing_source_names_it_and_changes_nothing(self) -> None:
        hookinstall.install(self.source, self.target)
        gone = os.path.join(self.image, 'gone.so')
        message = self.refused(exception.HookSourceMissing, source=gone)
        self.assertIn('source %s cannot be read: no such file' % gone,
                      message)
        self.assertEqual(library(), self.read())
        self.assertEqual([], self.leftovers())

    def test_sources_that_are_not_libraries(self) -> None:
        cases = {
            self.write('script.so', b'#!/bin/sh\necho hi\n'): 'no ELF magic',
            self.write('empty.so', b''): 'no ELF magic',
            self.write('cut.so', library()[:4000]): 'truncated',
            self.image: 'a directory',
        }
        fifo = os.path.join(self.image, 'fifo.so')
        os.mkfifo(fifo)  # nobody writes it: opening it would block
        cases[fifo] = 'it is a FIFO'
        for source, reason in cases.items():
            message = self.refused(exception.HookSourceInvalid,
                                   source=source)
            self.assertIn('source %s is not usable' % source, message)
            self.assertIn(reason, message)
        self.assertFalse(os.path.exists(self.target))
        self.assertEqual([], self.leftovers())

    def test_a_library_of_another_architecture_is_refused(self) -> None:
        message = self.refused(exception.HookSourceInvalid, host=AARCH64)
        self.assertIn('built for ELF machine 62, this host is 183', message)
        message = self.refused(exception.HookSourceInvalid,
                               host=(1, '<', 3))
        self.assertIn('ELF class 2, but this host needs 32-bit', message)
        self.assertFalse(os.path.exists(self.target))

    # --- hostile targets ---------------------------------------------------

    def test_target_directory_missing(self) -> None:
        target = os.path.join(self.tmp, 'nowhere', 'libamvgpu.so')
        message = self.refused(exception.HookTargetError, target=target)
        self.assertIn('at %s: its directory %s does not exist' % (
            target, os.path.dirname(target)), message)

    def test_target_directory_that_is_a_symlink_is_refused(self) -> None:
        elsewhere = os.path.join(self.tmp, 'etc')
        os.mkdir(elsewhere)
        link = os.path.join(self.tmp, 'vgpu-link')
        os.symlink(elsewhere, link)
        target = os.path.join(link, 'libamvgpu.so')
        message = self.refused(exception.HookTargetError, target=target)
        self.assertIn('its directory %s is a symbolic link' % link, message)
        self.assertEqual([], os.listdir(elsewhere))

    def test_a_symlink_at_the_target_is_replaced_not_followed(self) -> None:
        victim = os.path.join(self.tmp, 'shadow')
        with open(victim, 'w') as stream:
            stream.write('secret\n')
        os.symlink(victim, self.target)
        self.assertEqual('replaced', hookinstall.install(
            self.source, self.target).action)
        self.assertFalse(os.path.islink(self.target))
        self.assertEqual(library(), self.read())
        self.assertEqual(b'secret\n', self.read(victim))

    def test_a_fifo_at_the_target_is_replaced_without_blocking(self) -> None:
        os.mkfifo(self.target)
        self.assertEqual('replaced', hookinstall.install(
            self.source, self.target).action)
        self.assertTrue(stat.S_ISREG(os.stat(self.target).st_mode))

    def test_a_directory_at_the_target_is_refused(self) -> None:
        os.mkdir(self.target)
        message = self.refused(exception.HookTargetError)
        self.assertIn('it is a directory', message)
        self.assertEqual([], self.leftovers())

    def test_not_a_file_name(self) -> None:
        self.assertIn('not a file name', self.refused(
            exception.HookTargetError, target=self.host + '/'))

    def test_temporary_files_of_a_killed_run_are_removed(self) -> None:
        stale = os.path.join(self.host, '%slibamvgpu.so.dead' %
                             hookinstall.TEMP_PREFIX)
        other = os.path.join(self.host, '%sother.so.dead' %
                             hookinstall.TEMP_PREFIX)
        for path in (stale, other):
            with open(path, 'wb') as stream:
                stream.write(library()[:100])
        hookinstall.install(self.source, self.target)
        self.assertFalse(os.path.exists(stale))
        self.assertTrue(os.path.exists(other))  # another library's

    # --- concurrency -------------------------------------------------------

    def test_another_install_holding_the_lock(self) -> None:
        fd = os.open(self.host, os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, fd)
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = [0.0]

        def sleep(seconds: float) -> None:
            now[0] += seconds

        message = self.refused(exception.HookInstallBusy, lock_timeout=2.0,
                               clock=lambda: now[0], sleep=sleep)
        self.assertIn('another install held', message)
        self.assertIn(self.target, message)
        self.assertGreaterEqual(now[0], 2.0)
        self.assertFalse(os.path.exists(self.target))
        fcntl.flock(fd, fcntl.LOCK_UN)
        self.assertEqual('installed', hookinstall.install(
            self.source, self.target).action)

    def test_concurrent_installs_leave_one_whole_library(self) -> None:
        sources = [self.write('v%d.so' % n, library(bytes([n]) * 512 * n))
                   for n in range(1, 5)]
        contents = {self.read(s) for s in sources}
        results: list[Any] = []
        barrier = threading.Barrier(8)

        def run(source: str) -> None:
            barrier.wait()
            try:
                for _ in range(5):
                    results.append(hookinstall.install(source, self.target))
            except Exception as err:  # reported below
                results.append(err)

        threads = [threading.Thread(target=run, args=(sources[n % 4],))
                   for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self.assertEqual(40, len(results))
        self.assertEqual([], [r for r in results
                              if isinstance(r, Exception)])
        self.assertIn(self.read(), contents)
        self.assertEqual([], self.leftovers())


class AtomicityTest(testtools.TestCase):
    """A process loading the library never sees part of one."""

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.useFixture(fixtures.FakeLogger())
        self.target = os.path.join(self.tmp, 'libamvgpu.so')
        self.versions = []
        for n in range(2):
            path = os.path.join(self.tmp, 'v%d.so' % n)
            with open(path, 'wb') as stream:
                stream.write(library(bytes([n + 1]) * 65536 * (n + 1)))
            self.versions.append(path)
        self.wanted = set()
        for path in self.versions:
            with open(path, 'rb') as stream:
                self.wanted.add(stream.read())

    def partial_reads(self, write: Any, rounds: int = 40) -> int:
        """Reads of the target that were none of the versions while
        ``write(source)`` ran ``rounds`` times."""
        write(self.versions[0])
        stop = threading.Event()
        bad = [0]

        def reader() -> None:
            while not stop.is_set():
                try:
                    with open(self.target, 'rb') as stream:
                        data = stream.read()
                except FileNotFoundError:
                    bad[0] += 1
                    continue
                if data not in self.wanted:
                    bad[0] += 1

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for n in range(rounds):
                write(self.versions[n % 2])
        finally:
            stop.set()
            thread.join(30)
        return bad[0]

    def test_readers_see_one_version_or_the_other(self) -> None:
        self.assertEqual(0, self.partial_reads(
            lambda source: hookinstall.install(source, self.target)))

    def test_the_reader_catches_a_writer_in_place(self) -> None:
        # the check above can fail: an in-place copy (cp onto the target)
        # is seen half-written
        def in_place(source: str) -> None:
            with open(source, 'rb') as stream:
                data = stream.read()
            with open(self.target, 'wb') as out:
                for start in range(0, len(data), 4096):
                    out.write(data[start:start + 4096])
                    out.flush()

        self.assertGreater(self.partial_reads(in_place, rounds=200), 0)
