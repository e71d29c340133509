"""Cross-audit: every seeded conflict kind is found, none on a clean fleet."""

import dataclasses

import testtools

from amdgpu_virt import ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import GpuHealth
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import RasCount
from amdgpu_virt.model import Role
from amdgpu_virt.pool import crossaudit
from amdgpu_virt.pool.crossaudit import FindingKind as K
from amdgpu_virt.pool.observed import SideObservation

GIM = simulate.design_host(simulate.HostSpec('gim-0', gpus=2,
                                             mode='gim-cpx'))
BM = simulate.design_host(simulate.HostSpec('bm-0', gpus=2, mode='spx'))
A0 = PciAddress.parse('0000:05:00.0')
A1 = PciAddress.parse('0000:25:00.0')


def _ledger(overrides=None):
    items = {
        ('gim-0', A0): ledger.GpuAssignment('gim-0', A0, Role.NOVA_VF,
                                            'MI300X', vf_count=8),
        ('gim-0', A1): ledger.GpuAssignment('gim-0', A1, Role.NOVA_VF,
                                            'MI300X', vf_count=8),
        ('bm-0', A0): ledger.GpuAssignment('bm-0', A0, Role.K8S_SHARED,
                                           'MI300X', compute_mode='SPX',
                                           memory_mode='NPS1'),
        ('bm-0', A1): ledger.GpuAssignment('bm-0', A1, Role.K8S_DEDICATED,
                                           'MI300X'),
    }
    items.update(overrides or {})
    return ledger.build(v for v in items.values() if v is not None)


def _consistent():
    return [
        SideObservation('nova', 'gim-0', A0, capacity=8,
                        consumers=('vm-1',), detail='gim-0_0000:05:00.0'),
        SideObservation('nova', 'gim-0', A1, capacity=8,
                        detail='gim-0_0000:25:00.0'),
        SideObservation('k8s', 'bm-0', A0, capacity=10,
                        consumers=('ns/pod-a', 'ns/pod-b'), detail='uuid-0'),
        SideObservation('k8s', 'bm-0', A1, capacity=1, detail='uuid-1'),
    ]


def _kinds(report):
    return [(f.host, str(f.address), f.kind) for f in report.findings]


class TestCrossAudit(testtools.TestCase):

    def test_consistent_fleet_has_no_findings(self):
        report = crossaudit.audit(_ledger(), [GIM, BM], _consistent())
        self.assertEqual([], _kinds(report))
        self.assertEqual(4, report.gpus)
        self.assertEqual({'nova': 2, 'k8s': 2}, dict(report.offered))
        self.assertEqual({'nova': 1, 'k8s': 1}, dict(report.in_use))
        self.assertEqual(0, report.stranded)
        self.assertEqual((), report.conflicts)

    def test_double_offer_and_use(self):
        seen = _consistent() + [SideObservation(
            'k8s', 'gim-0', A0, capacity=10, consumers=('ns/p',),
            detail='uuid-x')]
        report = crossaudit.audit(_ledger(), [GIM, BM], seen)
        self.assertEqual([('gim-0', '0000:05:00.0', K.DOUBLE_OFFER),
                          ('gim-0', '0000:05:00.0', K.DOUBLE_USE),
                          ('gim-0', '0000:05:00.0', K.USE_AGAINST_LEDGER)],
                         _kinds(report))
        self.assertEqual(3, len(report.conflicts))
        messages = ' '.join(f.message for f in report.findings)
        self.assertIn('vm-1', messages)
        self.assertIn('ns/p', messages)
        self.assertIn('ledger role is nova-vf', messages)

    def test_offer_against_ledger_after_a_role_change(self):
        # The ledger moved bm-0 GPU 1 to nova, k8s still registers it.
        new = ledger.GpuAssignment('bm-0', A1, Role.NOVA_DEDICATED, 'MI300X')
        report = crossaudit.audit(_ledger({('bm-0', A1): new}), [GIM, BM],
                                  _consistent())
        kinds = _kinds(report)
        self.assertIn(('bm-0', '0000:25:00.0', K.OFFER_AGAINST_LEDGER),
                      kinds)
        self.assertIn(('bm-0', '0000:25:00.0', K.REALITY_DIFFERS), kinds)
        self.assertIn(('bm-0', '0000:25:00.0', K.NOT_OFFERED), kinds)
        self.assertEqual(1, len(report.conflicts))
        self.assertEqual(1, report.stranded)

    def test_reality_differs(self):
        wrong = ledger.GpuAssignment('gim-0', A0, Role.NOVA_VF, 'MI300X',
                                     vf_count=1)
        mode = ledger.GpuAssignment('bm-0', A0, Role.K8S_SHARED, 'MI300X',
                                    compute_mode='CPX', memory_mode='NPS1')
        report = crossaudit.audit(
            _ledger({('gim-0', A0): wrong, ('bm-0', A0): mode}),
            [GIM, BM], _consistent())
        messages = [f.message for f in report.findings
                    if f.kind is K.REALITY_DIFFERS]
        self.assertEqual(['ledger wants 1 VFs, host has 8',
                          'ledger wants compute partition CPX, host has SPX'],
                         sorted(messages))
        self.assertEqual((), report.conflicts)

    def test_gpu_without_role_and_unknown_gpu(self):
        stray = PciAddress.parse('0000:e5:00.0')
        seen = _consistent() + [SideObservation('nova', 'gim-0', stray,
                                                capacity=8, detail='x')]
        report = crossaudit.audit(_ledger({('bm-0', A1): None}),
                                  [GIM, BM], seen)
        kinds = _kinds(report)
        self.assertIn(('bm-0', '0000:25:00.0', K.NOT_IN_LEDGER), kinds)
        self.assertIn(('bm-0', '0000:25:00.0', K.OFFER_AGAINST_LEDGER),
                      kinds)
        self.assertIn(('gim-0', '0000:e5:00.0', K.UNKNOWN_GPU), kinds)
        self.assertIn(('gim-0', '0000:e5:00.0', K.OFFER_AGAINST_LEDGER),
                      kinds)

    def test_idle_gpu_is_stranded_capacity(self):
        idle = ledger.GpuAssignment('bm-0', A1, Role.IDLE, 'MI300X')
        seen = [o for o in _consistent() if o.address != A1
                or o.host != 'bm-0']
        report = crossaudit.audit(_ledger({('bm-0', A1): idle}),
                                  [GIM, BM], seen)
        self.assertEqual([('bm-0', '0000:25:00.0', K.IDLE)], _kinds(report))
        self.assertEqual(1, report.stranded)
        self.assertEqual('info', report.findings[0].severity)

    def test_report_serialises(self):
        seen = _consistent() + [SideObservation('k8s', 'gim-0', A1,
                                                detail='u')]
        data = crossaudit.audit(_ledger(), [GIM, BM], seen).to_dict()
        self.assertEqual(2, data['conflicts'])
        self.assertEqual({'host': 'gim-0', 'address': '0000:25:00.0',
                          'kind': 'double-offer', 'severity': 'conflict',
                          'message': 'offered by both nova '
                          '(gim-0_0000:25:00.0) and k8s (u)'},
                         data['findings'][0])


class TestSidesAsked(testtools.TestCase):

    def test_side_not_asked_is_not_reported_as_not_offered(self):
        nova_only = [o for o in _consistent() if o.side == 'nova']
        report = crossaudit.audit(_ledger(), [GIM, BM], nova_only)
        self.assertIn(('bm-0', str(A0), K.NOT_OFFERED), _kinds(report))
        report = crossaudit.audit(_ledger(), [GIM, BM], nova_only,
                                  sides=('nova',))
        self.assertEqual([], [k for k in _kinds(report)
                              if k[2] is K.NOT_OFFERED])


class TestHealth(testtools.TestCase):

    def sick(self, inventory, address, uncorrectable=1):
        return dataclasses.replace(inventory, gpus=tuple(
            dataclasses.replace(g, health=GpuHealth(ras=(RasCount(
                'umc', uncorrectable),))) if g.address == address else g
            for g in inventory.gpus))

    def test_a_vf_of_a_sick_gpu_assigned_to_a_vm_is_a_conflict(self):
        report = crossaudit.audit(_ledger(), [self.sick(GIM, A0), BM],
                                  _consistent())
        (finding,) = report.findings
        self.assertEqual(('gim-0', A0, K.UNHEALTHY_IN_USE, 'conflict'),
                         (finding.host, finding.address, finding.kind,
                          finding.severity))
        self.assertIn('nova vm-1', finding.message)
        self.assertIn('host: 1 uncorrectable', finding.message)
        # an idle sick GPU is drift, not stranded capacity
        report = crossaudit.audit(_ledger(), [self.sick(GIM, A1), BM],
                                  _consistent())
        self.assertEqual([('gim-0', str(A1), K.UNHEALTHY)], _kinds(report))
        self.assertEqual(0, report.stranded)
        # the threshold
        self.assertEqual([], _kinds(crossaudit.audit(
            _ledger(), [self.sick(GIM, A1), BM], _consistent(),
            max_uncorrectable=1)))

    def test_a_node_registering_a_gpu_unhealthy(self):
        seen = _consistent()
        seen[3] = dataclasses.replace(seen[3], offered=False,
                                      unhealthy='ras: 3 uncorrectable')
        seen[2] = dataclasses.replace(seen[2], offered=False,
                                      unhealthy='device: gone')
        kinds = _kinds(crossaudit.audit(_ledger(), [GIM, BM], seen))
        # not "not offered": the node withdrew it because it is sick
        self.assertEqual([('bm-0', str(A0), K.UNHEALTHY_IN_USE),
                          ('bm-0', str(A1), K.UNHEALTHY)], kinds)
