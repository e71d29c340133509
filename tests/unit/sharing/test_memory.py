"""Per-GPU memory shares."""

from __future__ import annotations

import testtools

from amdgpu_virt import exception
from amdgpu_virt.sharing import memory


class MemorySharesTest(testtools.TestCase):

    def test_allocate_release(self):
        shares = memory.MemoryShares('gpu-0', 196288)
        self.assertEqual(49152, shares.allocate('ns/a', 49152))
        shares.claim('ns/b', 100000)
        self.assertEqual(149152, shares.used)
        self.assertEqual(47136, shares.free)
        self.assertEqual({'ns/a': 49152, 'ns/b': 100000},
                         dict(shares.allocations))
        self.assertTrue(shares.fits(47136))
        self.assertFalse(shares.fits(47137))
        self.assertEqual(100000, shares.release('ns/b'))
        self.assertEqual(49152, shares.share_of('ns/a'))

    def test_insufficient_names_everything(self):
        shares = memory.MemoryShares('gpu-0', 1000)
        shares.allocate('a', 900)
        err = self.assertRaises(exception.InsufficientCapacity,
                                shares.allocate, 'ns/b', 200)
        self.assertEqual('GPU gpu-0 cannot give 200 MiB to ns/b: 100 free '
                         'of 1000', str(err))
        self.assertRaises(exception.InsufficientCapacity, shares.claim,
                          'ns/c', 101)
        self.assertEqual(900, shares.used)

    def test_fail_closed(self):
        shares = memory.MemoryShares('gpu-0', 1000)
        shares.allocate('a', 1)
        for owner, mib in (('a', 1), ('b', 0), ('b', -5), ('b', 1.5),
                           ('b', True)):
            self.assertRaises(exception.SharingError, shares.allocate,
                              owner, mib)
        self.assertRaises(exception.UnknownConsumer, shares.release, 'b')
        self.assertRaises(exception.UnknownConsumer, shares.share_of, 'b')
        self.assertRaises(exception.SharingError, memory.MemoryShares,
                          'g', 0)
        self.assertEqual(1, shares.used)
