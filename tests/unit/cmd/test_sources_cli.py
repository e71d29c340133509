"""Where inventories come from, as the fleet commands see it.

The hosts are simulated: ``simulate-host --fleet`` writes each host's
sysfs tree and ``inventory -f json`` reads it back into a snapshot, as an
operator runs it on each host.
"""

from __future__ import annotations

import json
import os

from amdgpu_virt.inventory import fleet
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import snapshot
from tests.unit.cmd import test_inventory_cli as base


class TestPlanFromSnapshots(base.CliTestCase):

    def snapshots(self, fleet_file=None):
        trees = os.path.join(self.tmp, 'trees')
        status, _out, _err = self.run_cli(
            'simulate-host', '--fleet', fleet_file or 'sample', '--out',
            trees)
        self.assertEqual(0, status, self.logger.output)
        directory = os.path.join(self.tmp, 'snapshots')
        os.makedirs(directory)
        for host in sorted(os.listdir(trees)):
            status, out, _err = self.run_cli(
                'inventory', '--sysfs-root', os.path.join(trees, host),
                '--hostname', host, '-f', 'json')
            self.assertEqual(0, status, self.logger.output)
            with open(os.path.join(directory, host + '.json'), 'w') as f:
                f.write(out)
        return directory

    def plan(self, *args):
        status, out, _err = self.run_cli('plan', '-f', 'json', *args)
        self.assertEqual(0, status, self.logger.output)
        return json.loads(out)

    def test_same_plan_as_from_the_fleet_file(self):
        directory = self.snapshots()
        self.assertEqual(len(fleet.load_specs()), len(os.listdir(directory)))
        from_fleet = self.plan()
        from_snapshots = self.plan('--snapshot-dir', directory)
        # the snapshots carry what the inventory found odd; the plan
        # tells it (the simulated fleet file has nothing to tell)
        (warning,) = from_snapshots.pop('warnings')
        self.assertIn('inventory of host bm-1', warning)
        self.assertIn('CPX implies 8 partitions but KFD shows 7', warning)
        self.assertNotIn('warnings', from_fleet)
        # the directory lists hosts by name, the fleet file in its order
        for result in (from_fleet, from_snapshots):
            result['gpus'].sort(key=lambda g: (g['host'], g['address']))
        self.assertEqual(from_fleet, from_snapshots)
        self.assertGreater(from_fleet['summary']['placed'], 0)

    def test_plan_tells_the_files_it_skipped(self):
        directory = self.snapshots()
        with open(os.path.join(directory, 'README.txt'), 'w') as f:
            f.write('not a snapshot')
        os.makedirs(os.path.join(directory, 'old.json'))
        status, out, _err = self.run_cli('plan', '--snapshot-dir', directory)
        self.assertEqual(0, status, self.logger.output)
        warnings = out.split('\nWarnings (3)\n', 1)[1].splitlines()
        self.assertEqual([
            '  %s: skipped, not a snapshot (a snapshot is '
            '<host>.json|.yaml|.yml)' % os.path.join(directory, 'README.txt'),
            '  %s: skipped, not a regular file' % os.path.join(directory,
                                                               'old.json')],
            warnings[:2])
        self.assertIn('inventory of host bm-1', warnings[2])
        # one part alone: stdout is the table, the warnings go to stderr
        status, out, err = self.run_cli('plan', '--snapshot-dir', directory,
                                        '--part', 'summary', '-f', 'json')
        self.assertEqual(0, status)
        json.loads(out)
        self.assertIn('warning: %s: skipped' % os.path.join(
            directory, 'README.txt'), err)

    def test_a_bad_snapshot_is_skipped_with_a_warning(self):
        directory = self.snapshots()
        truncated = os.path.join(directory, 'gim-1.json')
        with open(truncated) as f:
            text = f.read()
        with open(truncated, 'w') as f:
            f.write(text[:len(text) // 2])
        other = os.path.join(directory, 'bm-1.json')
        with open(other) as f:
            text = f.read()
        with open(other, 'w') as f:   # a snapshot of another host
            f.write(text.replace('"hostname": "bm-1"',
                                 '"hostname": "bm-9"'))
        result = self.plan('--snapshot-dir', directory)
        hosts = {g['host'] for g in result['gpus']}
        self.assertEqual({'gim-0', 'bm-0', 'mi210-0'}, hosts)
        skipped = [w for w in result['warnings'] if 'skipped' in w]
        self.assertEqual(2, len(skipped), result['warnings'])
        self.assertIn('%s: skipped, host bm-1 left out: ' % other,
                      skipped[0])
        self.assertIn('it is a snapshot of host bm-9', skipped[0])
        self.assertIn('%s: skipped, host gim-1 left out: Snapshot %s is '
                      'not usable' % (truncated, truncated), skipped[1])
        self.assertGreater(result['summary']['placed'], 0)
        # the table tells it too; a host named on purpose still fails
        status, out, _err = self.run_cli('plan', '--snapshot-dir', directory)
        self.assertEqual(0, status)
        self.assertIn('host gim-1 left out', out.split('Warnings (')[1])
        status, _out, _err = self.run_cli(
            'nova', 'config', '--snapshot-dir', directory, '--host', 'gim-1')
        self.assertEqual(65, status)

    def test_same_explanation_from_snapshots(self):
        directory = self.snapshots()
        status, by_fleet, _e = self.run_cli('explain', 'tenant-vm-1')
        self.assertEqual(0, status)
        status, by_snapshot, _e = self.run_cli(
            'explain', 'tenant-vm-1', '--snapshot-dir', directory)
        self.assertEqual(0, status, self.logger.output)
        self.assertEqual(by_fleet, by_snapshot)

    def test_sysfs_root_replaces_one_host(self):
        directory = self.snapshots()
        tree = os.path.join(self.tmp, 'bm-0-now')
        # the operator re-partitioned bm-0: read it live, the rest from
        # the snapshots
        simulate.simulate_host(simulate.HostSpec('bm-0', mode='cpx',
                                                 nps='nps4'), tree)
        result = self.plan('--snapshot-dir', directory, '--sysfs-root',
                           tree, '--hostname', 'bm-0')
        modes = {g['mode'] for g in result['gpus'] if g['host'] == 'bm-0'
                 and g['role'] != 'idle'}
        self.assertTrue(modes <= {'CPX/NPS4', 'vfio-pci'}, modes)
        self.assertEqual(len(fleet.load_specs()),
                         len({g['host'] for g in result['gpus']}))

    def test_sysfs_root_alone_plans_that_host(self):
        tree = os.path.join(self.tmp, 'one')
        simulate.simulate_host(simulate.HostSpec('solo', gpus=2), tree)
        result = self.plan('--sysfs-root', tree, '--hostname', 'solo')
        self.assertEqual({'solo'}, {g['host'] for g in result['gpus']})

    def test_fleet_and_snapshot_dir_exclude_each_other(self):
        status, _out, err = self.run_cli('plan', '--fleet', 'f.yaml',
                                         '--snapshot-dir', 'd')
        self.assertEqual(64, status)   # EX_USAGE, argparse names both
        self.assertIn('not allowed with argument', err)

    def test_a_snapshot_named_for_another_host_is_refused(self):
        directory = os.path.join(self.tmp, 'snaps')
        os.makedirs(directory)
        inventory = simulate.design_host(simulate.HostSpec('real-name'))
        with open(os.path.join(directory, 'other.json'), 'w') as handle:
            handle.write(snapshot.dumps(inventory))
        status, _out, err = self.run_cli('plan', '--snapshot-dir', directory)
        self.assertEqual(65, status)
        self.assertIn('other.json', err)
        self.assertIn('snapshot of host real-name', err)

    def test_a_broken_snapshot_is_named(self):
        directory = os.path.join(self.tmp, 'snaps')
        os.makedirs(directory)
        with open(os.path.join(directory, 'h.json'), 'w') as handle:
            handle.write('{"kind": "HostInventory", "version": 1, "gpus": 7}')
        status, _out, err = self.run_cli('plan', '--snapshot-dir', directory)
        self.assertEqual(65, status)
        self.assertIn('h.json', err)


class TestNovaFromSnapshots(base.CliTestCase):

    def test_nova_config_reads_the_host_from_the_snapshot_dir(self):
        directory = os.path.join(self.tmp, 'snaps')
        os.makedirs(directory)
        tree = os.path.join(self.tmp, 'tree')
        simulate.simulate_host(simulate.HostSpec('gim-7', gpus=2,
                                                 mode='gim-cpx'), tree)
        status, direct, _e = self.run_cli('nova', 'config', '--sysfs-root',
                                          tree, '--hostname', 'gim-7')
        self.assertEqual(0, status, self.logger.output)
        status, out, _e = self.run_cli('inventory', '--sysfs-root', tree,
                                       '--hostname', 'gim-7', '-f', 'json')
        with open(os.path.join(directory, 'gim-7.json'), 'w') as handle:
            handle.write(out)
        status, from_dir, _e = self.run_cli(
            'nova', 'config', '--snapshot-dir', directory, '--hostname',
            'gim-7')
        self.assertEqual(0, status, self.logger.output)
        self.assertEqual(direct, from_dir)
        self.assertIn('device_spec', from_dir)
        status, _o, err = self.run_cli(
            'nova', 'config', '--snapshot-dir', directory, '--hostname',
            'nope')
        self.assertEqual(65, status)
        self.assertIn('no inventory in --snapshot-dir %s' % directory, err)
