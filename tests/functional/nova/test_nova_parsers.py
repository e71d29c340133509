"""Every rendered device_spec and alias, fed to Nova's own parsers.

Nova 34's ``Whitelist`` (device_spec), ``get_alias_from_config`` (alias) and
``PlacementView`` (how nova-compute turns matched devices into Placement
providers; it refuses a PF together with its VFs and VFs of one PF with
different classes or traits) run on the simulated hosts' devices. No
mocking: the devices are the simulated inventory, the parsers are Nova's.
Specs use globs or vendor/product ids, and exact whole-GPU addresses of the
simulated hosts do not exist under this machine's /sys, so Nova's
``sriov_totalvfs`` probe of single addresses reads nothing here.
"""

from __future__ import annotations

import json
import unittest

import testtools

from tests.functional.fixtures import nova_env

from amdgpu_virt import exception as amdgpu_exception
from amdgpu_virt.inventory.simulate import HostSpec
from amdgpu_virt.inventory.simulate import design_host
from amdgpu_virt.model import Driver
from amdgpu_virt.model import HostInventory
from amdgpu_virt.nova import pci
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.naming import Naming

if nova_env.AVAILABLE:
    import nova.conf
    from nova.compute import pci_placement_translator as translator
    from nova import exception as nova_exception
    from nova import objects
    from nova.pci import request as pci_request
    from nova.pci import whitelist

    objects.register_all()

HOSTS = {
    'gim-cpx': HostSpec('cpx-1', mode='gim-cpx'),
    'gim-spx': HostSpec('spx-1', mode='gim-spx'),
    'vfio': HostSpec('vfio-1', mode='vfio'),
    'mixed': HostSpec('mixed-1', gpus=8, gpu_modes=(
        'gim-cpx', 'gim-cpx', 'vfio', 'vfio', 'qpx', 'cpx', 'gim-cpx',
        'vfio'), nps='nps4'),
}


def _devices(inventory: HostInventory) -> list[dict]:
    """Every PCI function of the host as nova-compute reports it."""
    devs = []
    for gpu in inventory.gpus:
        devs.append({'address': str(gpu.address), 'vendor_id': '1002',
                     'product_id': '%04x' % gpu.device_id,
                     'dev_type': 'type-PF' if (gpu.sriov_totalvfs or 0) > 0
                     else 'type-PCI', 'parent_addr': None,
                     'driver': gpu.driver})
        for vf in gpu.vfs:
            devs.append({'address': str(vf.address), 'vendor_id': '1002',
                         'product_id': '%04x' % vf.device_id,
                         'dev_type': 'type-VF',
                         'parent_addr': str(gpu.address),
                         'driver': vf.driver})
    return devs


@unittest.skipUnless(nova_env.AVAILABLE, nova_env.SKIP_REASON)
class TestNovaParsers(testtools.TestCase):

    def _render(self, spec: HostSpec):
        inventory = design_host(spec)
        plan = nova_plan.plan_host(inventory, Naming())
        specs = pci.device_specs(plan,
                                 all_functions=pci.host_functions(inventory))
        aliases = pci.aliases(pci.alias_of(o) for o in plan.offers)
        return inventory, plan, specs, aliases

    def _matches(self, inventory, specs):
        wl = whitelist.Whitelist([pci.dumps(s) for s in specs])
        result = {}
        for dev in _devices(inventory):
            matching = [s for s in wl.specs if s.match(dev)]
            result[dev['address']] = (dev, matching)
        return wl, result

    def _check_host(self, kind):
        inventory, plan, specs, aliases = self._render(HOSTS[kind])
        wl, matches = self._matches(inventory, specs)
        offered_vfs = {str(a) for o in plan.offers for a in o.vf_addresses}
        offered_pfs = {str(o.address) for o in plan.offers
                       if o.device_type != 'type-VF'}
        matched = 0
        for address, (_dev, specs_found) in matches.items():
            if address in offered_vfs or address in offered_pfs:
                self.assertEqual(1, len(specs_found),
                                 '%s matched %d specs' % (address,
                                                          len(specs_found)))
                matched += 1
            else:
                # PFs of VF hosts, amdgpu-bound GPUs: never matched
                self.assertEqual([], specs_found, address)
        self._check_placement_view(inventory, wl, plan)
        self._check_aliases(aliases)
        return matched, matches

    def _check_placement_view(self, inventory, wl, plan):
        view = translator.PlacementView(inventory.hostname, [])
        for dev in _devices(inventory):
            obj = objects.PciDevice(
                address=dev['address'], vendor_id=dev['vendor_id'],
                product_id=dev['product_id'], dev_type=dev['dev_type'],
                parent_addr=dev['parent_addr'], status='available',
                instance_uuid=None)
            spec = wl.device_assignable(dev)
            if spec is not None:
                view.process_dev(obj, spec)
        expected = {
            '%s_%s' % (inventory.hostname, str(o.address).upper()):
            (o.resource_class, o.total,
             set(o.traits) | {'COMPUTE_MANAGED_PCI_DEVICE'})
            for o in plan.offers}
        actual = {name: (rp.resource_class, rp.total, rp.traits)
                  for name, rp in view.rps.items()}
        self.assertEqual(expected, actual)

    def _check_aliases(self, aliases):
        conf = nova.conf.CONF
        conf.set_override('alias', [pci.dumps(a) for a in aliases],
                          group='pci')
        self.addCleanup(conf.clear_override, 'alias', group='pci')
        pci_request.get_alias_from_config.cache_clear()
        self.addCleanup(pci_request.get_alias_from_config.cache_clear)
        parsed = pci_request.get_alias_from_config()
        self.assertEqual(sorted(a['name'] for a in aliases), sorted(parsed))
        for alias in aliases:
            policy, (spec,) = parsed[alias['name']]
            self.assertEqual(alias['numa_policy'], policy)
            self.assertEqual(alias['device_type'], spec['dev_type'])
            self.assertEqual(alias['product_id'], spec['product_id'])
        # and with the Placement-based scheduler (one spec per alias)
        conf.set_override('pci_in_placement', True, group='filter_scheduler')
        self.addCleanup(conf.clear_override, 'pci_in_placement',
                        group='filter_scheduler')
        pci_request.get_alias_from_config.cache_clear()
        self.assertEqual(set(parsed), set(
            pci_request.get_alias_from_config()))

    def test_gim_cpx_host_64_vfs(self):
        matched, _ = self._check_host('gim-cpx')
        self.assertEqual(64, matched)

    def test_gim_spx_host(self):
        matched, _ = self._check_host('gim-spx')
        self.assertEqual(8, matched)

    def test_vfio_host(self):
        matched, _ = self._check_host('vfio')
        self.assertEqual(8, matched)

    def test_mixed_host(self):
        matched, matches = self._check_host('mixed')
        self.assertEqual(3 * 8 + 3, matched)
        for _address, (dev, specs) in matches.items():
            if dev['driver'] is Driver.AMDGPU:
                self.assertEqual([], specs)

    def test_pf_and_its_vfs_conflict_is_what_nova_refuses(self):
        # The check our renderer makes is the one nova-compute makes.
        inventory = design_host(HostSpec('c', gpus=1, mode='gim-cpx'))
        gpu = inventory.gpus[0]
        specs = [{'vendor_id': '1002', 'product_id': '74b5'},
                 {'vendor_id': '1002', 'product_id': '74a1'}]
        wl = whitelist.Whitelist([json.dumps(s) for s in specs])
        view = translator.PlacementView('c', [])
        self.assertRaises(
            nova_exception.PlacementPciDependentDeviceException,
            self._feed, view, wl, inventory)
        plan = nova_plan.HostPlan('c', (
            nova_plan.vf_offer(gpu, Naming()),
            nova_plan.dedicated_offer(gpu, Naming())))
        self.assertRaises(amdgpu_exception.NovaConfigError,
                          pci.device_specs, plan)

    def _feed(self, view, wl, inventory):
        for dev in sorted(_devices(inventory),
                          key=lambda d: d['dev_type'] != 'type-VF'):
            obj = objects.PciDevice(
                address=dev['address'], vendor_id=dev['vendor_id'],
                product_id=dev['product_id'], dev_type=dev['dev_type'],
                parent_addr=dev['parent_addr'], status='available',
                instance_uuid=None)
            spec = wl.device_assignable(dev)
            if spec is not None:
                view.process_dev(obj, spec)

    def test_flavor_alias_translates_to_requests(self):
        from amdgpu_virt.nova import flavors
        _inv, plan, _specs, aliases = self._render(HOSTS['mixed'])
        self._check_aliases(aliases)
        pci_request.get_alias_from_config.cache_clear()
        spec = flavors.FlavorSpec(name='f', vcpus=1, ram_mib=1,
                                  alias='amd-mi300x-cpx-vf', count=2,
                                  isolate=True)
        value = spec.extra_specs()[flavors.ALIAS_KEY]
        (request,) = pci_request._translate_alias_to_requests(value)
        self.assertEqual(2, request.count)
        self.assertEqual('CUSTOM_AMD_MI300X_CPX_VF',
                         request.spec[0]['resource_class'])
        self.assertRaises(nova_exception.PciRequestAliasNotDefined,
                          pci_request._translate_alias_to_requests,
                          'amd-mi300x-spx-vf:1')

    def test_misspelt_key_nova_accepts_we_refuse(self):
        spec = {'vendor_id': '1002', 'product_id': '74b5',
                'resouce_class': 'CUSTOM_X'}
        wl = whitelist.Whitelist([json.dumps(spec)])
        # Nova keeps the typo as a tag and matches anyway ...
        self.assertIsNotNone(wl.device_assignable(
            {'address': '0000:05:02.0', 'vendor_id': '1002',
             'product_id': '74b5', 'parent_addr': '0000:05:00.0'}))
        # ... we name it.
        err = self.assertRaises(amdgpu_exception.NovaConfigError,
                                pci.validate_device_spec, spec)
        self.assertIn('resouce_class', str(err))
