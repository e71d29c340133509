"""Placement audit and drain-check against a real Placement server."""

from __future__ import annotations

import uuid

import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory.simulate import HostSpec
from amdgpu_virt.inventory.simulate import design_host
from amdgpu_virt.nova import audit
from amdgpu_virt.nova import drain
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.audit import FindingKind
from amdgpu_virt.nova.naming import Naming
from amdgpu_virt.nova.placement import PlacementReader
from tests.functional.fixtures import placement as placement_fixture


def _unique(prefix: str) -> str:
    return '%s-%s' % (prefix, uuid.uuid4().hex[:8])


class PlacementTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.server = placement_fixture.get_server()
        self.conn = self.server.connection()
        self.seeder = placement_fixture.NovaLikeSeeder(self.conn)

    def plan(self, spec: HostSpec) -> nova_plan.HostPlan:
        return nova_plan.plan_host(design_host(spec), Naming())

    def reader(self) -> PlacementReader:
        return PlacementReader(self.conn.placement)


class TestAudit(PlacementTestCase):

    def test_converged_host_no_drift_two_calls_no_writes(self):
        host = _unique('cpx')
        plan = self.plan(HostSpec(host, mode='gim-cpx'))
        self.seeder.seed_offers(host, plan.offers)
        self.server.counter.reset()
        report = audit.audit([plan], self.reader())
        self.assertEqual((), report.findings)
        self.assertEqual(2, report.api_calls)       # fleet listing + 1
        self.assertEqual(1, report.hosts[0].api_calls)
        self.assertEqual(2, self.server.counter.total)
        self.assertEqual(0, self.server.counter.writes)
        self.assertEqual(8, len(report.usage))
        self.assertEqual({('CUSTOM_AMD_MI300X_CPX_VF', 8, 0)},
                         {(u.resource_class, u.total, u.used)
                          for u in report.usage})

    def test_each_drift_kind(self):
        host = _unique('mixed')
        plan = self.plan(HostSpec(host, gpus=4, gpu_modes=(
            'gim-cpx', 'gim-cpx', 'vfio', 'gim-cpx')))
        offers = {str(o.address): o for o in plan.offers}
        root = self.seeder.compute_node(host)
        cpx = offers['0000:05:00.0']
        # 05: converged
        self.seeder.pci_device(root, host, '0000:05:00.0',
                               cpx.resource_class, 8, cpx.traits)
        # 25: wrong total
        self.seeder.pci_device(root, host, '0000:25:00.0',
                               cpx.resource_class, 4,
                               offers['0000:25:00.0'].traits)
        # 45 (dedicated): wrong resource class
        self.seeder.pci_device(root, host, '0000:45:00.0',
                               'CUSTOM_PCI_1002_74A1', 1,
                               offers['0000:45:00.0'].traits)
        # 65: missing; e5 (not in the plan): extra
        self.seeder.pci_device(root, host, '0000:e5:00.0',
                               cpx.resource_class, 8,
                               ['CUSTOM_AMD_MODEL_MI300X'])
        report = audit.audit([plan], self.reader())
        self.assertEqual({
            ('0000:25:00.0', FindingKind.WRONG_TOTAL),
            ('0000:45:00.0', FindingKind.WRONG_RESOURCE_CLASS),
            ('0000:65:00.0', FindingKind.MISSING_PROVIDER),
            ('0000:E5:00.0', FindingKind.EXTRA_PROVIDER),
        }, {(f.provider[len(host) + 1:], f.kind) for f in report.findings})
        total = [f for f in report.findings
                 if f.kind is FindingKind.WRONG_TOTAL][0]
        self.assertEqual(('8', '4'), (total.expected, total.actual))

    def test_wrong_traits(self):
        host = _unique('traits')
        plan = self.plan(HostSpec(host, gpus=1, mode='gim-cpx'))
        (offer,) = plan.offers
        root = self.seeder.compute_node(host)
        self.seeder.pci_device(root, host, str(offer.address),
                               offer.resource_class, 8,
                               ['CUSTOM_AMD_MODEL_MI300X',
                                'CUSTOM_AMD_PARTITION_CPX',
                                'CUSTOM_AMD_MEMORY_NPS1'])
        (finding,) = audit.audit([plan], self.reader()).findings
        self.assertEqual(FindingKind.WRONG_TRAITS, finding.kind)
        self.assertIn('CUSTOM_AMD_MEMORY_NPS4', finding.expected)
        self.assertIn('CUSTOM_AMD_MEMORY_NPS1', finding.actual)

    def test_fully_used_host_falls_back_and_reports_usage(self):
        host = _unique('full')
        plan = self.plan(HostSpec(host, gpus=1, mode='gim-spx'))
        ids = self.seeder.seed_offers(host, plan.offers)
        (offer,) = plan.offers
        rp = ids['%s_%s' % (host, str(offer.address).upper())]
        self.seeder.allocate(str(uuid.uuid4()), rp,
                             {offer.resource_class: 1})
        report = audit.audit([plan], self.reader())
        self.assertEqual((), report.findings)
        (usage,) = report.usage
        self.assertEqual((1, 1), (usage.total, usage.used))
        # listing + empty candidates + 3 reads of the one provider
        self.assertEqual(5, report.api_calls)

    def test_host_without_providers(self):
        host = _unique('none')
        plan = self.plan(HostSpec(host, gpus=2, mode='vfio'))
        report = audit.audit([plan], self.reader())
        self.assertEqual({FindingKind.MISSING_PROVIDER},
                         {f.kind for f in report.findings})
        self.assertEqual(0, report.hosts[0].api_calls)

    def test_placement_error_names_request(self):
        reader = PlacementReader(self.conn.placement)
        err = self.assertRaises(exception.PlacementError,
                                reader.tree_states, 'not-a-uuid', 'X')
        self.assertIn('/allocation_candidates', str(err))


class TestDrainCheck(PlacementTestCase):

    def test_refuses_while_allocated_then_plans(self):
        host = _unique('drain')
        plan = self.plan(HostSpec(host, gpus=2, mode='gim-cpx'))
        ids = self.seeder.seed_offers(host, plan.offers)
        offer = plan.offers[1]
        rp = ids['%s_%s' % (host, str(offer.address).upper())]
        consumer = str(uuid.uuid4())
        self.seeder.allocate(consumer, rp, {offer.resource_class: 2})
        self.server.counter.reset()
        err = self.assertRaises(exception.UnsafeRoleChange,
                                drain.drain_check, self.reader(), host,
                                str(offer.address))
        self.assertIn(str(offer.address), str(err))
        self.assertIn('%s_%s' % (host, str(offer.address).upper()), str(err))
        self.assertIn(consumer, str(err))
        self.assertIn('CUSTOM_AMD_MI300X_CPX_VF:2', str(err))
        self.assertEqual(0, self.server.counter.writes)
        # the other GPU is free
        other = plan.offers[0]
        result = drain.drain_check(self.reader(), host, str(other.address))
        self.assertTrue(result.provider_found)
        text = str(result)
        order = ['device_spec', 'Restart nova-compute', 'is gone',
                 'GIM', 'Reboot']
        positions = [text.index(word) for word in order]
        self.assertEqual(sorted(positions), positions)
        self.assertNotIn('sriov_numvfs', text)
        # releasing the allocation makes the first GPU drainable
        self.seeder._call('DELETE', '/allocations/%s' % consumer)
        drain.drain_check(self.reader(), host, str(offer.address))

    def test_unknown_provider(self):
        result = drain.drain_check(self.reader(), _unique('gone'),
                                   '0000:05:00.0')
        self.assertFalse(result.provider_found)
        self.assertIn('provider not found', str(result))
