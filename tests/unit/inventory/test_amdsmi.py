"""The amdsmi driver with a stand-in for the library.

ROCm's libamd_smi.so cannot load here (no AMD GPU, no ROCm), so the
library's calls are answered by an object built from a simulated host.
"""

from __future__ import annotations

import importlib

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import amdsmi
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import Driver
from tests.unit.inventory import fixtures as inv_fixtures

real_import = importlib.import_module


class FakeAmdSmi:
    """Answers amdsmi calls for the amdgpu-bound GPUs of an inventory."""

    def __init__(self, inventory, broken=()):
        self.handles = []
        for gpu in inventory.gpus:
            if gpu.driver is Driver.AMDGPU:
                self.handles.extend((gpu, part) for part in gpu.partitions)
        self.broken = set(broken)
        self.calls = []

    def _check(self, name):
        self.calls.append(name)
        if name in self.broken:
            raise RuntimeError('AMDSMI_STATUS_NOT_SUPPORTED')

    def amdsmi_init(self):
        self._check('amdsmi_init')

    def amdsmi_shut_down(self):
        self._check('amdsmi_shut_down')

    def amdsmi_get_processor_handles(self):
        self._check('amdsmi_get_processor_handles')
        return list(range(len(self.handles)))

    def amdsmi_get_gpu_device_bdf(self, handle):
        self._check('amdsmi_get_gpu_device_bdf')
        gpu, part = self.handles[handle]
        return '%04x:%02x:%02x.%x' % (gpu.address.domain, gpu.address.bus,
                                      gpu.address.device, part.index)

    def amdsmi_get_gpu_asic_info(self, handle):
        self._check('amdsmi_get_gpu_asic_info')
        gpu, part = self.handles[handle]
        return {'market_name': gpu.model.product_name,
                'vendor_id': '0x1002', 'subvendor_id': '0x1002',
                'device_id': hex(gpu.device_id), 'rev_id': '0x00',
                'asic_serial': '0x' + part.unique_id.upper(),
                'oam_id': 0, 'num_compute_units': part.compute_units,
                'target_graphics_version': gpu.model.gfx}

    def amdsmi_get_gpu_vram_info(self, handle):
        self._check('amdsmi_get_gpu_vram_info')
        _gpu, part = self.handles[handle]
        return {'vram_type': 'HBM3', 'vram_size': part.vram_mib,
                'vram_bit_width': 8192}

    def amdsmi_get_gpu_compute_partition(self, handle):
        self._check('amdsmi_get_gpu_compute_partition')
        return self.handles[handle][0].compute_partition

    def amdsmi_get_gpu_memory_partition(self, handle):
        self._check('amdsmi_get_gpu_memory_partition')
        return self.handles[handle][0].memory_partition

    def amdsmi_get_gpu_virtualization_mode(self, handle):
        self._check('amdsmi_get_gpu_virtualization_mode')
        return {'mode': amdsmi.VIRT_BAREMETAL}

    def amdsmi_get_gpu_kfd_info(self, handle):
        self._check('amdsmi_get_gpu_kfd_info')
        _gpu, part = self.handles[handle]
        return {'kfd_id': 12345, 'node_id': part.kfd_node,
                'current_partition_id': part.index}

    def amdsmi_get_gpu_enumeration_info(self, handle):
        self._check('amdsmi_get_gpu_enumeration_info')
        _gpu, part = self.handles[handle]
        return {'drm_render': part.render_minor, 'drm_card': part.card_minor,
                'hsa_id': part.kfd_node, 'hip_id': handle}


def _comparable(gpu):
    """What amdsmi can tell about a GPU (no NUMA, IOMMU, SR-IOV)."""
    return (gpu.address, gpu.device_id, gpu.model, gpu.driver,
            gpu.compute_partition, gpu.memory_partition, gpu.compute_units,
            gpu.unique_id, gpu.product_name, gpu.partitions)


class TestAmdSmiInventory(testtools.TestCase):

    def scan(self, lib):
        return amdsmi.AmdSmiInventory(inv_fixtures.test_conf(), lib,
                                      'h').scan()

    def test_maps_every_bare_metal_kind(self):
        for kind in ('mi300x-spx', 'mi300x-cpx-nps4', 'mi300a-tpx',
                     'mi355x-dpx-nps2', 'mi308x-cpx-nps4', 'mi210-spx'):
            expected = simulate.design_host(simulate.KINDS[kind])
            lib = FakeAmdSmi(expected)
            found = self.scan(lib)
            self.assertEqual([_comparable(g) for g in expected.gpus],
                             [_comparable(g) for g in found.gpus], kind)
            self.assertEqual('amdsmi_shut_down', lib.calls[-1])

    def test_63_partitions_warns(self):
        expected = simulate.design_host(simulate.KINDS['mi300x-cpx'])
        found = self.scan(FakeAmdSmi(expected))
        self.assertEqual(63, found.partition_count)
        self.assertEqual(1, len(found.warnings))
        self.assertIn('0000:e5:00.0: CPX implies 8 partitions',
                      found.warnings[0].message)

    def test_failing_call_is_a_warning(self):
        expected = simulate.design_host(simulate.HostSpec('h', gpus=1))
        found = self.scan(FakeAmdSmi(
            expected, broken={'amdsmi_get_gpu_memory_partition'}))
        self.assertIsNone(found.gpus[0].memory_partition)
        self.assertEqual('SPX', found.gpus[0].compute_partition)
        self.assertEqual(
            'amdsmi.amdsmi_get_gpu_memory_partition(0000:05:00.0)',
            found.warnings[0].culprit)
        self.assertIn('NOT_SUPPORTED', found.warnings[0].message)

    def test_init_failure(self):
        lib = FakeAmdSmi(simulate.design_host(simulate.HostSpec('h')),
                         broken={'amdsmi_init'})
        err = self.assertRaises(exception.AmdSmiUnavailable, self.scan, lib)
        self.assertIn('amdsmi_init failed', str(err))

    def test_no_handles(self):
        lib = FakeAmdSmi(simulate.design_host(simulate.HostSpec(
            'h', mode='gim-cpx')))
        err = self.assertRaises(exception.NothingReadable, self.scan, lib)
        self.assertIn('0 processor handle', str(err))
        self.assertEqual('amdsmi_shut_down', lib.calls[-1])

    def test_handles_call_fails(self):
        lib = FakeAmdSmi(simulate.design_host(simulate.HostSpec('h')),
                         broken={'amdsmi_get_processor_handles'})
        err = self.assertRaises(exception.NothingReadable, self.scan, lib)
        self.assertIn('amdsmi_get_processor_handles failed', str(err))

    def test_missing_library_says_what_is_missing(self):
        def import_module(name, *args):
            # what importing amdsmi does without libamd_smi.so; every
            # other import (the configuration's own) works as usual
            if name == 'amdsmi':
                raise KeyError('libamd_smi.so')
            return real_import(name, *args)
        self.useFixture(fixtures.MonkeyPatch(
            'importlib.import_module', import_module))
        err = self.assertRaises(exception.AmdSmiUnavailable,
                                amdsmi.AmdSmiInventory(
                                    inv_fixtures.test_conf()).scan)
        self.assertIn('KeyError', str(err))
        self.assertIn('libamd_smi.so', str(err))
        self.assertIn('[inventory] driver = sysfs', str(err))

    def test_package_not_installed(self):
        def import_module(name, *args):
            if name == 'amdsmi':
                raise ImportError("No module named 'amdsmi'")
            return real_import(name, *args)
        self.useFixture(fixtures.MonkeyPatch(
            'importlib.import_module', import_module))
        err = self.assertRaises(exception.AmdSmiUnavailable,
                                amdsmi.import_amdsmi)
        self.assertIn('not installed', str(err))


class TestValueHelpers(testtools.TestCase):

    def test_number(self):
        self.assertEqual(0x74a1, amdsmi._number('0x74a1'))
        self.assertEqual(12, amdsmi._number(12))
        for unknown in ('N/A', 0xffffffff, -1, None, True, 1.5):
            self.assertIsNone(amdsmi._number(unknown))

    def test_mode(self):
        self.assertEqual('CPX', amdsmi._mode('CPX', ('CPX',)))
        self.assertIsNone(amdsmi._mode('N/A', ('CPX',)))

    def test_gfx_version(self):
        self.assertEqual(90402, amdsmi._gfx_version('gfx942'))
        self.assertEqual(90010, amdsmi._gfx_version('gfx90a'))
        self.assertEqual(110000, amdsmi._gfx_version('gfx1100'))
        self.assertIsNone(amdsmi._gfx_version('gfx'))


class TestGfxMismatch(testtools.TestCase):

    def test_reported_gfx_differs_from_catalog(self):
        expected = simulate.design_host(simulate.HostSpec('h', gpus=1))

        class Odd(FakeAmdSmi):
            def amdsmi_get_gpu_asic_info(self, handle):
                info = super().amdsmi_get_gpu_asic_info(handle)
                return dict(info, target_graphics_version='gfx950')

        found = amdsmi.AmdSmiInventory(inv_fixtures.test_conf(),
                                       Odd(expected), 'h').scan()
        self.assertIn("'gfx950' differs from MI300X's 90402",
                      found.warnings[0].message)
