"""Inventory sources: fleet files, snapshot directories, a live host."""

from __future__ import annotations

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import fleet
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.inventory import sources


class TestSnapshotDir(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path

    def save(self, host, name=None, fmt='json'):
        inventory = simulate.design_host(simulate.HostSpec(host, gpus=1))
        with open(os.path.join(self.dir, name or host + '.' + fmt),
                  'w') as handle:
            handle.write(snapshot.dumps(inventory, fmt))
        return inventory

    def test_every_host_by_name_equal_to_what_was_saved(self):
        b = self.save('b', fmt='yaml')
        a = self.save('a')
        with open(os.path.join(self.dir, 'README'), 'w') as handle:
            handle.write('not a snapshot')
        self.save('hidden', name='.hidden.json')
        self.assertEqual([a, b], sources.load_snapshot_dir(self.dir))
        inventories = sources.Inventories(sources.Source(
            snapshot_dir=self.dir))
        self.assertEqual([a, b], inventories.every())
        self.assertEqual({'a': a}, inventories.all(['a', 'missing']))

    def test_what_is_skipped_is_told_and_bounded(self):
        a = self.save('a')
        for n in range(sources.MAX_SKIPPED + 50):
            with open(os.path.join(self.dir, 'junk-%03d.txt' % n), 'w'):
                pass
        os.makedirs(os.path.join(self.dir, 'zz.json'))
        inventories = sources.Inventories(sources.Source(
            snapshot_dir=self.dir))
        self.assertEqual([a], inventories.every())
        told = inventories.warnings([a])
        self.assertEqual(sources.MAX_SKIPPED + 1 + len(a.warnings),
                         len(told))
        self.assertEqual('%s: skipped, not a snapshot (a snapshot is '
                         '<host>.json|.yaml|.yml)' % os.path.join(
                             self.dir, 'junk-000.txt'), told[0])
        self.assertIn('more entries skipped, not listed',
                      told[sources.MAX_SKIPPED])
        # a second read starts again
        inventories.every()
        self.assertEqual(len(told), len(inventories.warnings([a])))

    def test_two_files_of_one_host_are_refused(self):
        self.save('a')
        self.save('a', fmt='yaml')
        err = self.assertRaises(exception.InventoryError,
                                sources.load_snapshot_dir, self.dir)
        self.assertIn('a second snapshot of host a', str(err))

    def test_a_host_name_is_never_a_path(self):
        self.save('a')
        for name in ('../a', '.', '', 'x/../a'):
            self.assertIsNone(sources.snapshot_path(self.dir, name))

    def test_fleet_and_snapshot_dir_exclude_each_other(self):
        err = self.assertRaises(exception.InventoryError, sources.Source,
                                fleet='f.yaml', snapshot_dir=self.dir)
        self.assertIn('not both', str(err))

    def test_no_source_is_the_sample_fleet(self):
        source = sources.Source()
        self.assertTrue(source.sample)
        self.assertEqual('the sample fleet', str(source))
        self.assertEqual(fleet.load_fleet(),
                         sources.Inventories(source).every())
        self.assertFalse(sources.Source(live='sysfs tree x').sample)
