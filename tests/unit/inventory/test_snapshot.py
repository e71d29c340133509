"""Snapshots: JSON/YAML written by the CLI, read by the snapshot driver."""

from __future__ import annotations

import json
import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.model import InventoryWarning
from amdgpu_virt.model import replace
from tests.unit.inventory import fixtures as inv_fixtures

YAML_KINDS = ('mi300x-mixed', 'mi300a-tpx', 'mi210-gim-spx')


class TestRoundTrip(testtools.TestCase):

    def test_every_kind_round_trips_through_the_driver(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        conf = inv_fixtures.test_conf()
        for kind, spec in simulate.KINDS.items():
            inventory = replace(simulate.design_host(spec), warnings=(
                InventoryWarning('/sys/x', 'odd'),))
            # YAML is slow to parse: a few kinds are enough for it
            formats = ['json']
            if kind in YAML_KINDS:
                formats.append('yaml')
            for fmt in formats:
                path = os.path.join(tmp, '%s.%s' % (kind, fmt))
                with open(path, 'w') as handle:
                    handle.write(snapshot.dumps(inventory, fmt))
                self.assertEqual(
                    inventory,
                    snapshot.SnapshotInventory(conf, path).scan(),
                    '%s %s' % (kind, fmt))

    def test_scanned_tree_round_trips_through_the_driver(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi300x-cpx']))
        scanned = host.scan()
        self.assertEqual(1, len(scanned.warnings))
        path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                            'inv.json')
        with open(path, 'w') as handle:
            handle.write(snapshot.dumps(scanned))
        conf = inv_fixtures.test_conf()
        self.assertEqual(scanned,
                         snapshot.SnapshotInventory(conf, path).scan())

    def test_document_is_plain_and_readable(self):
        inventory = simulate.design_host(simulate.HostSpec(
            'h', gpus=1, mode='gim-dpx', off_catalog=True))
        document = json.loads(snapshot.dumps(inventory))
        self.assertEqual('HostInventory', document['kind'])
        self.assertEqual(1, document['version'])
        gpu = document['gpus'][0]
        self.assertEqual('0000:05:00.0', gpu['address'])
        self.assertEqual('gim', gpu['driver'])
        self.assertEqual('MI300X', gpu['model']['name'])
        self.assertEqual(['0000:05:02.0', '0000:05:02.1'],
                         [vf['address'] for vf in gpu['vfs']])
        self.assertEqual('vfio-pci', gpu['vfs'][0]['driver'])


class TestMalformed(testtools.TestCase):

    def setUp(self):
        super().setUp()
        inventory = simulate.design_host(simulate.HostSpec(
            'h', gpus=2, gpu_modes=('cpx', 'gim-cpx')))
        self.document = snapshot.to_document(inventory)

    def load_error(self, document):
        err = self.assertRaises(exception.SnapshotError,
                                snapshot.loads, json.dumps(document),
                                'snap.json')
        self.assertIn('snap.json', str(err))
        return str(err)

    def test_bad_fields_are_named(self):
        cases = (
            (('gpus', 0, 'address'), '0000:zz:00.0', 'gpus[0].address'),
            (('gpus', 1, 'vfs', 3, 'iommu_group'), 'x',
             'gpus[1].vfs[3].iommu_group'),
            (('gpus', 0, 'driver'), 'nvidia', 'gpus[0].driver'),
            (('gpus', 0, 'partitions', 2, 'compute_units'), True,
             'gpus[0].partitions[2].compute_units'),
            (('gpus', 0, 'model', 'partition_modes', 0), ['SPX'],
             'gpus[0].model.partition_modes[0]'),
            (('gpus', 0, 'numa_node'), 1.5, 'gpus[0].numa_node'),
            (('hostname',), None, 'hostname'),
            (('gpus',), {}, 'gpus'),
        )
        for keys, value, field in cases:
            document = json.loads(json.dumps(self.document))
            target = document
            for key in keys[:-1]:
                target = target[key]
            target[keys[-1]] = value
            self.assertIn('Field %s:' % field, self.load_error(document),
                          field)

    def test_unknown_and_missing_keys(self):
        document = json.loads(json.dumps(self.document))
        document['gpus'][0]['colour'] = 'red'
        message = self.load_error(document)
        self.assertIn('gpus[0]', message)
        self.assertIn('colour', message)
        document = json.loads(json.dumps(self.document))
        del document['gpus'][1]['vfs'][0]['address']
        self.assertIn('gpus[1].vfs[0].address: required',
                      self.load_error(document))

    def test_kind_and_version(self):
        document = dict(self.document, version=2)
        self.assertIn('field version', self.load_error(document))
        document = dict(self.document, kind='Ledger')
        self.assertIn('field kind', self.load_error(document))
        self.assertIn('top level', self.load_error([1, 2]))

    def test_not_json_or_yaml(self):
        for text in ('{"kind": ', 'a: [', '{"kind": 1, "kind": 2}'):
            err = self.assertRaises(exception.SnapshotError, snapshot.loads,
                                    text, 'snap')
            self.assertIn('snap', str(err))

    def test_missing_file_and_unset_path(self):
        conf = inv_fixtures.test_conf()
        err = self.assertRaises(exception.SnapshotError,
                                snapshot.SnapshotInventory(conf).scan)
        self.assertIn('snapshot_path', str(err))
        err = self.assertRaises(
            exception.SnapshotError,
            snapshot.SnapshotInventory(conf, '/nonexistent/x.json').scan)
        self.assertIn('/nonexistent/x.json', str(err))
        self.assertIn('cannot read', str(err))
