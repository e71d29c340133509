"""The Instinct model table and its mode checks."""

from __future__ import annotations

import testtools

from amdgpu_virt import catalog
from amdgpu_virt import exception


class TestTable(testtools.TestCase):

    def test_ids_are_unique(self):
        pf = [m.pf_device_id for m in catalog.MODELS]
        vf = [m.vf_device_id for m in catalog.MODELS
              if m.vf_device_id is not None]
        self.assertEqual(len(pf), len(set(pf)))
        self.assertEqual(len(vf), len(set(vf)))
        self.assertEqual(set(), set(pf) & set(vf))

    def test_design_facts(self):
        mi300x = catalog.by_name('MI300X')
        self.assertEqual((0x74a1, 0x74b5, 304, 8, 38, 192 * 1024, 0x120000,
                          90402), (
            mi300x.pf_device_id, mi300x.vf_device_id, mi300x.compute_units,
            mi300x.xcds, mi300x.cus_per_xcd, mi300x.vram_mib,
            mi300x.pci_class, mi300x.gfx_target_version))
        self.assertEqual(0x7410, catalog.by_name('mi210').vf_device_id)
        self.assertIsNone(catalog.by_name('MI300A').vf_device_id)
        self.assertEqual(('SPX', 'TPX', 'CPX'),
                         catalog.by_name('MI300A').compute_modes)
        self.assertEqual(('NPS1', 'NPS2', 'NPS4'),
                         catalog.by_name('MI300X').memory_modes)

    def test_vf_id_patterns(self):
        for model in catalog.MODELS:
            if model.vf_device_id is None:
                continue
            delta = model.vf_device_id - model.pf_device_id
            if model.family == 'CDNA3':
                self.assertEqual(0x14, delta, model.name)
            elif model.family == 'CDNA4':
                self.assertEqual(0x10, delta, model.name)
            else:
                self.assertEqual(1, delta, model.name)

    def test_lookups(self):
        self.assertEqual('MI300X', catalog.by_pf_device_id(0x74a1).name)
        self.assertIsNone(catalog.by_pf_device_id(0x74b5))
        self.assertEqual('MI300X', catalog.by_vf_device_id(0x74b5).name)
        self.assertTrue(catalog.is_vf_device_id(0x74b6))
        self.assertFalse(catalog.is_vf_device_id(0x74a1))
        self.assertEqual('MI300X',
                         catalog.by_name('AMD Instinct MI300X').name)
        err = self.assertRaises(exception.UnknownModel, catalog.by_name,
                                'MI999')
        self.assertIn("'MI999'", str(err))
        self.assertIn('MI300X', str(err))

    def test_unknown_model(self):
        model = catalog.unknown_model(0x74ff, None, 100, 1024)
        self.assertFalse(model.known)
        self.assertEqual('unknown-74ff', model.name)
        self.assertEqual('AMD GPU 74ff', model.product_name)
        self.assertEqual((100, 1024), (model.compute_units, model.vram_mib))

    def test_gpu_class(self):
        self.assertTrue(catalog.is_gpu_class(0x120000))
        self.assertTrue(catalog.is_gpu_class(0x038000))
        self.assertTrue(catalog.is_gpu_class(0x030000))
        self.assertFalse(catalog.is_gpu_class(0x040300))
        self.assertFalse(catalog.is_gpu_class(0x060400))


class TestModes(testtools.TestCase):

    def test_partitions_in_mode(self):
        mi300x = catalog.by_name('MI300X')
        self.assertEqual([1, 2, 4, 8], [
            catalog.partitions_in_mode(mi300x, m)
            for m in ('SPX', 'dpx', 'QPX', 'CPX')])
        self.assertEqual(6, catalog.partitions_in_mode(
            catalog.by_name('MI300A'), 'CPX'))
        self.assertEqual(3, catalog.partitions_in_mode(
            catalog.by_name('MI300A'), 'TPX'))
        self.assertEqual(4, catalog.partitions_in_mode(
            catalog.by_name('MI308X'), 'CPX'))
        err = self.assertRaises(exception.InvalidPartitionMode,
                                catalog.partitions_in_mode, mi300x, 'TPX')
        self.assertIn("'TPX'", str(err))
        self.assertIn('SPX, DPX, QPX, CPX', str(err))
        err = self.assertRaises(exception.InvalidPartitionMode,
                                catalog.partitions_in_mode,
                                catalog.by_name('MI210'), 'SPX')
        self.assertIn('allowed: none', str(err))

    def test_check_modes(self):
        mi300x = catalog.by_name('MI300X')
        for compute, memory in (('SPX', 'NPS1'), ('DPX', 'NPS2'),
                                ('QPX', 'NPS4'), ('CPX', 'nps4')):
            catalog.check_modes(mi300x, compute, memory)
            self.assertTrue(mi300x.supports(compute, memory.upper()))
        for compute, memory in (('SPX', 'NPS4'), ('DPX', 'NPS4'),
                                ('QPX', 'NPS2')):
            err = self.assertRaises(exception.InvalidPartitionMode,
                                    catalog.check_modes, mi300x, compute,
                                    memory)
            self.assertIn(repr(memory), str(err))
        self.assertRaises(exception.InvalidPartitionMode, catalog.check_modes,
                          catalog.by_name('MI300A'), 'CPX', 'NPS4')

    def test_vf_counts(self):
        mi300x = catalog.by_name('MI300X')
        self.assertEqual('CPX', catalog.check_vf_count(mi300x, 8))
        self.assertEqual('SPX', catalog.check_vf_count(mi300x, 1))
        err = self.assertRaises(exception.InvalidPartitionMode,
                                catalog.check_vf_count, mi300x, 4)
        self.assertIn('allowed: 1, 8', str(err))
        self.assertEqual('QPX', catalog.check_vf_count(
            mi300x, 4, allow_unofficial=True))
        self.assertRaises(exception.InvalidPartitionMode,
                          catalog.check_vf_count, mi300x, 3,
                          allow_unofficial=True)
        err = self.assertRaises(exception.InvalidPartitionMode,
                                catalog.check_vf_count,
                                catalog.by_name('MI250X'), 1)
        self.assertIn('no SR-IOV', str(err))
        self.assertEqual('DPX', catalog.check_vf_count(
            catalog.by_name('MI355X'), 2))

    def test_vf_count_error_names_the_model_counts(self):
        # A count GIM does not know at all still lists the counts this
        # model takes, not every count GIM knows.
        mi300x = catalog.by_name('MI300X')
        err = self.assertRaises(exception.InvalidPartitionMode,
                                catalog.check_vf_count, mi300x, 3)
        self.assertIn('MI300X', str(err))
        self.assertIn('VF count 3; allowed: 1, 8', str(err))
        err = self.assertRaises(exception.InvalidPartitionMode,
                                catalog.check_vf_count, mi300x, 3,
                                allow_unofficial=True)
        self.assertIn('allowed: 1, 2, 4, 8', str(err))
        err = self.assertRaises(exception.InvalidPartitionMode,
                                catalog.check_vf_count,
                                catalog.by_name('MI250X'), 3)
        self.assertIn('none (no SR-IOV)', str(err))

    def test_vf_size(self):
        mi300x = catalog.by_name('MI300X')
        cus, vram = catalog.vf_size(mi300x, 8)
        self.assertEqual(38, cus)
        self.assertEqual((192 * 1024 - 512) // 8, vram)
        self.assertEqual((None, None), catalog.vf_size(
            catalog.by_name('MI350P'), 1))
