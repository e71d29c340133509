"""The memory-limit hook check on real files."""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from typing import Any

import _ctypes
import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import memhook

#: a real shared object of this host: the interpreter's own _ctypes module
REAL_SO = _ctypes.__file__


class ValidateTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def copy(self, name: str = 'libamvgpu.so', data: bytes | None = None,
             patch: dict[int, bytes] | None = None) -> str:
        path = os.path.join(self.tmp, name)
        with open(REAL_SO, 'rb') as stream:
            content = bytearray(stream.read() if data is None else data)
        for offset, value in (patch or {}).items():
            content[offset:offset + len(value)] = value
        with open(path, 'wb') as out:
            out.write(content)
        return path

    def reason(self, path: str, **kwargs: Any) -> str:
        err = self.assertRaises(exception.MemoryHookError, memhook.validate,
                                path, **kwargs)
        self.assertIn(path, str(err))
        return str(err)

    def test_a_real_shared_object_passes(self) -> None:
        path = self.copy()
        memhook.validate(path)
        self.assertEqual(memhook.HookStatus(path, True),
                         memhook.check(path))
        ctypes.CDLL(path)  # the loader agrees
        link = os.path.join(self.tmp, 'link.so')
        os.symlink(path, link)
        memhook.validate(link)

    def test_missing(self) -> None:
        status = memhook.check(os.path.join(self.tmp, 'nope.so'))
        self.assertFalse(status.usable)
        self.assertIn('nope.so is not usable: no such file', status.reason)
        dangling = os.path.join(self.tmp, 'dangling.so')
        os.symlink(os.path.join(self.tmp, 'gone'), dangling)
        self.assertIn('no such file', self.reason(dangling))

    def test_not_regular_files(self) -> None:
        fifo = os.path.join(self.tmp, 'fifo.so')
        os.mkfifo(fifo)
        done: list[str] = []
        # nobody writes the FIFO: a blocking open would never return
        thread = threading.Thread(
            target=lambda: done.append(self.reason(fifo)), daemon=True)
        thread.start()
        thread.join(10)
        self.assertEqual(1, len(done), 'the check blocked on a FIFO')
        self.assertIn('it is a FIFO, not a regular file', done[0])
        self.assertIn('a directory', self.reason(self.tmp))
        self.assertIn('a device', self.reason('/dev/null'))

    def test_text_and_empty_files(self) -> None:
        text = self.copy('text.so', b'#!/bin/sh\necho not a library\n')
        self.assertIn('not an ELF file', self.reason(text))
        self.assertIn('not an ELF file', self.reason(self.copy('empty.so',
                                                               b'')))

    def test_truncated_files(self) -> None:
        with open(REAL_SO, 'rb') as stream:
            whole = stream.read()
        for size, words in ((8, 'not an ELF file'), (20, 'truncated ELF'),
                            (64, 'truncated'), (len(whole) // 2, 'truncated'),
                            (len(whole) - 1, 'truncated')):
            path = self.copy('cut%d.so' % size, whole[:size])
            self.assertIn(words, self.reason(path), size)

    def test_huge_files_are_not_read(self) -> None:
        path = os.path.join(self.tmp, 'huge.so')
        with open(path, 'wb') as out:
            out.truncate(memhook.MAX_SIZE + 1)  # sparse: no disk used
        self.assertIn('more than the', self.reason(path))

    def test_wrong_kind_class_or_machine(self) -> None:
        self.assertIn('ELF type 2, not a shared object',
                      self.reason(self.copy(patch={16: b'\x02\x00'})))
        self.assertIn('built for ELF machine 183',
                      self.reason(self.copy(patch={18: struct.pack(
                          '<H', 183)})))
        self.assertIn('ELF class 1',
                      self.reason(self.copy(patch={4: b'\x01'})))
        self.assertIn('byte order',
                      self.reason(self.copy(patch={5: b'\x02'})))
        # another host's expectations
        path = self.copy()
        self.assertIn('this host is 183', self.reason(
            path, host=(2, '<', 183)))

    def test_hostile_program_headers(self) -> None:
        # e_phnum (offset 56 in a 64-bit header) huge: refused, not read
        self.assertIn('program headers, more than',
                      self.reason(self.copy(patch={56: b'\xff\xff'})))
        self.assertIn('no program headers',
                      self.reason(self.copy(patch={56: b'\x00\x00'})))
        # program header table offset past the end
        self.assertIn('truncated', self.reason(self.copy(
            patch={32: struct.pack('<Q', 1 << 40)})))

    def test_unreadable_file(self) -> None:
        if os.geteuid() == 0:
            self.skipTest('root reads files whatever their mode')
        path = self.copy()
        os.chmod(path, 0)
        self.assertIn('cannot open it', self.reason(path))


class EventBodyTest(testtools.TestCase):

    def test_deterministic_and_names_the_reason(self) -> None:
        node = {'metadata': {'name': 'gpu-7', 'uid': 'u-7'}}
        status = memhook.check('/nonexistent/libamvgpu.so')
        first = memhook.event_body(node, status, 1, '2026-01-01T00:00:00Z')
        again = memhook.event_body(node, status, 1, '2026-01-02T00:00:00Z')
        self.assertEqual(first['metadata'], again['metadata'])
        self.assertTrue(first['metadata']['name'].startswith(
            'gpu-7.memory-hook.'))
        self.assertEqual(('Warning', 'MemoryHookUnavailable', 'Node',
                          'gpu-7', 'u-7'),
                         (first['type'], first['reason'],
                          first['involvedObject']['kind'],
                          first['involvedObject']['name'],
                          first['involvedObject']['uid']))
        self.assertIn('/nonexistent/libamvgpu.so', first['message'])
        self.assertIn('whole GPUs only', first['message'])
        # slices stay offered where the kernel caps them
        kernel = memhook.event_body(node, status, 10, 'x')
        self.assertIn('capped by the kernel only', kernel['message'])
        self.assertNotIn('whole GPUs only', kernel['message'])
        other = memhook.event_body(node, memhook.check('/dev/null'), 1, 'x')
        self.assertNotEqual(first['metadata']['name'],
                            other['metadata']['name'])
