"""CU allocator and its strategies."""

from __future__ import annotations

import testtools

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import model
from amdgpu_virt.conf import sharing as sharing_conf
from amdgpu_virt.sharing import allocator

from oslo_config import cfg


class HelpersTest(testtools.TestCase):

    def test_runs(self):
        self.assertEqual([], allocator.runs(0))
        self.assertEqual([(0, 3), (5, 1), (8, 300)],
                         allocator.runs(0b100111 | (((1 << 300) - 1) << 8)))

    def test_ids_and_bits(self):
        self.assertEqual((1, 2, 9), allocator.ids_of(0b1000000110))
        self.assertEqual([1, 2, 9], list(allocator.bits(0b1000000110)))

    def test_whole_units(self):
        self.assertEqual(0b11110000, allocator.whole_units(0b11111000, 2))
        self.assertEqual(0b1100, allocator.whole_units(0b1110, 2))
        self.assertEqual(0b11110000, allocator.whole_units(0b11110111, 4))
        self.assertEqual(0b1011, allocator.whole_units(0b1011, 1))

    def test_take_low(self):
        self.assertEqual(0b1011, allocator.take_low(0b111011, 3))

    def test_xcc_counts_of_ranges_are_even(self):
        self.assertEqual((9, 9, 9, 9, 10, 10, 10, 10),
                         allocator.xcc_counts(((1 << 76) - 1) << 4, 8))
        self.assertEqual(1, allocator.xcc_imbalance(((1 << 76) - 1) << 4,
                                                    8))
        strided = sum(1 << i for i in range(0, 304, 8))
        self.assertEqual(38, allocator.xcc_imbalance(strided, 8))


class FirstFitTest(testtools.TestCase):

    def test_lowest_ids(self):
        cus = allocator.CuAllocator('g', 16)
        self.assertEqual((0, 1, 2), cus.allocate('a', 3))
        self.assertEqual((3, 4), cus.allocate('b', 2))
        cus.release('a')
        self.assertEqual((0, 1, 2, 5), cus.allocate('c', 4))

    def test_rdna_whole_pairs(self):
        cus = allocator.CuAllocator('g', 8, unit=2)
        cus.claim('x', [1])
        self.assertEqual((2, 3, 4, 5), cus.allocate('a', 3))
        self.assertEqual(2, cus.usable_count)
        self.assertRaises(exception.InsufficientCapacity, cus.allocate,
                          'b', 3)


class BestFitTest(testtools.TestCase):

    def make(self, total=32, unit=1):
        return allocator.CuAllocator('g', total, unit=unit,
                                     strategy=allocator.BestFitStrategy())

    def test_smallest_run_that_fits(self):
        cus = self.make()
        cus.claim('x', [4, 5, 12])   # free runs: 0-3, 6-11, 13-31
        self.assertEqual((6, 7, 8, 9, 10), cus.allocate('a', 5))
        self.assertEqual((0, 1, 2, 3), cus.allocate('b', 4))
        self.assertEqual((13, 14), cus.allocate('c', 2))

    def test_exact_fit_preferred(self):
        cus = self.make()
        cus.claim('x', [3, 10])   # free runs 0-2 (3), 4-9 (6), 11-31 (21)
        self.assertEqual((4, 5, 6, 7, 8, 9), cus.allocate('a', 6))

    def test_fragmented_fewest_pieces(self):
        cus = self.make(16)
        cus.claim('x', [2, 3, 8, 9, 13])
        # free runs: 0-1 (2), 4-7 (4), 10-12 (3), 14-15 (2)
        got = cus.allocate('a', 6)
        # the largest run whole, then the remainder from the smallest run
        # that holds it (a 2-run, the lowest)
        self.assertEqual((0, 1, 4, 5, 6, 7), got)
        self.assertEqual((10, 11, 12, 14, 15), cus.allocate('b', 5))

    def test_refuses_only_when_too_few_free(self):
        cus = self.make(16)
        cus.claim('x', range(0, 16, 2))
        self.assertEqual(8, len(cus.allocate('a', 8)))
        self.assertRaises(exception.InsufficientCapacity, cus.allocate,
                          'b', 1)

    def test_rdna_pairs_stay_aligned(self):
        cus = self.make(16, unit=2)
        cus.claim('x', [1, 6])
        # whole free pairs: 2-5 and 8-15; 3 CUs round up to 4
        self.assertEqual((2, 3, 4, 5), cus.allocate('a', 3))
        self.assertEqual((8, 9), cus.allocate('b', 1))
        for owner in cus.allocations:
            if owner != 'x':
                for cu in cus.cus_of(owner)[::2]:
                    self.assertEqual(0, cu % 2)

    def test_keeps_large_runs_free(self):
        best = self.make(304)
        first = allocator.CuAllocator('g', 304)
        for cus in (best, first):
            for owner, count in (('a', 40), ('b', 10), ('c', 20),
                                 ('d', 10)):
                cus.allocate(owner, count)
            cus.release('a')
            cus.release('c')
            # holes: 0-39, 50-69, 80-303; 20 CUs
            cus.allocate('e', 20)
        self.assertEqual(tuple(range(50, 70)), best.cus_of('e'))
        self.assertEqual(tuple(range(20)), first.cus_of('e'))
        # then 40 CUs: one range on best-fit, two pieces on first-fit
        self.assertEqual(1, len(allocator.runs(best.allocate_mask('f',
                                                                  40))))
        self.assertEqual(2, len(allocator.runs(first.allocate_mask('f',
                                                                   40))))


class AllocatorRulesTest(testtools.TestCase):

    def test_owner_twice(self):
        cus = allocator.CuAllocator('gpu-0', 8)
        cus.allocate('a', 1)
        self.assertRaises(exception.AllocationConflict, cus.allocate, 'a', 1)
        self.assertRaises(exception.AllocationConflict, cus.claim, 'a', [5])

    def test_claim_conflict_names_both(self):
        cus = allocator.CuAllocator('gpu-0', 8)
        cus.claim('ns/a', [2, 3])
        err = self.assertRaises(exception.AllocationConflict, cus.claim,
                                'ns/b', [3, 4])
        self.assertEqual('CU 3 of GPU gpu-0 is claimed by both ns/b and '
                         'ns/a', str(err))
        self.assertRaises(exception.SharingError, cus.claim, 'c', [8])
        self.assertRaises(exception.SharingError, cus.claim_mask, 'c', -1)

    def test_for_model(self):
        cus = allocator.CuAllocator.for_model('gpu-0',
                                              catalog.by_name('MI300X'))
        self.assertEqual((304, 1), (cus.total, cus.unit))
        rdna = model.GpuModel(name='RX', product_name='RX', pf_device_id=1,
                              compute_units=32, cu_alloc_unit=2)
        self.assertEqual(2, allocator.CuAllocator.for_model('g', rdna).unit)
        unknown = model.GpuModel(name='X', product_name='X', pf_device_id=2)
        self.assertRaises(exception.SharingError,
                          allocator.CuAllocator.for_model, 'g', unknown)

    def test_bad_counts(self):
        cus = allocator.CuAllocator('gpu-0', 8)
        for count in (0, -1, 9):
            err = self.assertRaises(exception.InsufficientCapacity,
                                    cus.allocate, 'a', count)
            self.assertIn('gpu-0', str(err))
        self.assertRaises(exception.SharingError, allocator.CuAllocator,
                          'g', 7, unit=2)
        self.assertRaises(exception.SharingError, allocator.CuAllocator,
                          'g', 1 << 31)

    def test_release_and_queries(self):
        cus = allocator.CuAllocator('gpu-0', 8)
        cus.allocate('a', 3)
        self.assertEqual('a', cus.owner_of(2))
        self.assertIsNone(cus.owner_of(3))
        self.assertEqual({'a': (0, 1, 2)}, dict(cus.allocations))
        self.assertEqual((0, 1, 2), cus.release('a'))
        self.assertRaises(exception.UnknownConsumer, cus.release, 'a')
        self.assertRaises(exception.UnknownConsumer, cus.cus_of, 'a')
        self.assertEqual(8, cus.free_count)

    def test_fragmentation(self):
        cus = allocator.CuAllocator('g', 10)
        cus.claim('x', [2, 5])
        frag = cus.fragmentation()
        self.assertEqual((8, 4, 3), (frag.free, frag.largest_free_run,
                                     frag.free_runs))
        self.assertAlmostEqual(0.5, frag.index)
        self.assertEqual(0.0, allocator.Fragmentation(0, 0, 0).index)

    def test_invalid_strategy_choice_is_caught(self):
        class Greedy(allocator.CuStrategy):
            name = 'greedy'

            def choose(self, free, total, count, unit):
                return (1 << total) - 1

        cus = allocator.CuAllocator('g', 8, strategy=Greedy())
        cus.claim('x', [0])
        self.assertRaises(exception.SharingError, cus.allocate, 'a', 2)
        self.assertEqual(1, cus.used_count)

        class Unaligned(allocator.CuStrategy):
            name = 'unaligned'

            def choose(self, free, total, count, unit):
                return 0b110

        cus = allocator.CuAllocator('g', 8, unit=2, strategy=Unaligned())
        self.assertRaises(exception.SharingError, cus.allocate, 'a', 2)
        self.assertEqual(8, cus.usable_count)


class StrategyPluginTest(testtools.TestCase):

    def test_registered_and_default(self):
        self.assertEqual('best-fit',
                         allocator.load_strategy('best-fit').name)
        self.assertEqual('first-fit',
                         allocator.load_strategy('first-fit').name)
        self.assertRaises(exception.DriverNotFound, allocator.load_strategy,
                          'worst-fit')
        conf = cfg.ConfigOpts()
        sharing_conf.register_opts(conf)
        conf([])
        self.assertEqual('best-fit', conf.sharing.cu_strategy)
