"""``amdgpu-virt inventory`` and ``simulate-host``, in-process and as a
console script."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import fixtures
import testtools
import yaml

from amdgpu_virt.cmd import main
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import snapshot
from tests.unit.inventory import fixtures as inv_fixtures


class CliTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.logger = self.useFixture(fixtures.FakeLogger())
        self.tmp = self.useFixture(fixtures.TempDir(
            rootdir=inv_fixtures.temp_root())).path

    def run_cli(self, *argv):
        stdout, stderr = io.StringIO(), io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stdout', stdout))
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', stderr))
        status = main.main(list(argv))
        return status, stdout.getvalue(), stderr.getvalue()

    def simulate(self, *extra):
        out = os.path.join(self.tmp, 'host')
        status, stdout, _err = self.run_cli(
            'simulate-host', '--out', out, *extra)
        self.assertEqual(0, status, self.logger.output)
        return out, stdout


class TestSimulateHost(CliTestCase):

    def test_writes_a_tree_the_inventory_reads(self):
        out, stdout = self.simulate('--model', 'mi300x', '--gpus', '2',
                                    '--mode', 'gim-cpx',
                                    '--hostname', 'gim-9')
        self.assertIn('2 x MI300X, 0 partitions, 16 VFs', stdout)
        expected = simulate.design_host(simulate.HostSpec(
            'gim-9', gpus=2, mode='gim-cpx'))
        self.assertEqual(expected.gpus,
                         inv_fixtures.SimulatedHost.scan_root(out).gpus)

    def test_gpu_counts_out_of_range_are_usage_errors(self):
        out = os.path.join(self.tmp, 'host')
        for count in ('99999999999', '0', '17', 'many'):
            status, _stdout, stderr = self.run_cli(
                'simulate-host', '--out', out, '--gpus', count)
            self.assertEqual(64, status, stderr)
            self.assertIn('argument --gpus', stderr)
        self.assertFalse(os.path.exists(out))

    def test_hardware_the_catalog_lacks_is_refused(self):
        out = os.path.join(self.tmp, 'host')
        for model, mode in (('MI300X', 'gim-qpx'), ('MI300X', 'gim-dpx'),
                            ('MI210', 'gim-cpx'), ('MI325X', 'gim-cpx')):
            status, _stdout, _err = self.run_cli(
                'simulate-host', '--out', out, '--model', model,
                '--mode', mode)
            self.assertEqual(65, status, (model, mode))
            self.assertIn('%s does not support VF count' % model,
                          self.logger.output)
            self.assertFalse(os.path.exists(out))
        self.simulate('--model', 'MI355X', '--mode', 'gim-dpx')

    def test_a_fleet_with_an_impossible_host_writes_nothing(self):
        fleet = os.path.join(self.tmp, 'fleet.yaml')
        with open(fleet, 'w') as handle:
            handle.write('hosts:\n  - {hostname: a, gpus: 1}\n'
                         '  - {hostname: b, mode: gim-qpx}\n')
        out = os.path.join(self.tmp, 'fleet')
        status, _stdout, _err = self.run_cli(
            'simulate-host', '--out', out, '--fleet', fleet)
        self.assertEqual(65, status)
        self.assertIn('host b: mode gim-qpx', self.logger.output)
        self.assertFalse(os.path.exists(out))

    def test_gpu_modes_and_nps(self):
        out, stdout = self.simulate('--gpu-modes', 'cpx,gim-cpx,qpx',
                                    '--nps', 'nps4')
        self.assertIn('3 x MI300X, 12 partitions, 8 VFs', stdout)
        expected = simulate.design_host(simulate.HostSpec(
            'simulated-host', gpus=3, nps='nps4',
            gpu_modes=('cpx', 'gim-cpx', 'qpx')))
        self.assertEqual(expected.gpus,
                         inv_fixtures.SimulatedHost.scan_root(out).gpus)

    def test_legacy_xcp_names(self):
        out, _stdout = self.simulate('--gpus', '1', '--legacy-xcp-names')
        self.assertTrue(os.path.isdir(os.path.join(
            out, 'devices/platform/amdgpu_xcp.6')))

    def test_refuses_a_non_empty_directory_unless_forced(self):
        out, _stdout = self.simulate('--gpus', '1', '--mode', 'cpx')
        status, _out, _err = self.run_cli('simulate-host', '--out', out,
                                          '--gpus', '1')
        self.assertEqual(65, status)
        self.assertIn('is not empty; use --force', self.logger.output)
        with open(os.path.join(out, 'keep.txt'), 'w') as handle:
            handle.write('mine')
        status, _out, _err = self.run_cli(
            'simulate-host', '--out', out, '--gpus', '1', '--mode',
            'gim-spx', '--force')
        self.assertEqual(0, status)
        found = inv_fixtures.SimulatedHost.scan_root(out)
        self.assertEqual(1, found.vf_count)
        self.assertEqual(0, found.partition_count)
        self.assertTrue(os.path.exists(os.path.join(out, 'keep.txt')))

    def test_impossible_spec(self):
        status, _out, _err = self.run_cli(
            'simulate-host', '--out', os.path.join(self.tmp, 'x'),
            '--model', 'MI250X', '--mode', 'gim-cpx')
        self.assertEqual(65, status)
        self.assertIn('MI250X has no SR-IOV VFs', self.logger.output)
        status, _out, _err = self.run_cli(
            'simulate-host', '--out', os.path.join(self.tmp, 'x'),
            '--model', 'MI999')
        self.assertEqual(65, status)
        self.assertIn("Unknown GPU model 'MI999'", self.logger.output)


class TestInventory(CliTestCase):

    def test_table(self):
        out, _stdout = self.simulate('--gpu-modes', 'gim-cpx,spx,cpx,vfio')
        status, stdout, stderr = self.run_cli('inventory', '--sysfs-root',
                                              out)
        self.assertEqual(0, status)
        self.assertEqual('', stderr)
        lines = [line for line in stdout.splitlines() if '0000:' in line]
        self.assertEqual(4, len(lines))
        self.assertIn('CPX (8 VFs)', lines[0])
        self.assertIn('38 per VF', lines[0])
        self.assertIn('SPX/NPS1', lines[1])
        self.assertIn('304', lines[1])
        self.assertIn('passthrough', lines[3])

    def test_json_is_the_full_snapshot_and_round_trips(self):
        out, _stdout = self.simulate('--mode', 'cpx')
        status, stdout, stderr = self.run_cli(
            'inventory', '--sysfs-root', out, '--hostname', 'bm-7',
            '-f', 'json')
        self.assertEqual(0, status)
        self.assertIn('warning: %s' % out, stderr)
        self.assertIn('CPX implies 8 partitions but KFD shows 7', stderr)
        document = json.loads(stdout)
        self.assertEqual('HostInventory', document['kind'])
        self.assertEqual('bm-7', document['hostname'])
        scanned = snapshot.from_document(document, 'stdout')
        self.assertEqual(63, scanned.partition_count)
        path = os.path.join(self.tmp, 'bm-7.json')
        with open(path, 'w') as handle:
            handle.write(stdout)
        status, again, _err = self.run_cli(
            'inventory', '--driver', 'snapshot', '--snapshot', path,
            '-f', 'json')
        self.assertEqual(0, status)
        self.assertEqual(scanned, snapshot.loads(again, 'again'))

    def test_yaml_document(self):
        out, _stdout = self.simulate('--gpus', '1', '--mode', 'gim-dpx',
                                      '--model', 'MI355X')
        status, stdout, _err = self.run_cli(
            'inventory', '--sysfs-root', out, '-f', 'yaml')
        self.assertEqual(0, status)
        self.assertEqual(2, len(yaml.safe_load(stdout)['gpus'][0]['vfs']))

    def test_csv_keeps_the_rows(self):
        out, _stdout = self.simulate('--gpus', '2')
        status, stdout, _err = self.run_cli(
            'inventory', '--sysfs-root', out, '-f', 'csv')
        self.assertEqual(0, status)
        self.assertEqual(3, len(stdout.strip().splitlines()))

    def test_nothing_readable_exits_non_zero(self):
        status, stdout, _err = self.run_cli(
            'inventory', '--sysfs-root', os.path.join(self.tmp, 'none'))
        self.assertEqual(66, status)   # EX_NOINPUT
        self.assertEqual('', stdout)
        self.assertIn('No AMD GPU could be read', self.logger.output)

    def test_unknown_driver(self):
        status, _stdout, stderr = self.run_cli_exit(
            'inventory', '--driver', 'nvml')
        self.assertNotEqual(0, status)
        self.assertIn('nvml', stderr)

    def run_cli_exit(self, *argv):
        try:
            return self.run_cli(*argv)
        except SystemExit as err:
            return err.code, '', sys.stderr.getvalue()


class TestConsoleScript(CliTestCase):
    """Once through the installed ``amdgpu-virt`` script."""

    def test_simulate_then_inventory(self):
        script = os.path.join(os.path.dirname(sys.executable), 'amdgpu-virt')
        if not os.path.exists(script):
            self.skipTest('amdgpu-virt is not installed next to %s'
                          % sys.executable)
        out, _stdout = self.simulate('--gpus', '2', '--mode', 'gim-cpx')
        done = subprocess.run(
            [script, 'inventory', '--sysfs-root', out, '-f', 'json'],
            check=True, capture_output=True, text=True)
        self.assertEqual(16, snapshot.loads(done.stdout, 'script').vf_count)
        self.assertEqual('', done.stderr)


class TestSimulateFleet(CliTestCase):

    def test_sample_fleet(self):
        out = os.path.join(self.tmp, 'fleet')
        status, stdout, _err = self.run_cli('simulate-host', '--fleet',
                                            'sample', '--out', out)
        self.assertEqual(0, status, self.logger.output)
        self.assertEqual(5, stdout.count('Wrote '))
        self.assertEqual(['bm-0', 'bm-1', 'gim-0', 'gim-1', 'mi210-0'],
                         sorted(os.listdir(out)))
        found = inv_fixtures.SimulatedHost.scan_root(
            os.path.join(out, 'bm-1'))
        self.assertEqual(63, found.partition_count)
        status, _out, _err = self.run_cli('simulate-host', '--fleet',
                                          'sample', '--out', out)
        self.assertEqual(65, status)
        status, _out, _err = self.run_cli('simulate-host', '--fleet',
                                          'sample', '--out', out, '--force')
        self.assertEqual(0, status)

    def test_bad_fleet_file(self):
        path = os.path.join(self.tmp, 'fleet.yaml')
        with open(path, 'w') as handle:
            handle.write('hosts: [{model: MI300X}]\n')
        status, _out, _err = self.run_cli('simulate-host', '--fleet', path,
                                          '--out', os.path.join(self.tmp,
                                                                'x'))
        self.assertEqual(65, status)
        self.assertIn('hosts[0]: hostname is required', self.logger.output)
