"""The host adapter of a move: instructions and inventory checks."""

import os

import fixtures
import testtools

from amdgpu_virt import ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.pool import hostchange
from tests.unit.pool.test_apply import FakeNova

A0 = PciAddress.parse('0000:05:00.0')
A1 = PciAddress.parse('0000:25:00.0')
VF1 = ledger.GpuAssignment('h', A1, Role.NOVA_VF, 'MI300X', vf_count=8)
VF0 = ledger.GpuAssignment('h', A0, Role.NOVA_VF, 'MI300X', vf_count=8)
POD1 = ledger.GpuAssignment('h', A1, Role.K8S_SHARED, 'MI300X',
                            compute_mode='CPX', memory_mode='NPS4')


class TestInventoryHost(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.out = self.useFixture(fixtures.TempDir()).path
        self.inventory = simulate.design_host(simulate.HostSpec(
            'h', gpus=2, mode='gim-cpx'))
        self.host = hostchange.InventoryHost(
            lambda host: self.inventory, ledger.build([VF0, VF1]),
            FakeNova(), self.out)

    def test_instructions_write_the_host_files(self):
        steps = self.host.instructions(VF1, POD1)
        self.assertIn('install the files of %s' % os.path.join(
            self.out, 'h', 'host'), steps[0])
        self.assertTrue(os.path.exists(os.path.join(
            self.out, 'h/host/etc/gim_config')))
        text = '\n'.join(steps)
        self.assertIn('GIM must leave GPU 0000:25:00.0', text)
        self.assertIn('--compute-partition CPX --memory-partition NPS4',
                      text)
        dedicated = ledger.GpuAssignment('h', A1, Role.NOVA_DEDICATED,
                                         'MI300X')
        text = '\n'.join(self.host.instructions(VF1, dedicated))
        self.assertIn('set-override 0000:25:00.0 vfio-pci', text)
        text = '\n'.join(self.host.instructions(dedicated, VF1))
        self.assertIn('unset-override 0000:25:00.0', text)
        self.assertIn('with 8 VFs', text)

    def test_matches_reads_the_inventory_each_time(self):
        self.assertTrue(self.host.matches(VF1))
        self.assertFalse(self.host.matches(POD1))
        self.inventory = simulate.design_host(simulate.HostSpec(
            'h', gpus=2, gpu_modes=('gim-cpx', 'cpx'), nps='nps4'))
        self.assertTrue(self.host.matches(POD1))
        gone = ledger.GpuAssignment('h', PciAddress.parse('0000:99:00.0'),
                                    Role.IDLE, 'MI300X')
        self.assertFalse(self.host.matches(gone))
