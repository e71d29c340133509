"""GIM / vfio-pci host configuration rendering."""

from __future__ import annotations

import testtools

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory.simulate import HostSpec
from amdgpu_virt.inventory.simulate import design_host
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.nova import gim


def _assign(host, bus, role, model='MI300X', **kw):
    return av_ledger.GpuAssignment(host, PciAddress(0, bus, 0, 0), role,
                                   model, **kw)


class TestGim(testtools.TestCase):

    def test_gim_cpx_host(self):
        config = gim.render_host(design_host(HostSpec('c1', mode='gim-cpx')))
        modprobe = config.file(gim.MODPROBE_GIM).content
        self.assertIn('options gim vf_num=8 enabled_devices=0000:05:00.0;'
                      '0000:25:00.0;', modprobe)
        self.assertIn('[unverified]', modprobe)
        self.assertEqual('vf_num=8\nmemory_partition_mode=4\n',
                         config.file(gim.GIM_CONFIG).content)
        self.assertEqual(('iommu=pt', 'amd_iommu=on',
                          'modprobe.blacklist=amdgpu',
                          'vfio-pci.ids=1002:74b5'), config.kernel_args)
        self.assertIn('options vfio-pci ids=1002:74b5',
                      config.file(gim.MODPROBE_VFIO).content)
        self.assertIsNone(config.file(gim.DRIVERCTL_SCRIPT))

    def test_gim_config_has_no_comments(self):
        # GIM truncates its config file at an unknown token
        config = gim.render_host(design_host(HostSpec('c1', mode='gim-spx')))
        for line in config.file(gim.GIM_CONFIG).content.splitlines():
            self.assertRegex(line, r'^[a-z_]+=[0-9,]+$')

    def test_never_touches_sriov_numvfs(self):
        for mode in ('gim-cpx', 'gim-spx', 'vfio'):
            config = gim.render_host(design_host(HostSpec('c', mode=mode)))
            for item in config.files:
                self.assertNotIn('sriov_numvfs', item.content)

    def test_vfio_host_pins_by_address(self):
        config = gim.render_host(design_host(HostSpec('v', gpus=2,
                                                      mode='vfio')))
        script = config.file(gim.DRIVERCTL_SCRIPT)
        self.assertEqual(0o755, script.mode)
        self.assertIn('driverctl --nowait set-override 0000:05:00.0 '
                      'vfio-pci', script.content)
        self.assertIsNone(config.file(gim.MODPROBE_GIM))
        self.assertNotIn('modprobe.blacklist=amdgpu', config.kernel_args)

    def test_mixed_host_keeps_amdgpu(self):
        inventory = design_host(HostSpec('m', gpus=3, gpu_modes=(
            'gim-cpx', 'vfio', 'spx')))
        config = gim.render_host(inventory)
        self.assertNotIn('modprobe.blacklist=amdgpu', config.kernel_args)
        script = config.file(gim.DRIVERCTL_SCRIPT).content
        self.assertIn('set-override 0000:05:00.0 gim', script)
        self.assertIn('set-override 0000:25:00.0 vfio-pci', script)
        self.assertNotIn('0000:45:00.0', script)
        self.assertIn('0000:45:00.0', config.notes[0])

    def test_ledger_targets_next_boot(self):
        inventory = design_host(HostSpec('h', gpus=2, mode='spx'))
        ledger = av_ledger.build([
            _assign('h', 5, Role.NOVA_VF, vf_count=8, memory_mode='NPS1'),
            _assign('h', 0x25, Role.NOVA_VF, vf_count=8,
                    memory_mode='NPS1')])
        config = gim.render_host(inventory, ledger)
        self.assertEqual('vf_num=8\nmemory_partition_mode=1\n',
                         config.file(gim.GIM_CONFIG).content)

    def test_non_uniform_vf_counts_refused(self):
        inventory = design_host(HostSpec('h', gpus=2, mode='spx'))
        ledger = av_ledger.build([
            _assign('h', 5, Role.NOVA_VF, vf_count=8),
            _assign('h', 0x25, Role.NOVA_VF, vf_count=1)])
        err = self.assertRaises(exception.NovaConfigError, gim.render_host,
                                inventory, ledger)
        self.assertIn('0000:05:00.0: 8', str(err))
        self.assertIn('0000:25:00.0: 1', str(err))

    def test_mixed_memory_modes_refused(self):
        inventory = design_host(HostSpec('h', gpus=2, mode='spx'))
        ledger = av_ledger.build([
            _assign('h', 5, Role.NOVA_VF, vf_count=8, memory_mode='NPS1'),
            _assign('h', 0x25, Role.NOVA_VF, vf_count=8,
                    memory_mode='NPS4')])
        err = self.assertRaises(exception.NovaConfigError, gim.render_host,
                                inventory, ledger)
        self.assertIn('whole hive', str(err))

    def test_unsupported_vf_count_refused(self):
        inventory = design_host(HostSpec('h', gpus=1, model='MI325X',
                                         mode='spx'))
        ledger = av_ledger.build([
            av_ledger.GpuAssignment('h', PciAddress(0, 5, 0, 0),
                                    Role.NOVA_VF, 'MI300X', vf_count=8)])
        config = gim.render_host(inventory, ledger)
        self.assertIn('vf_num=8', config.file(gim.GIM_CONFIG).content)
        bad = [gim.GpuTarget(PciAddress(0, 5, 0, 0),
                             design_host(HostSpec('h', gpus=1,
                                                  model='MI325X')).gpus[0]
                             .model, Role.NOVA_VF, 8)]
        err = self.assertRaises(exception.NovaConfigError, gim._uniform,
                                'h', bad)
        self.assertIn('MI325X', str(err))

    def test_k8s_only_host_renders_nothing(self):
        config = gim.render_host(design_host(HostSpec('k', gpus=2)))
        self.assertEqual((), config.files)
        self.assertIn('nothing to render', config.notes[0])

    def test_render_text_is_stable(self):
        inventory = design_host(HostSpec('c1', mode='gim-cpx'))
        self.assertEqual(gim.render_text(gim.render_host(inventory)),
                         gim.render_text(gim.render_host(inventory)))
