"""Rendering of Nova [pci] device_spec and alias entries."""

from __future__ import annotations

import json
import os
import re
import tempfile

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory.simulate import HostSpec
from amdgpu_virt.inventory.simulate import design_host
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt import fileutil
from amdgpu_virt.nova import pci
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.naming import Naming

NAMING = Naming()
MIXED = HostSpec('mixed-1', gpus=4,
                 gpu_modes=('gim-cpx', 'vfio', 'spx', 'gim-cpx'))


def _render(spec: HostSpec, ledger: av_ledger.Ledger | None = None) -> str:
    inventory = design_host(spec)
    plan = nova_plan.plan_host(inventory, NAMING, ledger)
    return pci.render_compute(plan,
                              all_functions=pci.host_functions(inventory))


def _entries(text: str, key: str) -> list[dict]:
    prefix = key + ' = '
    return [json.loads(line[len(prefix):]) for line in text.splitlines()
            if line.startswith(prefix)]


class TestRenderCompute(testtools.TestCase):

    def test_gim_cpx_host_one_spec_per_gpu(self):
        text = _render(HostSpec('c1', mode='gim-cpx'))
        specs = _entries(text, 'device_spec')
        self.assertEqual(8, len(specs))
        self.assertEqual({'1002'}, {s['vendor_id'] for s in specs})
        self.assertEqual({'74b5'}, {s['product_id'] for s in specs})
        self.assertEqual({'CUSTOM_AMD_MI300X_CPX_VF'},
                         {s['resource_class'] for s in specs})
        self.assertIn({'address': '0000:85:02.*', 'managed': 'no',
                       'product_id': '74b5',
                       'resource_class': 'CUSTOM_AMD_MI300X_CPX_VF',
                       'traits': 'CUSTOM_AMD_GPU_4,'
                                 'CUSTOM_AMD_MEMORY_NPS4,'
                                 'CUSTOM_AMD_MODEL_MI300X,'
                                 'CUSTOM_AMD_PARTITION_CPX',
                       'vendor_id': '1002'}, specs)
        # one per-GPU trait per GPU: each provider of the host is unique
        self.assertEqual(['CUSTOM_AMD_GPU_%d' % i for i in range(8)],
                         sorted(s['traits'].split(',')[0] for s in specs))
        self.assertIn('[pci]\nreport_in_placement = True\n', text)
        alias, *per_gpu = _entries(text, 'alias')
        self.assertEqual({'name': 'amd-mi300x-cpx-vf', 'vendor_id': '1002',
                          'product_id': '74b5', 'device_type': 'type-VF',
                          'numa_policy': 'preferred',
                          'resource_class': 'CUSTOM_AMD_MI300X_CPX_VF'},
                         alias)
        self.assertEqual(['amd-mi300x-cpx-vf-gpu%d' % i for i in range(8)],
                         [a['name'] for a in per_gpu])
        self.assertEqual(dict(alias, name='amd-mi300x-cpx-vf-gpu3',
                              traits='CUSTOM_AMD_GPU_3'), per_gpu[3])

    def test_per_gpu_traits_off(self):
        inventory = design_host(HostSpec('c1', gpus=2, mode='gim-cpx'))
        plan = nova_plan.plan_host(inventory, Naming(per_gpu_traits=False))
        text = pci.render_compute(plan)
        self.assertNotIn('GPU_', text)
        self.assertEqual(['amd-mi300x-cpx-vf'],
                         [a['name'] for a in _entries(text, 'alias')])

    def test_no_spaces_in_rendered_values(self):
        text = _render(MIXED)
        for entry in _entries(text, 'device_spec') + _entries(text, 'alias'):
            for value in entry.values():
                if isinstance(value, str):
                    self.assertNotIn(' ', value)

    def test_spx_host_uses_spx_class_and_nps1(self):
        specs = _entries(_render(HostSpec('c1', gpus=2, mode='gim-spx')),
                         'device_spec')
        self.assertEqual({'CUSTOM_AMD_MI300X_SPX_VF'},
                         {s['resource_class'] for s in specs})
        self.assertIn('CUSTOM_AMD_MEMORY_NPS1', specs[0]['traits'])

    def test_vfio_host_by_address(self):
        text = _render(HostSpec('c1', gpus=2, mode='vfio'))
        specs = _entries(text, 'device_spec')
        self.assertEqual(['0000:05:00.0', '0000:25:00.0'],
                         [s['address'] for s in specs])
        self.assertEqual({'74a1'}, {s['product_id'] for s in specs})
        alias = _entries(text, 'alias')[0]
        self.assertEqual('type-PF', alias['device_type'])
        self.assertEqual('CUSTOM_AMD_MI300X', alias['resource_class'])

    def test_amdgpu_gpus_are_never_offered(self):
        text = _render(HostSpec('k1', gpus=2, mode='cpx', nps='nps4'))
        self.assertEqual([], _entries(text, 'device_spec'))
        self.assertEqual([], _entries(text, 'alias'))
        self.assertIn('0000:05:00.0: bound to amdgpu', text)

    def test_mixed_host(self):
        text = _render(MIXED)
        addresses = [s['address'] for s in _entries(text, 'device_spec')]
        self.assertEqual(['0000:05:02.*', '0000:25:00.0', '0000:65:02.*'],
                         addresses)
        self.assertNotIn('0000:45', text.split('[pci]')[1])

    def test_deterministic_and_sorted(self):
        self.assertEqual(_render(MIXED), _render(MIXED))
        specs = _entries(_render(MIXED), 'device_spec')
        self.assertEqual(sorted(specs, key=pci.dumps), specs)

    def test_shared_slot_uses_function_regex(self):
        inventory = design_host(HostSpec('c1', gpus=1, mode='gim-qpx',
                                             off_catalog=True))
        plan = nova_plan.plan_host(inventory, NAMING)
        extra = PciAddress(0, 5, 2, 7)   # a foreign function in slot 02
        specs = pci.device_specs(
            plan, all_functions=pci.host_functions(inventory) + (extra,))
        self.assertEqual([{'domain': '0000', 'bus': '05', 'slot': '02',
                           'function': '[0123]'}],
                         [s['address'] for s in specs])

    def test_pf_with_its_vfs_refused(self):
        inventory = design_host(HostSpec('c1', gpus=1, mode='gim-cpx'))
        plan = nova_plan.plan_host(inventory, NAMING)
        both = nova_plan.HostPlan('c1', plan.offers + (
            nova_plan.dedicated_offer(inventory.gpus[0], NAMING),))
        err = self.assertRaises(exception.NovaConfigError,
                                pci.device_specs, both)
        self.assertIn('0000:05:00.0', str(err))

    def test_extra_tags_whitelisted(self):
        inventory = design_host(HostSpec('c1', gpus=1, mode='gim-cpx'))
        plan = nova_plan.plan_host(inventory, NAMING)
        specs = pci.device_specs(plan, extra_tags={'live_migratable': 'no'})
        self.assertEqual('no', specs[0]['live_migratable'])
        err = self.assertRaises(exception.NovaConfigError, pci.device_specs,
                                plan, extra_tags={'resouce_class': 'X'})
        self.assertIn("'resouce_class'", str(err))
        self.assertIn("did you mean 'resource_class'", str(err))
        self.assertIn('c1', str(err))


class TestLedger(testtools.TestCase):

    def _ledger(self, *items):
        return av_ledger.build(items)

    def test_ledger_selects_nova_gpus_only(self):
        inventory = design_host(MIXED)
        ledger = self._ledger(
            av_ledger.GpuAssignment('mixed-1', PciAddress(0, 5, 0, 0),
                                    Role.NOVA_VF, 'MI300X', vf_count=8),
            av_ledger.GpuAssignment('mixed-1', PciAddress(0, 0x25, 0, 0),
                                    Role.NOVA_DEDICATED, 'MI300X'),
            av_ledger.GpuAssignment('mixed-1', PciAddress(0, 0x65, 0, 0),
                                    Role.K8S_SHARED, 'MI300X'))
        plan = nova_plan.plan_host(inventory, NAMING, ledger)
        self.assertEqual([PciAddress(0, 5, 0, 0), PciAddress(0, 0x25, 0, 0)],
                         [o.address for o in plan.offers])
        reasons = {str(p.address): p.reason for p in plan.pending}
        self.assertIn('k8s-shared', reasons['0000:65:00.0'])
        self.assertIn('not in the ledger', reasons['0000:45:00.0'])

    def test_role_waiting_for_driver_is_pending(self):
        inventory = design_host(HostSpec('h', gpus=1, mode='spx'))
        ledger = self._ledger(
            av_ledger.GpuAssignment('h', PciAddress(0, 5, 0, 0),
                                    Role.NOVA_DEDICATED, 'MI300X'))
        plan = nova_plan.plan_host(inventory, NAMING, ledger)
        self.assertEqual((), plan.offers)
        self.assertIn('bound to amdgpu', plan.pending[0].reason)

    def test_vf_count_mismatch_is_pending(self):
        inventory = design_host(HostSpec('h', gpus=1, mode='gim-spx'))
        ledger = self._ledger(
            av_ledger.GpuAssignment('h', PciAddress(0, 5, 0, 0),
                                    Role.NOVA_VF, 'MI300X', vf_count=8))
        plan = nova_plan.plan_host(inventory, NAMING, ledger)
        self.assertEqual((), plan.offers)
        self.assertIn('ledger wants 8 VFs', plan.pending[0].reason)

    def test_ledger_memory_mode_becomes_trait(self):
        inventory = design_host(HostSpec('h', gpus=1, mode='gim-cpx'))
        ledger = self._ledger(
            av_ledger.GpuAssignment('h', PciAddress(0, 5, 0, 0),
                                    Role.NOVA_VF, 'MI300X', vf_count=8,
                                    compute_mode='CPX', memory_mode='NPS1'))
        (offer,) = nova_plan.plan_host(inventory, NAMING, ledger).offers
        self.assertIn('CUSTOM_AMD_MEMORY_NPS1', offer.traits)

    def test_missing_gpu_is_pending(self):
        inventory = design_host(HostSpec('h', gpus=1, mode='gim-cpx'))
        ledger = self._ledger(
            av_ledger.GpuAssignment('h', PciAddress(0, 0x99, 0, 0),
                                    Role.NOVA_DEDICATED, 'MI300X'))
        plan = nova_plan.plan_host(inventory, NAMING, ledger)
        reasons = {str(p.address): p.reason for p in plan.pending}
        self.assertIn('not found on the host', reasons['0000:99:00.0'])

    def test_ledger_aliases(self):
        ledger = self._ledger(
            av_ledger.GpuAssignment('a', PciAddress(0, 5, 0, 0),
                                    Role.NOVA_VF, 'MI300X', vf_count=8),
            av_ledger.GpuAssignment('b', PciAddress(0, 5, 0, 0),
                                    Role.NOVA_VF, 'MI300X', vf_count=8),
            av_ledger.GpuAssignment('b', PciAddress(0, 0x25, 0, 0),
                                    Role.NOVA_DEDICATED, 'MI325X'))
        entries = pci.aliases(pci.ledger_alias_specs(ledger, NAMING))
        self.assertEqual(['amd-mi300x-cpx-vf', 'amd-mi300x-cpx-vf-gpu0',
                          'amd-mi325x', 'amd-mi325x-gpu1'],
                         [e['name'] for e in entries])
        text = pci.render_aliases(entries)
        self.assertIn('alias = {"device_type":"type-VF"', text)


class TestValidation(testtools.TestCase):

    GOOD = {'vendor_id': '1002', 'product_id': '74b5',
            'address': '0000:85:02.*', 'resource_class': 'CUSTOM_A',
            'traits': 'CUSTOM_B,CUSTOM_C', 'managed': 'no'}

    def test_good_spec(self):
        pci.validate_device_spec(self.GOOD)

    def test_bad_specs(self):
        cases = {
            'resouce_class': dict(self.GOOD, resouce_class='CUSTOM_A'),
            'devname': dict(self.GOOD, devname='eth0'),
            'not a hex id': dict(self.GOOD, vendor_id='10020'),
            'does not trim': dict(self.GOOD, traits='CUSTOM_B, CUSTOM_C'),
            'custom resource class': dict(self.GOOD,
                                          resource_class='CUSTOM_a b'),
            'not a boolean': dict(self.GOOD, managed='maybe'),
            'selects every': {'managed': 'no'},
        }
        for needle, spec in cases.items():
            err = self.assertRaises(exception.NovaConfigError,
                                    pci.validate_device_spec, spec, 'hostx')
            self.assertIn(needle, str(err))
            self.assertIn('hostx', str(err))

    def test_bad_aliases(self):
        good = {'name': 'a', 'vendor_id': '1002', 'product_id': '74b5',
                'device_type': 'type-VF', 'numa_policy': 'preferred'}
        pci.validate_alias(good)
        cases = {
            "'numa'": dict(good, numa='x'),
            'exactly 4 hex': dict(good, product_id='74b'),
            'device_type': dict(good, device_type='type-VFX'),
            'numa_policy': dict(good, numa_policy='strict'),
            'product_id': {k: v for k, v in good.items()
                           if k != 'product_id'},
        }
        for needle, alias in cases.items():
            err = self.assertRaises(exception.NovaConfigError,
                                    pci.validate_alias, alias)
            self.assertIn(needle, str(err))

    def test_conflicting_alias_definitions(self):
        a = pci.AliasSpec('x', 0x1002, 0x74b5, 'type-VF', 'CUSTOM_A')
        b = pci.AliasSpec('x', 0x1002, 0x74b5, 'type-VF', 'CUSTOM_B')
        err = self.assertRaises(exception.NovaConfigError, pci.aliases,
                                [a, b])
        self.assertIn('alias x', str(err))

    @given(st.dictionaries(st.text(min_size=1, max_size=20),
                           st.just('1'), min_size=1, max_size=3))
    def test_any_unknown_key_is_rejected(self, extra):
        spec = dict(self.GOOD)
        spec.update(extra)
        unknown = set(spec) - pci.DEVICE_SPEC_KEYS
        if not unknown:
            return
        with testtools.ExpectedException(exception.NovaConfigError,
                                         '.*unknown device_spec key.*'):
            pci.validate_device_spec(spec)


class TestFiles(testtools.TestCase):

    def test_write_only_when_changed(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'sub', 'x.conf')
            self.assertTrue(fileutil.write_if_changed(path, 'a\n'))
            before = os.stat(path).st_mtime_ns
            self.assertFalse(fileutil.write_if_changed(path, 'a\n'))
            self.assertEqual(before, os.stat(path).st_mtime_ns)
            self.assertTrue(fileutil.write_if_changed(path, 'b\n'))
            with open(path) as handle:
                self.assertEqual('b\n', handle.read())
            self.assertEqual([], [n for n in os.listdir(os.path.dirname(
                path)) if re.match(r'^\.amdgpu-virt-', n)])
