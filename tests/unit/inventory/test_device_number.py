"""Device numbers of character devices read from sysfs (CDI edits)."""

from __future__ import annotations

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import sysfs


class DeviceNumberTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path

    def _dev(self, name: str) -> str:
        directory = os.path.join(self.root, 'class', 'drm', name)
        os.makedirs(directory)
        return os.path.join(directory, 'dev')

    def test_major_and_minor(self) -> None:
        with open(self._dev('renderD128'), 'w') as out:
            out.write('226:128\n')
        self.assertEqual((226, 128),
                         sysfs.device_number(self.root, 'drm', 'renderD128'))

    def test_missing_or_garbage_names_the_file(self) -> None:
        err = self.assertRaises(exception.InventoryError, sysfs.device_number,
                                self.root, 'drm', 'card9')
        self.assertIn(os.path.join('drm', 'card9', 'dev'), str(err))
        path = self._dev('card1')
        for garbage in ('226', 'a:b', '\xff\xfe', ''):
            with open(path, 'w', encoding='latin-1') as out:
                out.write(garbage)
            err = self.assertRaises(exception.InventoryError,
                                    sysfs.device_number, self.root, 'drm',
                                    'card1')
            self.assertIn(path, str(err))

    def test_a_fifo_is_refused_without_blocking(self) -> None:
        # a plain open() of a FIFO with no writer would wait forever
        path = self._dev('renderD129')
        os.mkfifo(path)
        self.useFixture(fixtures.Timeout(10, gentle=True))
        err = self.assertRaises(exception.InventoryError, sysfs.device_number,
                                self.root, 'drm', 'renderD129')
        self.assertIn(path, str(err))
