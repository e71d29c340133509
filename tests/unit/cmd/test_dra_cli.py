"""``amdgpu-virt k8s dra-slices``: what a host would publish, offline."""

from __future__ import annotations

import os

import yaml

from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.model import Role
from tests.unit.cmd import test_inventory_cli
from tests.unit.k8s.dra import helpers


class TestDraSlices(test_inventory_cli.CliTestCase):

    def docs(self, *argv):
        status, out, err = self.run_cli('k8s', 'dra-slices', *argv)
        self.assertEqual(0, status, err)
        return list(yaml.safe_load_all(out)), err

    def test_simulated_cpx_host(self):
        root, _out = self.simulate('--mode', 'cpx', '--nps', 'nps4',
                                   '--hostname', 'node-a')
        docs, err = self.docs('--sysfs-root', root, '--node', 'node-a')
        self.assertEqual(['ResourceSlice'] * 3, [d['kind'] for d in docs])
        self.assertEqual([64, 7, 0], [len(d['spec'].get('devices', []))
                                      for d in docs])
        self.assertIn('KFD shows 7', err)  # the 63-partition quirk
        self.assertEqual({'node-a'}, {d['spec']['pool']['name']
                                      for d in docs})

    def test_mixed_layout_and_pcie_roots(self):
        root, _out = self.simulate('--mode', 'cpx', '--nps', 'nps4',
                                   '--hostname', 'node-a')
        docs, _err = self.docs('--sysfs-root', root, '--node', 'node-a',
                               '--layout', 'mixed')
        (doc,) = docs
        self.assertEqual(71, len(doc['spec']['devices']))
        self.assertEqual(8, len(doc['spec']['sharedCounters']))
        roots = {d['attributes']['resource.kubernetes.io/pcieRoot']['string']
                 for d in doc['spec']['devices']}
        self.assertEqual({'pci0000:%02x' % (0x20 * n) for n in range(8)},
                         roots)

    def test_ledger_and_classes_from_a_snapshot(self):
        inv = helpers.host('mi300x-spx')
        path = os.path.join(self.tmp, 'inv.json')
        with open(path, 'w') as handle:
            handle.write(snapshot.dumps(inv))
        ledger = os.path.join(self.tmp, 'ledger.yaml')
        av_ledger.save(helpers.roles(inv, inv.hostname, Role.NOVA_VF,
                                     Role.K8S_SHARED, Role.K8S_DEDICATED),
                       ledger)
        docs, _err = self.docs('--snapshot', path, '--ledger', ledger,
                               '--classes', '--generation', '4')
        self.assertEqual(['DeviceClass'] * 3 + ['ResourceSlice'],
                         [d['kind'] for d in docs])
        (slice_,) = docs[3:]
        self.assertEqual(4, slice_['spec']['pool']['generation'])
        # a snapshot has no sysfs to read the PCIe roots from
        self.assertNotIn('resource.kubernetes.io/pcieRoot',
                         slice_['spec']['devices'][0]['attributes'])
        self.assertEqual(['gpu', 'share'], [
            d['attributes']['type']['string']
            for d in slice_['spec']['devices']])

    def test_host_missing_from_the_ledger_offers_nothing(self):
        root, _out = self.simulate('--gpus', '1')
        ledger = os.path.join(self.tmp, 'ledger.yaml')
        av_ledger.save(helpers.roles(helpers.host('mi300x-spx'), 'other',
                                     Role.K8S_DEDICATED), ledger)
        status, out, err = self.run_cli('k8s', 'dra-slices', '--sysfs-root',
                                        root, '--ledger', ledger,
                                        '--node', 'mine')
        self.assertEqual(0, status)
        self.assertEqual('', out)
        self.assertIn('host mine is not in ledger', err)
        self.assertIn('offers no GPU', err)

    def test_help(self):
        status, out, _err = self.run_cli('help', 'k8s', 'dra-slices')
        self.assertEqual(0, status)
        self.assertIn('--ledger', out)
        self.assertIn('only GPUs whose role is k8s-dedicated', out)
        self.assertIn('--release', out)
        self.assertIn('--feature-gates', out)
        # what --help says without --ledger is what the output shows
        flat = ' '.join(out.split())
        self.assertIn('Default: every amdgpu-driven GPU, as k8s-dedicated '
                      '(whole, and partitioned GPUs\' partitions where '
                      'the release keeps counters)', flat)

    def test_without_a_ledger_partitions_are_published_too(self):
        root, _out = self.simulate('--mode', 'cpx', '--nps', 'nps4',
                                   '--hostname', 'node-a')
        docs, _err = self.docs('--sysfs-root', root, '--node', 'node-a')
        types = {d['attributes']['type']['string'] for s in docs
                 for d in s['spec'].get('devices', [])}
        self.assertEqual({'gpu', 'partition'}, types)

    def test_each_release(self):
        root, _out = self.simulate('--mode', 'cpx', '--nps', 'nps4',
                                   '--hostname', 'node-a')
        for argv, shape, header in (
                (('--release', '1.34'), [8], 'Kubernetes 1.34 keeps no '
                 'gated field'),
                (('--release', 'v1.35.2'), [8], 'Kubernetes 1.35 keeps'),
                (('--release', '1.34', '--feature-gates',
                  'DRAPartitionableDevices=true'), [71],
                 'with DRAPartitionableDevices=true keeps shared counters '
                 '(mixed layout)'),
                (('--release', '1.35', '--feature-gates',
                  'DRAPartitionableDevices=true'), [64, 7, 0],
                 'shared counters (separate layout)'),
                (('--release', '1.36'), [64, 7, 0], 'consumable capacity'),
                ((), [64, 7, 0], 'Kubernetes 1.36 keeps')):
            status, out, err = self.run_cli(
                'k8s', 'dra-slices', '--sysfs-root', root, '--node',
                'node-a', *argv)
            self.assertEqual(0, status, err)
            self.assertIn(header, out.splitlines()[0], argv)
            docs = list(yaml.safe_load_all(out))
            self.assertEqual(shape, [len(d['spec'].get('devices', []))
                                     for d in docs], argv)
            if shape == [8]:
                self.assertEqual(8, err.count('offers no partitions'))
                self.assertNotIn('counter', out.lower().split('\n', 1)[1])

    def test_partitions_without_counters_option(self):
        root, _out = self.simulate('--mode', 'cpx', '--nps', 'nps4',
                                   '--hostname', 'node-a')
        conf = os.path.join(self.tmp, 'dra.conf')
        with open(conf, 'w') as handle:
            handle.write('[dra]\npartitions_without_counters = partitions\n')
        status, out, err = self.run_cli(
            '--config-file', conf, 'k8s', 'dra-slices', '--sysfs-root',
            root, '--node', 'node-a', '--release', '1.34')
        self.assertEqual(0, status, err)
        (doc,) = list(yaml.safe_load_all(out))
        self.assertEqual({'partition'}, {
            d['attributes']['type']['string'] for d in doc['spec'][
                'devices']})
        self.assertIn('offers no whole GPU', err)

    def test_bad_release_and_gates(self):
        root, _out = self.simulate('--gpus', '1')
        for argv, words in ((('--release', '1.33'), '1.34 or later'),
                            (('--release', 'x'), 'not a Kubernetes release'),
                            (('--feature-gates', 'Foo=true'),
                             '--feature-gates')):
            status, _out, err = self.run_cli(
                'k8s', 'dra-slices', '--sysfs-root', root, *argv)
            self.assertNotEqual(0, status)
            self.assertIn(words, err)


class TestApplyRendersDra(test_inventory_cli.CliTestCase):

    def test_apply_writes_the_slices_of_kubernetes_hosts(self):
        ledger_path = os.path.join(self.tmp, 'ledger.yaml')
        status, _out, err = self.run_cli('plan', '--output-ledger',
                                         ledger_path)
        self.assertEqual(0, status, err)
        out_dir = os.path.join(self.tmp, 'out')
        status, _out, err = self.run_cli('apply', '--ledger', ledger_path,
                                         '--output-dir', out_dir)
        self.assertEqual(0, status, err)
        ledger = av_ledger.load(ledger_path)
        found = 0
        for host in ledger.hosts:
            k8s = {str(a.address) for a in ledger.for_host(host)
                   if a.role in (Role.K8S_DEDICATED, Role.K8S_SHARED)}
            path = os.path.join(out_dir, host, 'k8s',
                                'dra-resourceslices.yaml')
            if not k8s:
                self.assertFalse(os.path.exists(path), host)
                continue
            with open(path) as handle:
                docs = list(yaml.safe_load_all(handle))
            found += 1
            published = {d['attributes']['pciAddress']['string']
                         for s in docs for d in s['spec'].get('devices', [])}
            self.assertEqual(k8s, published, host)
            self.assertEqual({host}, {s['spec']['nodeName'] for s in docs})
        self.assertGreater(found, 0)
