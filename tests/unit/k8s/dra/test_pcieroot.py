"""The standard ``resource.kubernetes.io/pcieRoot`` attribute.

Read from a simulated sysfs tree (the ``bus/pci/devices`` link of each
GPU), published on every device of the GPU, selected by a CEL expression
in the real CEL engine, and matched across drivers by the allocator
stand-in (a GPU aligned with a NIC of another driver).
"""

from __future__ import annotations

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import sysfs
from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import devices
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from tests.functional.fixtures import draallocator as da
from tests.unit.inventory import fixtures as inv_fixtures
from tests.unit.k8s.dra import helpers
from tests.unit.k8s.dra import test_slices

DRIVER = helpers.DRIVER
NIC_DRIVER = 'dra.net'
ROOT = slices.PCIE_ROOT


def _roots(inv):
    """The root complex of each simulated GPU: its bus rounded to 0x20."""
    return {g.address: 'pci%04x:%02x' % (g.address.domain,
                                         g.address.bus & 0xe0)
            for g in inv.gpus}


def _roots_of(objs):
    return {d['name']: d['attributes'].get(ROOT, {}).get('string')
            for d in test_slices.all_devices(objs)}


class TestReadFromSysfs(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.inv = helpers.host('mi300x-cpx-nps4')
        self.host = self.useFixture(inv_fixtures.SimulatedHost(
            inventory=self.inv))

    def test_each_gpu_sits_behind_its_own_root_complex(self):
        roots = sysfs.pcie_roots(self.host.root,
                                 [g.address for g in self.inv.gpus])
        self.assertEqual(_roots(self.inv), roots)
        self.assertEqual(8, len(set(roots.values())))

    def test_a_missing_link_names_the_link(self):
        absent = PciAddress(0, 0xee, 0, 0)
        err = self.assertRaises(exception.InventoryError, sysfs.pcie_root,
                                self.host.root, absent)
        self.assertIn('bus/pci/devices/0000:ee:00.0', str(err))
        # pcie_roots leaves it out instead of failing
        self.assertEqual({}, sysfs.pcie_roots(self.host.root, [absent]))

    def _relink(self, address, target):
        link = os.path.join(self.host.root, 'bus/pci/devices', str(address))
        os.unlink(link)
        os.symlink(target, link)

    def test_links_that_do_not_lead_to_a_host_bridge_are_refused(self):
        gpu = self.inv.gpus[0].address
        outside = self.useFixture(fixtures.TempDir()).path
        for target in (
                # out of the tree
                os.path.join(outside, 'devices/pci0000:00', str(gpu)),
                # escaping with ..
                '../../../../devices/pci0000:00/%s' % gpu,
                # not a host bridge directory
                '../../../devices/platform/%s' % gpu,
                '../../../devices/pci0000:00:x/%s' % gpu,
                # the root complex itself, no device below it
                '../../../devices/pci0000:00',
                # another function's directory
                '../../../devices/pci0000:00/0000:00:01.1/0000:06:00.0'):
            self._relink(gpu, target)
            err = self.assertRaises(exception.InventoryError,
                                    sysfs.pcie_root, self.host.root, gpu)
            self.assertIn(str(gpu), str(err))

    def test_a_link_with_an_absolute_target_inside_the_tree(self):
        gpu = self.inv.gpus[1].address
        real = os.path.realpath(os.path.join(self.host.root,
                                             'bus/pci/devices', str(gpu)))
        self._relink(gpu, real)
        self.assertEqual('pci0000:20', sysfs.pcie_root(self.host.root, gpu))


class TestPublished(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.inv = helpers.host('mi300x-cpx-nps4')
        self.roots = _roots(self.inv)
        ledger = helpers.roles(self.inv, 'n', Role.K8S_DEDICATED,
                               Role.K8S_SHARED, *[Role.K8S_DEDICATED] * 6)
        self.plan = devices.plan('n', self.inv, ledger.for_host('n'),
                                 pcie_roots=self.roots)
        self.slices = slices.build(self.plan, DRIVER)

    def test_every_device_carries_its_gpus_root(self):
        published = _roots_of(self.slices)
        self.assertEqual(len(self.plan.devices), len(published))
        for device in self.plan.devices:
            self.assertEqual(self.roots[device.gpu.address],
                             published[device.name], device.name)
        kinds = {d.type for d in self.plan.devices}
        self.assertEqual(set(devices.DeviceType), kinds)

    def test_without_a_root_the_attribute_is_left_out(self):
        plan = devices.plan('n', self.inv, pcie_roots={
            self.inv.gpus[0].address: 'pci0000:00'})
        published = _roots_of(slices.build(plan, DRIVER))
        self.assertEqual({'pci0000:00'}, {
            v for k, v in published.items()
            if k.startswith(devices.gpu_label(self.inv.gpus[0].address))})
        self.assertEqual({None}, {
            v for k, v in published.items()
            if not k.startswith(devices.gpu_label(
                self.inv.gpus[0].address))})

    def test_slices_stay_valid(self):
        for obj in self.slices:
            test_slices.validate(self, obj)

    def test_a_cel_selector_on_the_root_matches_in_the_cel_engine(self):
        expression = ('device.attributes["resource.kubernetes.io"]'
                      '.pcieRoot == "pci0000:40"')
        matched = set()
        for obj in self.slices:
            for device in obj['spec'].get('devices', []):
                if da.cel_matches(expression, da.Candidate(
                        DRIVER, 'n', obj['metadata']['name'], device)):
                    matched.add(device['name'])
        third = devices.gpu_label(self.inv.gpus[2].address)
        self.assertEqual({d.name for d in self.plan.devices
                          if d.name.startswith(third)}, matched)
        self.assertEqual(9, len(matched))  # 8 partitions and the whole GPU


def _nic_slice(node, roots):
    """A NIC driver's slice: one NIC per root complex in ``roots``."""
    return {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice',
            'metadata': {'name': '%s-%s-00' % (node, NIC_DRIVER)},
            'spec': {'driver': NIC_DRIVER, 'nodeName': node,
                     'pool': {'name': node, 'generation': 1,
                              'resourceSliceCount': 1},
                     'devices': [{'name': 'nic-%d' % n, 'attributes': {
                         ROOT: {'string': root}}}
                         for n, root in enumerate(roots)]}}


NIC_CLASS = {'apiVersion': 'resource.k8s.io/v1', 'kind': 'DeviceClass',
             'metadata': {'name': 'nic'},
             'spec': {'selectors': [{'cel': {'expression':
                                             'device.driver == "%s"'
                                             % NIC_DRIVER}}]}}


class TestAlignedWithANic(testtools.TestCase):
    """A claim for a GPU and a NIC under one root complex."""

    def setUp(self):
        super().setUp()
        self.inv = helpers.host('mi300x-spx')
        self.roots = _roots(self.inv)
        plan = devices.plan('n', self.inv, pcie_roots=self.roots)
        self.gpu_slices = slices.build(plan, DRIVER)

    def allocator(self, nic_roots):
        return da.Allocator(
            self.gpu_slices + [_nic_slice('n', nic_roots)],
            classes.device_classes(DRIVER) + [NIC_CLASS])

    def claim(self, name='c', gpus=1):
        return da.claim(name, [da.request('gpu', DRIVER, count=gpus),
                               da.request('nic', 'nic')],
                        constraints=[{'requests': ['gpu', 'nic'],
                                      'matchAttribute': ROOT}])

    def test_the_gpu_follows_the_nic(self):
        alloc = self.allocator(['pci0000:60'])
        result = alloc.allocate(self.claim(), 'n')
        got = {r['request']: r['device'] for r in
               result['devices']['results']}
        self.assertEqual({'gpu': devices.gpu_label(self.inv.gpus[3].address),
                          'nic': 'nic-0'}, got)
        # that GPU is taken: no other GPU shares the NIC's root complex
        self.assertIsNone(alloc.allocate(self.claim('d'), 'n'))

    def test_two_gpus_under_one_root_do_not_exist(self):
        alloc = self.allocator(['pci0000:60', 'pci0000:a0'])
        self.assertIsNone(alloc.allocate(self.claim(gpus=2), 'n'))

    def test_a_nic_under_no_gpus_root_fits_nothing(self):
        alloc = self.allocator(['pci0000:c1'])
        self.assertIsNone(alloc.allocate(self.claim(), 'n'))
