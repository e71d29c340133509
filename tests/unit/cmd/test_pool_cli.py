"""``amdgpu-virt apply``, ``audit`` and ``move`` without a cloud.

Rendering runs on the embedded sample fleet; the commands that need
Placement and the Kubernetes API are tested in tests/functional/pool.
"""

import io
import os
import shutil

import fixtures
import testtools

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt import ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.cmd import move as cmd_move
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import sources
from amdgpu_virt.model import Driver
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role


def run_cli(*argv):
    app = av_main.AmdgpuVirtApp()
    app.stdout = io.StringIO()
    app.stderr = io.StringIO()
    rc = app.run(list(argv))
    return rc, app.stdout.getvalue(), app.stderr.getvalue()


class TestApplyCommand(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.ledger = os.path.join(self.tmp, 'ledger.yaml')
        rc, _o, _e = run_cli('plan', '--output-ledger', self.ledger)
        self.assertEqual(0, rc)
        self.out = os.path.join(self.tmp, 'out')

    def apply(self, *extra):
        return run_cli('apply', '--ledger', self.ledger, '--output-dir',
                       self.out, *extra)

    def test_dry_run_then_apply_then_nothing_to_do(self):
        rc, stdout, stderr = self.apply('--dry-run')
        self.assertEqual(0, rc, stderr)
        self.assertIn('+++ b/gim-0/nova/nova.conf.d/amdgpu-virt-pci.conf',
                      stdout)
        self.assertIn('would write', stdout)
        self.assertIn('rendered 5/5 hosts', stderr)
        self.assertFalse(os.path.exists(self.out))
        rc, stdout, _e = self.apply()
        self.assertEqual(0, rc)
        self.assertIn('file(s) written', stdout)
        self.assertTrue(os.path.exists(os.path.join(
            self.out, 'gim-0/host/etc/gim_config')))
        self.assertTrue(os.path.exists(os.path.join(
            self.out, 'ledger-configmap.yaml')))
        rc, stdout, _e = self.apply()
        self.assertEqual(0, rc)
        self.assertIn('0 file(s) written', stdout)
        self.assertIn('(nothing to do)', stdout)

    def test_progress_every_n_hosts(self):
        rc, _o, stderr = self.apply('--dry-run', '--progress-every', '2')
        self.assertEqual(0, rc)
        self.assertEqual(['rendered 2/5 hosts', 'rendered 4/5 hosts',
                          'rendered 5/5 hosts'], stderr.splitlines())
        rc, _o, stderr = self.apply('--dry-run', '--progress-every', '0')
        self.assertEqual('', stderr)

    def test_a_host_losing_its_nova_roles_loses_its_files(self):
        self.apply()
        old = ledger.load(self.ledger)
        items = [a if a.host != 'gim-0' else ledger.GpuAssignment(
            a.host, a.address, Role.IDLE, a.model)
            for a in old.assignments]
        ledger.save(ledger.build(items), self.ledger)
        rc, stdout, _e = self.apply('--host', 'gim-0')
        self.assertEqual(0, rc)
        self.assertIn('removed %s' % os.path.join(
            self.out, 'gim-0/host/etc/gim_config'), stdout)
        self.assertTrue(os.path.exists(os.path.join(
            self.out, 'bm-0/k8s/dra-resourceslices.yaml')))

    def test_unknown_host_and_bad_ledger_are_named(self):
        rc, _o, stderr = self.apply('--host', 'nowhere')
        self.assertEqual(65, rc)
        self.assertIn('no host nowhere in the ledger', stderr)
        data = yamlutil.load_file(self.ledger)
        data['hosts']['extra-host'] = {'gpus': [{
            'address': '0000:05:00.0', 'model': 'MI250X', 'role': 'nova-vf',
            'vf_count': 1}]}
        with open(self.ledger, 'w') as handle:
            handle.write(yamlutil.dump(data))
        rc, _o, stderr = self.apply()
        self.assertEqual(65, rc)
        self.assertIn('hosts.extra-host.gpus[0]', stderr)


class TestMoveArguments(testtools.TestCase):

    def test_parse_gpu(self):
        self.assertEqual(('gim-0', '0000:05:00.0'),
                         cmd_move.parse_gpu('gim-0:0000:05:00.0'))
        err = self.assertRaises(exception.UsageError, cmd_move.parse_gpu,
                                'gim-0')
        self.assertIn('--gpu gim-0', str(err))

    def test_target_is_validated_as_a_ledger_entry(self):
        old = ledger.GpuAssignment('h', PciAddress.parse('0000:05:00.0'),
                                   Role.K8S_SHARED, 'MI300X')
        args = type('Args', (), dict(to='nova-vf', vf_count=None,
                                     compute_mode=None, memory_mode=None))
        err = self.assertRaises(exception.PlanError, cmd_move.target, old,
                                args, 'l')
        self.assertIn('vf_count', str(err))
        self.assertIn('--to nova-vf', str(err))
        args.vf_count = 8
        self.assertEqual(8, cmd_move.target(old, args, 'l').vf_count)

    def test_move_of_a_gpu_not_in_the_ledger(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'l.yaml')
        ledger.save(ledger.build([ledger.GpuAssignment(
            'gim-1', PciAddress.parse('0000:05:00.0'), Role.IDLE,
            'MI300X')]), path)
        rc, _o, stderr = run_cli('move', '--ledger', path, '--gpu',
                                 'gim-0:0000:05:00.0', '--to', 'idle',
                                 '--state-dir', tmp)
        self.assertEqual(65, rc)
        self.assertIn('no GPU gim-0:0000:05:00.0 in the ledger', stderr)

    def test_audit_needs_a_side(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'l.yaml')
        ledger.save(ledger.build([]), path)
        rc, _o, stderr = run_cli('audit', '--ledger', path, '--no-nova',
                                 '--no-k8s')
        self.assertEqual(64, rc)
        self.assertIn('at least one side', stderr)


class TestLiveHost(testtools.TestCase):
    """``move --live`` / ``--sysfs-root``: the host read through the
    inventory driver, again at each call (a simulated sysfs tree stands
    in for the host's /sys, which has no AMD GPU here)."""

    def setUp(self):
        super().setUp()
        self.root = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                 'sys')
        self.write('gim-spx')
        self.conf = conf_pkg.new_conf()
        self.source = sources.Source()

    def write(self, mode):
        shutil.rmtree(self.root, ignore_errors=True)
        simulate.simulate_host(simulate.HostSpec('h1', gpus=1, mode=mode),
                               self.root)

    def test_live_uses_the_inventory_options_and_scans_again(self):
        self.conf.set_override('sysfs_root', self.root, 'inventory')
        self.conf.set_override('hostname', 'h1', 'inventory')
        inventories = sources.Inventories(
            self.source, sources.LiveHost(self.conf, 'h1'))
        self.assertEqual(Driver.GIM, inventories.of('h1').gpus[0].driver)
        self.write('spx')
        self.assertEqual(Driver.AMDGPU,
                         inventories.all(['h1'])['h1'].gpus[0].driver)

    def test_sysfs_root_reads_the_tree_as_the_gpus_host(self):
        live = sources.LiveHost(self.conf, 'h1', self.root)
        self.assertEqual('h1', live.scan().hostname)

    def test_another_host_is_refused(self):
        self.conf.set_override('hostname', 'h2', 'inventory')
        live = sources.LiveHost(self.conf, 'h1', self.root)
        err = self.assertRaises(exception.InventoryError, live.scan)
        self.assertIn('sysfs tree %s' % self.root, str(err))
        self.assertIn('reads host h2, not h1', str(err))

    def test_live_and_sysfs_root_exclude_each_other(self):
        stderr = self.useFixture(fixtures.StringStream('stderr')).stream
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', stderr))
        rc, _o, _e = run_cli('move', '--ledger', 'x.yaml', '--gpu',
                             'h1:0000:05:00.0', '--to', 'idle', '--live',
                             '--sysfs-root', self.root)
        self.assertEqual(64, rc)   # EX_USAGE
        stderr.seek(0)
        self.assertIn('--sysfs-root: not allowed with argument --live',
                      stderr.read())


class TestSnapshotDir(testtools.TestCase):

    def test_missing_snapshot_dir_is_named(self):
        missing = os.path.join(self.useFixture(fixtures.TempDir()).path,
                               'nope')
        source = sources.Source(snapshot_dir=missing)
        err = self.assertRaises(exception.FileInputError,
                                sources.Inventories(source).all, ['gim-0'])
        self.assertIn('--snapshot-dir %s' % missing, str(err))
        self.assertIn('no such directory', str(err))
