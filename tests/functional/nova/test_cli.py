"""The ``amdgpu-virt nova`` commands end to end.

Inventories come from simulated sysfs trees read by the sysfs driver;
Placement is the real server of the fixture.
"""

from __future__ import annotations

import dataclasses
import io
import os
import tempfile
import uuid

import testtools

from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.naming import Naming
from tests.functional.fixtures import placement as placement_fixture


class CliTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture_tmp()

    def useFixture_tmp(self) -> str:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        return tmp.name

    def run_cli(self, *argv: str) -> tuple[int, str, str]:
        app = av_main.AmdgpuVirtApp()
        app.stdout = io.StringIO()
        app.stderr = io.StringIO()
        rc = app.run(list(argv))
        return rc, app.stdout.getvalue(), app.stderr.getvalue()

    def tree(self, spec: simulate.HostSpec) -> str:
        root = os.path.join(self.tmp, 'sys-%s' % spec.hostname)
        simulate.write_tree(simulate.design_host(spec), root)
        return root


class TestConfigCommands(CliTestCase):

    def test_config_from_sysfs_is_written_once(self):
        root = self.tree(simulate.HostSpec('c1', mode='gim-cpx'))
        out = os.path.join(self.tmp, 'nova.conf.d', 'amdgpu-virt-pci.conf')
        args = ('nova', 'config', '--sysfs-root', root, '--hostname', 'c1',
                '--output', out)
        rc, _stdout, stderr = self.run_cli(*args)
        self.assertEqual(0, rc)
        self.assertIn('wrote', stderr)
        with open(out) as handle:
            text = handle.read()
        self.assertEqual(8, text.count('device_spec = '))
        mtime = os.stat(out).st_mtime_ns
        rc, _stdout, stderr = self.run_cli(*args)
        self.assertEqual((0, 'unchanged %s\n' % out), (rc, stderr))
        self.assertEqual(mtime, os.stat(out).st_mtime_ns)

    def test_gim_config_files(self):
        root = self.tree(simulate.HostSpec('c2', gpus=2, mode='gim-cpx'))
        out = os.path.join(self.tmp, 'etc-root')
        rc, _o, _e = self.run_cli('nova', 'gim-config', '--sysfs-root', root,
                                  '--hostname', 'c2', '--output-dir', out)
        self.assertEqual(0, rc)
        with open(os.path.join(out, 'etc/gim_config')) as handle:
            self.assertEqual('vf_num=8\nmemory_partition_mode=4\n',
                             handle.read())

    def test_aliases_from_ledger(self):
        path = os.path.join(self.tmp, 'ledger.yaml')
        with open(path, 'w') as handle:
            handle.write(av_ledger.build([av_ledger.GpuAssignment(
                'h', PciAddress(0, 5, 0, 0), Role.NOVA_DEDICATED,
                'MI300X')]).dumps())
        rc, stdout, _e = self.run_cli('nova', 'aliases', '--ledger', path)
        self.assertEqual(0, rc)
        self.assertIn('"name":"amd-mi300x"', stdout)


class TestPlacementCommands(CliTestCase):

    def setUp(self):
        super().setUp()
        server = placement_fixture.get_server()
        self.seeder = placement_fixture.NovaLikeSeeder(server.connection())
        self.conf_file = os.path.join(self.tmp, 'amdgpu-virt.conf')
        with open(self.conf_file, 'w') as handle:
            handle.write('[nova]\nplacement_endpoint = %s\ntoken = admin\n'
                         % server.url)

    def test_audit_exit_status(self):
        host = 'cli-%s' % uuid.uuid4().hex[:8]
        items = [av_ledger.GpuAssignment(host, PciAddress(0, b, 0, 0),
                                         Role.NOVA_VF, 'MI300X', vf_count=8)
                 for b in (5, 0x25)]
        ledger = av_ledger.build(items)
        path = os.path.join(self.tmp, 'ledger.yaml')
        with open(path, 'w') as handle:
            handle.write(ledger.dumps())
        (plan,) = nova_plan.plan_from_ledger(ledger, Naming())
        ids = self.seeder.seed_offers(host, plan.offers[:1])
        args = ('--config-file', self.conf_file, 'nova', 'audit',
                '--ledger', path, '-f', 'value')
        rc, stdout, stderr = self.run_cli(*args)
        self.assertEqual(1, rc)
        self.assertIn('missing-provider', stdout)
        self.assertIn('%s_0000:25:00.0' % host, stdout)
        self.seeder.pci_device(ids[host], host, '0000:25:00.0',
                               plan.offers[1].resource_class, 8,
                               plan.offers[1].traits)
        rc, stdout, stderr = self.run_cli(*args)
        self.assertEqual((0, ''), (rc, stdout))
        self.assertIn('0 finding(s)', stderr)

    def test_audit_flags_alias_type_the_host_contradicts(self):
        # The controller's aliases come from the ledger (model: SR-IOV,
        # type-PF); this host has SR-IOV off, so Nova reports type-PCI.
        host = 'cli-%s' % uuid.uuid4().hex[:8]
        designed = simulate.design_host(simulate.HostSpec(host, gpus=1,
                                                          mode='vfio'))
        gpu = dataclasses.replace(designed.gpus[0], sriov_totalvfs=None,
                                  sriov_numvfs=None)
        root = os.path.join(self.tmp, 'sys')
        simulate.write_tree(dataclasses.replace(designed, gpus=(gpu,)),
                            root)
        ledger = av_ledger.build([av_ledger.GpuAssignment(
            host, gpu.address, Role.NOVA_DEDICATED, 'MI300X')])
        path = os.path.join(self.tmp, 'ledger.yaml')
        with open(path, 'w') as handle:
            handle.write(ledger.dumps())
        (plan,) = nova_plan.plan_from_ledger(ledger, Naming())
        self.seeder.seed_offers(host, plan.offers)
        base = ('--config-file', self.conf_file, 'nova', 'audit',
                '--ledger', path, '-f', 'csv')
        rc, stdout, _stderr = self.run_cli(*base)
        self.assertEqual((0, '"Host","Provider","Finding","Expected",'
                          '"Actual"\n'), (rc, stdout))
        rc, stdout, _stderr = self.run_cli(*base, '--sysfs-root', root,
                                           '--hostname', host)
        self.assertEqual(1, rc)
        self.assertIn('"%s_0000:05:00.0","wrong-device-type",'
                      '"type-PCI (sriov_totalvfs None)",'
                      '"type-PF (alias amd-mi300x)"' % host, stdout)

    def test_drain_check_exit_status(self):
        host = 'cli-%s' % uuid.uuid4().hex[:8]
        root = self.seeder.compute_node(host)
        rp = self.seeder.pci_device(root, host, '0000:05:00.0',
                                    'CUSTOM_AMD_MI300X', 1,
                                    ['CUSTOM_AMD_MODEL_MI300X'])
        consumer = str(uuid.uuid4())
        self.seeder.allocate(consumer, rp, {'CUSTOM_AMD_MI300X': 1})
        args = ('--config-file', self.conf_file, 'nova', 'drain-check',
                '--gpu', '0000:05:00.0', '--host', host)
        rc, stdout, stderr = self.run_cli(*args)
        self.assertEqual(1, rc)
        self.assertIn('0000:05:00.0', stderr)
        self.assertIn(consumer, stderr)
        self.assertIn('%s_0000:05:00.0' % host, stderr)
        self.seeder._call('DELETE', '/allocations/%s' % consumer)
        rc, stdout, stderr = self.run_cli(*args)
        self.assertEqual(0, rc)
        self.assertIn('Reboot', stdout)


class TestFlavorsRefusals(CliTestCase):
    """``nova flavors`` refuses before any request is made."""

    def flavors_file(self, **extra) -> str:
        path = os.path.join(self.tmp, 'flavors.yaml')
        entry = {'name': 'gpu.x', 'vcpus': 8, 'ram_mib': 1024,
                 'alias': 'amd-mi300x-cpx-vf', 'count': 8}
        entry.update(extra)
        with open(path, 'w') as handle:
            handle.write(yamlutil.dump({'flavors': [entry]}))
        return path

    def test_zero_disk_refused_unless_allowed(self):
        conf = os.path.join(self.tmp, 'a.conf')
        with open(conf, 'w') as handle:
            # nothing listens here: an allowed flavor gets as far as Nova
            handle.write('[nova]\ncompute_endpoint = http://127.0.0.1:9\n'
                         'token = admin\n')
        path = self.flavors_file()
        rc, _out, err = self.run_cli('--config-file', conf, 'nova',
                                     'flavors', '--file', path)
        self.assertEqual(78, rc)
        self.assertIn('os_compute_api:servers:create:zero_disk_flavor', err)
        rc, _out, err = self.run_cli('--config-file', conf, 'nova',
                                     'flavors', '--file', path,
                                     '--allow-zero-disk')
        self.assertIn('warning: flavor gpu.x has disk 0', err)
        self.assertIn('Nova compute', err)        # then it tried Nova

    def test_gpus_refused_without_per_gpu_traits(self):
        conf = os.path.join(self.tmp, 'b.conf')
        with open(conf, 'w') as handle:
            handle.write('[nova]\nper_gpu_traits = False\n')
        rc, _out, err = self.run_cli(
            '--config-file', conf, 'nova', 'flavors', '--file',
            self.flavors_file(disk_gb=40, gpus=8))
        self.assertEqual(78, rc)
        self.assertIn('[nova] per_gpu_traits', err)
        self.assertIn('gpu.x', err)
