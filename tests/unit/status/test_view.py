"""The fleet view: one row per GPU from the plan around what runs, the
audit and the nodes' registrations."""

from __future__ import annotations

import dataclasses

import testtools

from amdgpu_virt.model import GpuHealth
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import RasCount
from amdgpu_virt.pool.observed import NodeFacts
from amdgpu_virt.pool.observed import SideObservation
from amdgpu_virt.status import view
from tests.unit.status import fleet


def _rows(status):
    return {(g.host, g.address): g for g in status.gpus}


class TestView(testtools.TestCase):

    def test_users_and_what_is_free_per_role(self):
        _plan, status = fleet.status()
        rows = _rows(status)
        vfs = rows[('gim', fleet.GPU0)]
        self.assertEqual(('instance/vm-a', 'instance/vm-b'), vfs.users)
        # 4 of 8 VFs held: half the CUs and MiB go with the free VFs
        self.assertEqual((8, 4, 152), (vfs.vfs, vfs.vfs_free, vfs.cus_free))
        self.assertEqual(vfs.vram_mib // 2, vfs.mib_free)
        self.assertEqual('sr-iov', vfs.enforcement)
        shared = rows[('bm', fleet.GPU0)]
        self.assertEqual(('pod/team/infer', 'pod/team/small'), shared.users)
        self.assertEqual(304 - 76 - 38, shared.cus_free)
        self.assertEqual(shared.vram_mib - 8192 - 4096, shared.mib_free)
        self.assertEqual((None, None), (shared.vfs, shared.vfs_free))
        self.assertEqual('kernel+hook', shared.enforcement)
        whole = rows[('bm', fleet.GPU1)]
        self.assertEqual((('claim/team/train',), 0, 0),
                         (whole.users, whole.cus_free, whole.mib_free))
        self.assertEqual(('unhealthy', 'RAS: 3 uncorrectable (UMC)',
                          'whole-gpu'),
                         (whole.health, whole.health_reason,
                          whole.enforcement))
        idle = rows[('bm', fleet.GPU2)]
        self.assertEqual(('idle', (), 304, '-', 'unknown'),
                         (idle.role, idle.users, idle.cus_free,
                          idle.enforcement, idle.health))
        spare = rows[('gim', fleet.GPU1)]
        self.assertEqual((8, 8, 304), (spare.vfs, spare.vfs_free,
                                       spare.cus_free))

    def test_drift_and_conflicts_come_from_the_audit(self):
        _plan, status = fleet.status()
        rows = _rows(status)
        # Kubernetes does not offer its whole GPU (it registered it sick)
        self.assertEqual(('not-offered',), rows[('bm', fleet.GPU1)].drift)
        self.assertEqual((), rows[('bm', fleet.GPU0)].drift)
        self.assertEqual((), status.conflicts)
        self.assertTrue(status.drifting)
        # the idle GPU's information finding is not drift
        self.assertIn('idle', [f.kind.value for f in
                               rows[('bm', fleet.GPU2)].findings])
        self.assertEqual((), rows[('bm', fleet.GPU2)].drift)
        rogue = SideObservation('k8s', 'gim', PciAddress.parse(fleet.GPU0),
                                consumers=('team/squatter',))
        _plan, status = fleet.status(extra=[rogue])
        drift = _rows(status)[('gim', fleet.GPU0)].drift
        self.assertIn('double-use', drift)
        self.assertIn('use-against-ledger', drift)
        self.assertTrue(status.conflicts)

    def test_a_gpu_only_a_side_reports_gets_a_row(self):
        ghost = SideObservation('nova', 'gim', PciAddress.parse(
            '0000:e5:00.0'), capacity=8, detail='gim_0000:E5:00.0')
        _plan, status = fleet.status(extra=[ghost])
        row = _rows(status)[('gim', '0000:e5:00.0')]
        self.assertEqual(('-', '-', None, None), (row.role, row.model,
                                                  row.cus, row.cus_free))
        self.assertIn('unknown-gpu', row.drift)
        self.assertEqual(('gim', '0000:e5:00.0', '-', '-', '-', '', '', ''),
                         row.row()[:8])

    def test_without_what_the_node_says(self):
        _plan, status = fleet.status(facts={})
        rows = _rows(status)
        self.assertEqual('unknown', rows[('bm', fleet.GPU0)].enforcement)
        self.assertEqual('unknown', rows[('bm', fleet.GPU1)].health)
        self.assertEqual(5, status.summary()['health_unknown'])

    def test_health_of_gpus_no_node_registers_from_their_inventory(self):
        # the Nova host registers nothing: its snapshot's RAS counts,
        # judged by [health] max_uncorrectable, fill the Health column
        found = fleet.hosts()
        gim, bm = found
        sick = GpuHealth(ras=(RasCount('umc', uncorrectable=2),))
        gim = dataclasses.replace(gim, gpus=(
            dataclasses.replace(gim.gpus[0], health=sick),
            dataclasses.replace(gim.gpus[1], health=GpuHealth(
                ras=(RasCount('umc', correctable=9),)))))
        # a node that says healthy does not hide a sick inventory
        bm = dataclasses.replace(bm, gpus=(
            dataclasses.replace(bm.gpus[0], health=sick), bm.gpus[1],
            dataclasses.replace(bm.gpus[2], health=None)))
        judged = view.inventory_facts([gim, bm], 0)
        made, _status = fleet.status()
        rows = _rows(view.build(made, None, {
            ('bm', PciAddress.parse(fleet.GPU0)): NodeFacts(
                'healthy', '', 'kernel')}, inventory=judged))
        vfs = rows[('gim', fleet.GPU0)]
        self.assertEqual('unhealthy', vfs.health)
        self.assertIn('inventory: 2 uncorrectable RAS errors (umc 2), '
                      'more than 0', vfs.health_reason)
        self.assertEqual('healthy', rows[('gim', fleet.GPU1)].health)
        shared = rows[('bm', fleet.GPU0)]
        self.assertEqual(('unhealthy', 'kernel'), (shared.health,
                                                    shared.enforcement))
        # no RAS counts read: still unknown
        self.assertEqual('unknown', rows[('bm', fleet.GPU2)].health)
        # a threshold of 2 lets the GPU pass; None does not judge counts
        self.assertEqual('healthy', view.inventory_facts([gim], 2)[
            ('gim', PciAddress.parse(fleet.GPU0))].health)
        self.assertEqual('healthy', view.inventory_facts([gim], None)[
            ('gim', PciAddress.parse(fleet.GPU0))].health)

    def test_a_held_gpu_is_in_use(self):
        # a slice larger than what its GPU has left: the GPU is kept
        # occupied by what is left of it, warned
        holdings = fleet.HOLDINGS + (fleet.running.Holding(
            'pod/team/huge', fleet.running.KUBERNETES, 'bm', fleet.GPU0,
            compute_units=400, memory_mib=1),)
        _plan, status = fleet.status(holdings=holdings)
        row = _rows(status)[('bm', fleet.GPU0)]
        self.assertEqual(['held', 'pod', 'pod'],
                         sorted(view.user_kind(u) for u in row.users))
        self.assertEqual((0, 0), (row.cus_free, row.mib_free))

    def test_summary_rows_and_document(self):
        _plan, status = fleet.status(warnings=['w1'])
        summary = status.summary()
        self.assertEqual((5, 3, 5, 1, 0, 1), (
            summary['gpus'], summary['in_use'], summary['users'],
            summary['unhealthy'], summary['conflicts'], summary['drift']))
        self.assertEqual((16, 12), (summary['vfs'], summary['vfs_free']))
        self.assertEqual(5 * 304, summary['cus'])
        document = status.to_dict()
        self.assertEqual(['w1'], document['warnings'])
        self.assertEqual('ledger.yaml', document['ledger'])
        (vm,) = [g for g in document['gpus'] if g['host'] == 'gim'
                 and g['address'] == fleet.GPU0]
        self.assertEqual([{'name': 'instance/vm-a', 'kind': 'vm'},
                          {'name': 'instance/vm-b', 'kind': 'vm'}],
                         vm['users'])
        for gpu in status.gpus:
            self.assertEqual(len(view.COLUMNS), len(gpu.row()))
        self.assertEqual('unhealthy: RAS: 3 uncorrectable (UMC)', [
            g.row()[12] for g in status.gpus
            if g.health == 'unhealthy'][0])
        self.assertEqual(NodeFacts(), NodeFacts('unknown', '', 'unknown'))
