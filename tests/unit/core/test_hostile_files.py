"""Crafted input files: every loader fails closed, fast, naming the file.

Each attack is a file a user or a node controls (a ledger, a fleet or
workload file, a snapshot, move state, the apply manifest, a sysfs value)
and each test asserts the error type, that the message names the file,
and a time and memory bound.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import fixtures
import hypothesis
import testtools
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.inventory import fleet
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.policy import workload

#: every attack must fail within this (seconds) and below this (bytes)
TIME_BOUND = 5.0
MEMORY_BOUND = 64 * 1024 * 1024

BILLION_LAUGHS = '\n'.join(
    ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'] +
    ['a%d: &a%d [%s]' % (i, i, ', '.join(['*a%d' % (i - 1)] * 8))
     for i in range(1, 10)]) + '\n'
MERGE_BOMB = '\n'.join(
    ['m0: &m0 {k0: 0, k1: 1, k2: 2, k3: 3}'] +
    ['m%d: &m%d {<<: [%s], x%d: 1}' % (
        i, i, ', '.join('*m%d' % (i - 1) for _ in range(1)), i)
     for i in range(1, 3)] +
    ['n%d: &n%d [%s]' % (i, i, ', '.join(
        ['{<<: *m2, y: %d}' % j for j in range(4)] +
        (['*n%d' % (i - 1)] * 6 if i else [])))
     for i in range(10)]) + '\n'
RECURSIVE = 'a: &a [1, *a]\n'
DEEP = '[' * 50000 + ']' * 50000 + '\n'
ALIAS_CHAIN = '\n'.join(['l0: &l0 [x]'] + ['l%d: &l%d [*l%d]' % (i, i, i - 1)
                                          for i in range(1, 300)]) + '\n'
HUGE_INT = 'gpus: ' + '9' * 1_000_000 + '\n'
HUGE_HEX = 'gpus: 0x' + 'f' * 1_000_000 + '\n'


class _Bounded(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path

    def file(self, name: str, content: str | bytes) -> str:
        path = os.path.join(self.dir, name)
        with open(path, 'wb') as stream:
            stream.write(content.encode() if isinstance(content, str)
                         else content)
        return path

    def assertFailsBounded(self, error: type[Exception], culprit: str,
                           func: Callable[..., Any], *args: Any) -> str:
        """``func(*args)`` raises ``error`` naming ``culprit``, in bounded
        time and memory; :returns: the message."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            tracemalloc.start()
            began = time.monotonic()
            try:
                func(*args)
            except BaseException as err:  # noqa: BLE001 (checked below)
                outcome['error'] = err
            outcome['took'] = time.monotonic() - began
            outcome['peak'] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()

        # a thread, so that a loader that blocks (a FIFO) fails the test
        # instead of hanging the run
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(TIME_BOUND * 4)
        self.assertFalse(thread.is_alive(), '%s hangs' % func.__name__)
        err = outcome.get('error')
        self.assertIsInstance(err, error, repr(err))
        self.assertIn(culprit, str(err))
        self.assertLess(outcome['took'], TIME_BOUND)
        self.assertLess(outcome['peak'], MEMORY_BOUND)
        return str(err)


class YamlAttacksTest(_Bounded):
    """Every YAML loader of the project, against each attack."""

    LOADERS: tuple[tuple[str, Callable[[str], Any]], ...] = (
        ('ledger', ledger.load), ('fleet file', fleet.load_specs),
        ('workload file', workload.load_workloads),
        ('file', yamlutil.load_file))

    def _each_loader(self, name: str, content: str | bytes,
                     reason: str) -> None:
        path = self.file(name, content)
        for what, loader in self.LOADERS:
            message = self.assertFailsBounded(
                exception.AmdgpuVirtError, path, loader, path)
            self.assertIn(reason, message, what)

    def test_billion_laughs(self) -> None:
        self._each_loader('laughs.yaml', BILLION_LAUGHS,
                          'expand to more than')

    def test_merge_bomb(self) -> None:
        self._each_loader('merge.yaml', MERGE_BOMB, 'expand to more than')

    def test_recursive_alias(self) -> None:
        self._each_loader('recursive.yaml', RECURSIVE, 'recursive alias')

    def test_deep_nesting(self) -> None:
        self._each_loader('deep.yaml', DEEP, 'nested deeper than 100')
        # closers hidden in a string must not hide the depth that follows
        self._each_loader('hidden.yaml', 'a: "%s"\nb: %s\n' % (
            ']' * 5000, '[' * 100000), 'nested deeper than 100')
        self._each_loader('dashes.yaml', '- ' * 100000 + 'x\n',
                          'nested deeper than 100')
        self._each_loader('indent.yaml', ''.join(
            ' ' * i + 'k%d:\n' % i for i in range(3000)),
            'nested deeper than 100')

    def test_alias_chain_nests_too_deep(self) -> None:
        self._each_loader('chain.yaml', ALIAS_CHAIN, 'nest deeper than 100')

    def test_huge_integers(self) -> None:
        self._each_loader('int.yaml', HUGE_INT, 'a plain scalar of 1000000 '
                          'characters that looks like a number')
        self._each_loader('hex.yaml', HUGE_HEX, 'looks like a number')
        self._each_loader('tagged.yaml', 'gpus: !!int "%s"\n' % ('9' * 500),
                          'an integer of 500 characters')

    def test_binary_and_non_utf8(self) -> None:
        self._each_loader('latin1.yaml', 'host: caf\xe9\n'.encode('latin-1'),
                          'not UTF-8 text (byte 9 is 0xe9)')
        self._each_loader('nul.yaml', b'host: a\x00b\n', 'NUL byte at 7')
        self._each_loader('elf.yaml', b'\x7fELF\x02\x01\x01' + bytes(64),
                          'NUL byte')

    def test_oversize_file_is_not_read(self) -> None:
        path = os.path.join(self.dir, 'big.yaml')
        with open(path, 'wb') as stream:   # sparse: costs no disk
            stream.truncate(fileutil.MAX_INPUT_BYTES + 1)
        for _what, loader in self.LOADERS:
            self.assertIn('larger than', self.assertFailsBounded(
                exception.FileInputError, path, loader, path))

    def test_small_legit_aliases_still_load(self) -> None:
        path = self.file('ok.yaml', 'base: &b {x: 1}\nuse: {<<: *b, y: 2}\n'
                         'list: [*b, *b]\n')
        self.assertEqual({'x': 1, 'y': 2}, yamlutil.load_file(path)['use'])

    @hypothesis.settings(max_examples=200, deadline=None)
    @hypothesis.given(st.binary(max_size=512))
    def test_any_bytes_fail_only_with_our_errors(self, data: bytes) -> None:
        try:
            text = fileutil.decode_text(data, 'x.yaml')
            yamlutil.load(text, 'x.yaml')
        except exception.AmdgpuVirtError as err:
            self.assertIn('x.yaml', str(err))

    @hypothesis.settings(max_examples=100, deadline=None)
    @hypothesis.given(st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) |
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=30), st.sampled_from(['&x ', '*x ', '<<: ', '[', '{']))
    def test_mangled_documents_fail_only_with_our_errors(
            self, document: Any, splice: str) -> None:
        text = yamlutil.dump(document)
        middle = len(text) // 2
        try:
            yamlutil.load(text[:middle] + splice + text[middle:], 'm.yaml')
        except exception.AmdgpuVirtError as err:
            self.assertIn('m.yaml', str(err))


class JsonAttacksTest(_Bounded):

    def test_snapshot_deep_and_huge(self) -> None:
        for name, content, reason in (
                ('deep.json', '{"a": ' + '[' * 50000 + ']' * 50000 + '}',
                 'nested deeper than 100'),
                ('deep2.json', '{"a": ' + '[' * 500 + ']' * 500 + '}',
                 'nested deeper than 100'),
                ('int.json', '{"a": ' + '9' * 100000 + '}',
                 'not valid JSON'),
                ('bin.json', b'{"a": "\xff"}', 'not UTF-8')):
            path = self.file(name, content)
            self.assertIn(reason, self.assertFailsBounded(
                exception.SnapshotError, path, snapshot.load, path))

    def test_snapshot_yaml_bomb(self) -> None:
        path = self.file('laughs.yaml', BILLION_LAUGHS)
        self.assertIn('expand to more than', self.assertFailsBounded(
            exception.SnapshotError, path, snapshot.load, path))

    @hypothesis.settings(max_examples=200, deadline=None)
    @hypothesis.given(st.text(alphabet='[]{}":,0123456789ae.-', max_size=300))
    def test_any_json_fails_only_with_our_errors(self, text: str) -> None:
        with contextlib.suppress(exception.AmdgpuVirtError):
            yamlutil.load_json(text, 'j.json')


class SpecialFilesTest(_Bounded):
    """FIFOs, sockets, devices and directories where a file should be."""

    def _specials(self) -> list[tuple[str, str]]:
        fifo = os.path.join(self.dir, 'fifo')
        os.mkfifo(fifo)
        sock_path = os.path.join(self.dir, 'sock')
        server = socket.socket(socket.AF_UNIX)
        self.addCleanup(server.close)
        server.bind(sock_path)
        zero = os.path.join(self.dir, 'zero')
        os.symlink('/dev/zero', zero)
        return [(fifo, 'a FIFO'), (sock_path, 'a socket'),
                (zero, 'a character device'), (self.dir, 'a directory')]

    def test_every_loader_refuses_them_without_blocking(self) -> None:
        loaders = YamlAttacksTest.LOADERS + (
            ('snapshot', snapshot.load),
            ('read_text', fileutil.read_text))
        for path, kind in self._specials():
            for what, loader in loaders:
                error = exception.SnapshotError if what == 'snapshot' \
                    else exception.AmdgpuVirtError
                message = self.assertFailsBounded(error, path, loader, path)
                self.assertIn(kind, message, what)

    def test_read_bytes_limit_on_a_regular_file(self) -> None:
        path = self.file('f', b'x' * 100)
        self.assertEqual(b'x' * 100, fileutil.read_bytes(path, limit=100))
        self.assertIn('larger than 99 bytes', self.assertFailsBounded(
            exception.FileInputError, path, fileutil.read_bytes, path,
            'file', 99))


class SysfsSpecialFilesTest(_Bounded):
    """A node's sysfs tree with special files where values should be: the
    scan finishes, the GPUs are still reported, a warning names each file."""

    def test_scan_survives_fifos_sockets_and_devices(self) -> None:
        from amdgpu_virt.inventory import simulate
        from tests.unit.inventory import fixtures as inv_fixtures

        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec('h', gpus=2)))
        pf0 = os.path.join(host.root, 'bus/pci/devices/0000:05:00.0')
        planted = {}
        for name, make, kind in (
                ('numa_node', os.mkfifo, 'a FIFO'),
                ('mem_info_vram_total', lambda p: os.symlink('/dev/zero', p),
                 'a character device'),
                ('product_name', self._socket, 'a socket'),
                ('unique_id', os.mkdir, 'a directory')):
            path = os.path.join(pf0, name)
            os.unlink(path)
            make(path)
            planted[path] = kind
        outcome: dict[str, Any] = {}
        thread = threading.Thread(
            target=lambda: outcome.update(found=host.scan('h')), daemon=True)
        began = time.monotonic()
        thread.start()
        thread.join(TIME_BOUND * 4)
        self.assertFalse(thread.is_alive(), 'the scan hangs')
        self.assertLess(time.monotonic() - began, TIME_BOUND)
        found = outcome['found']
        self.assertEqual(2, len(found.gpus))
        warnings = {w.culprit: w.message for w in found.warnings}
        for path, kind in planted.items():
            self.assertIn(path, warnings)
            self.assertIn(kind, warnings[path])

    def _socket(self, path: str) -> None:
        server = socket.socket(socket.AF_UNIX)
        self.addCleanup(server.close)
        server.bind(path)
