"""Live consumers as running placements (policy.running), and the plan
made around them."""

from __future__ import annotations

import dataclasses
import random

import hypothesis
import testtools
from hypothesis import strategies as hyp_st

from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import GpuHealth
from amdgpu_virt.model import Kind
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import RasCount
from amdgpu_virt.model import Role
from amdgpu_virt.policy import planner as av_planner
from amdgpu_virt.policy import running
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from tests.unit.policy import utils

GPU0 = '0000:05:00.0'
GPU1 = '0000:25:00.0'
K8S = running.KUBERNETES
NOVA = running.NOVA


def pod(name, host='k8s', address=GPU0, **kw):
    return running.Holding('pod/team/%s' % name, K8S, host, address, **kw)


def vm(name, host='gim', address=GPU0, vfs=1, **kw):
    return running.Holding('instance/%s' % name, NOVA, host, address,
                           vfs=vfs, **kw)


class RunningTestCase(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = utils.conf()
        self.hosts = [utils.host('k8s', gpus=2), utils.host('gim', gpus=2,
                                                            mode='gim-cpx')]
        self.ledger = av_ledger.build([
            av_ledger.GpuAssignment('k8s', PciAddress.parse(GPU0),
                                    Role.K8S_SHARED, 'MI300X'),
            av_ledger.GpuAssignment('k8s', PciAddress.parse(GPU1),
                                    Role.K8S_DEDICATED, 'MI300X'),
            av_ledger.GpuAssignment('gim', PciAddress.parse(GPU0),
                                    Role.NOVA_VF, 'MI300X', vf_count=8),
            av_ledger.GpuAssignment('gim', PciAddress.parse(GPU1),
                                    Role.NOVA_VF, 'MI300X', vf_count=8)])

    def run_(self, holdings, ledger='default'):
        return running.placements(
            self.conf, self.hosts,
            self.ledger if ledger == 'default' else ledger, holdings)

    def plan(self, result, workloads):
        return av_planner.plan(self.conf, self.hosts, workloads,
                               result.ledger, result.placements)

    @staticmethod
    def by_name(result):
        return {d.workload: d for d in result.placements}


class TestKept(RunningTestCase):

    def test_slices_whole_gpus_and_vfs_are_kept_where_they_run(self):
        result = self.run_([
            pod('infer', compute_units=76, memory_mib=20480,
                cus=tuple(range(76)), what='pod team/infer'),
            pod('train', address=GPU1, compute_units=304,
                memory_mib=196592),
            vm('a', vfs=2), vm('b', address=GPU1)])
        self.assertEqual((), result.warnings)
        placed = self.by_name(result)
        self.assertEqual(['instance/a', 'instance/b', 'pod/team/infer',
                          'pod/team/train'], sorted(placed))
        infer = placed['pod/team/infer']
        self.assertEqual(Kind.CU, infer.kind)
        self.assertEqual(tuple(range(76)), infer.grants[0].cus)
        self.assertEqual(20480, infer.grants[0].memory_mib)
        self.assertIn('pod team/infer', infer.reason)
        self.assertEqual(Kind.DEDICATED, placed['pod/team/train'].kind)
        self.assertEqual([0, 1], [g.vf_index for g in
                                  placed['instance/a'].grants])
        self.assertEqual((GPU1,), placed['instance/b'].gpus)
        self.assertTrue(all(d.existing for d in result.placements))

    def test_new_workloads_avoid_what_runs(self):
        result = self.run_([
            pod('infer', compute_units=76, memory_mib=20480,
                cus=tuple(range(76))),
            pod('train', address=GPU1, compute_units=304,
                memory_mib=196592),
            vm('a', vfs=8)])
        plan = self.plan(result, [
            Workload('slice', Platform.POD, Tenancy.TRUSTED, cus=76,
                     memory_mib=20480),
            Workload('whole', Platform.POD, Tenancy.TRUSTED, gpus=1),
            Workload('tenant', Platform.VM, memory_mib=20480, cus=38)])
        new = {d.workload: d for d in plan.decisions if not d.existing}
        self.assertEqual(3, plan.summary()['existing'])
        self.assertTrue(new['slice'].placed)
        self.assertEqual(('k8s', (GPU0,)), (new['slice'].host,
                                             new['slice'].gpus))
        self.assertFalse(set(range(76)) & set(new['slice'].grants[0].cus))
        # the only k8s-dedicated GPU is taken, the first VF GPU is full
        self.assertFalse(new['whole'].placed, new['whole'].reason)
        self.assertEqual(('gim', (GPU1,)), (new['tenant'].host,
                                             new['tenant'].gpus))

    def test_two_containers_of_one_pod_on_one_gpu_are_one_slice(self):
        result = self.run_([pod('two', compute_units=38, memory_mib=1024),
                            pod('two', compute_units=38, memory_mib=1024)])
        (decision,) = result.placements
        self.assertEqual(76, len(decision.grants[0].cus))
        self.assertEqual(2048, decision.grants[0].memory_mib)

    def test_the_same_state_in_any_order_gives_the_same_placements(self):
        holdings = [pod('p%d' % i, compute_units=38, memory_mib=4096)
                    for i in range(6)] + [vm('v%d' % i) for i in range(5)]
        first = self.run_(holdings)
        shuffled = list(holdings)
        random.Random(7).shuffle(shuffled)
        self.assertEqual(first, self.run_(shuffled))

    def test_without_a_ledger_gpus_take_the_role_of_what_runs(self):
        result = self.run_([pod('infer', compute_units=38, memory_mib=1024),
                            vm('a', vfs=1)], ledger=None)
        roles = {(a.host, str(a.address)): a.role
                 for a in result.ledger.assignments}
        self.assertEqual({('k8s', GPU0): Role.K8S_SHARED,
                          ('gim', GPU0): Role.NOVA_VF}, roles)
        self.assertEqual(2, len(result.placements))
        self.assertEqual(2, len(result.warnings))
        self.assertIn('no role in the ledger; it takes role k8s-shared',
                      str(result.warnings[1]))
        # the other GPUs stay for the planner to give a role
        plan = self.plan(result, [Workload('w', Platform.POD,
                                           Tenancy.TRUSTED, gpus=1)])
        self.assertTrue(plan.decision('w').placed)


class TestHostile(RunningTestCase):

    def messages(self, result):
        return [str(w) for w in result.warnings]

    def held(self, result, host, address):
        return self.by_name(result).get('held/%s/%s' % (host, address))

    def test_a_gpu_not_in_the_inventory_is_warned_and_not_kept(self):
        result = self.run_([pod('ghost', address='0000:99:00.0',
                                compute_units=38, memory_mib=1),
                            pod('nohost', host='elsewhere')])
        self.assertEqual((), result.placements)
        self.assertEqual(
            ['pod/team/nohost on elsewhere GPU 0000:05:00.0: host elsewhere '
             'has no inventory: nothing is kept for it',
             'pod/team/ghost on k8s GPU 0000:99:00.0: the inventory of host '
             'k8s has no GPU at 0000:99:00.0: nothing is kept for it'],
            self.messages(result))

    def test_an_unknown_gpu_keeps_every_gpu_of_its_host(self):
        result = self.run_([pod('odd', address=None,
                                problem='device x not registered')])
        self.assertIn('device x not registered; it may be on any GPU of '
                      'the host: every GPU of k8s is kept occupied',
                      self.messages(result)[0])
        self.assertEqual(304, len(self.held(result, 'k8s', GPU0)
                                  .grants[0].cus))
        self.assertEqual(Kind.DEDICATED,
                         self.held(result, 'k8s', GPU1).kind)
        plan = self.plan(result, [Workload('s', Platform.POD,
                                           Tenancy.TRUSTED, cus=38,
                                           memory_mib=1024)])
        self.assertFalse(plan.decision('s').placed)

    def test_a_slice_bigger_than_the_gpu_is_warned_and_the_gpu_held(self):
        result = self.run_([pod('huge', compute_units=400,
                                memory_mib=1 << 30)])
        (message,) = self.messages(result)
        self.assertIn('pod/team/huge on k8s GPU 0000:05:00.0: holds a slice '
                      'of 400 CUs', message)
        self.assertIn('larger than the GPU (304 CUs', message)
        held = self.held(result, 'k8s', GPU0)
        self.assertIn('do not add up', held.reason)
        self.assertEqual(304, len(held.grants[0].cus))

    def test_overlapping_slices_name_both_consumers(self):
        result = self.run_([
            pod('a', compute_units=76, memory_mib=1024,
                cus=tuple(range(76))),
            pod('b', compute_units=38, memory_mib=1024,
                cus=tuple(range(60, 98)))])
        (message,) = self.messages(result)
        self.assertIn('pod/team/b on k8s GPU 0000:05:00.0: its CU 60 '
                      'overlaps pod/team/a', message)
        placed = self.by_name(result)
        # b keeps the CUs that are its own, the rest of the GPU is held
        self.assertEqual(tuple(range(76, 98)),
                         placed['pod/team/b'].grants[0].cus)
        self.assertEqual(304 - 98, len(self.held(result, 'k8s', GPU0)
                                       .grants[0].cus))

    def test_memory_over_commit_is_warned(self):
        result = self.run_([pod('a', compute_units=8, memory_mib=150000),
                            pod('b', compute_units=8, memory_mib=150000)])
        self.assertIn('memory over-committed', self.messages(result)[0])
        self.assertIsNotNone(self.held(result, 'k8s', GPU0))

    def test_two_pods_on_one_dedicated_gpu_overlap(self):
        result = self.run_([pod('a', address=GPU1), pod('b', address=GPU1)])
        (message,) = self.messages(result)
        self.assertIn('pod/team/b on k8s GPU 0000:25:00.0: overlaps '
                      'pod/team/a', message)
        (decision,) = result.placements
        self.assertIn('with pod/team/b', decision.reason)

    def test_partition_claims_of_one_dedicated_gpu_are_fine(self):
        result = self.run_([pod('a', address=GPU1, whole=True, partition=0),
                            pod('b', address=GPU1, whole=True, partition=1)])
        self.assertEqual((), result.warnings)
        self.assertEqual(1, len(result.placements))

    def test_a_consumer_of_the_other_cloud_keeps_the_gpu_occupied(self):
        result = self.run_([vm('a', vfs=1),
                            pod('squatter', host='gim', compute_units=38,
                                memory_mib=1024)])
        (message,) = self.messages(result)
        self.assertIn('pod/team/squatter on gim GPU 0000:05:00.0: a '
                      'Kubernetes consumer (pod/team/squatter) of a GPU whose '
                      'ledger role is nova-vf', message)
        held = self.held(result, 'gim', GPU0)
        self.assertEqual(list(range(1, 8)),
                         [g.vf_index for g in held.grants])

    def test_more_vfs_than_the_gpu_has(self):
        result = self.run_([vm('a', vfs=6), vm('b', vfs=6)])
        self.assertIn('instance/b on gim GPU 0000:05:00.0: holds 6 VF(s), '
                      'but only 2 of the 8 VFs are free',
                      self.messages(result)[0])

    def test_a_consumer_of_an_idle_gpu(self):
        ledger = self.ledger.replace(av_ledger.GpuAssignment(
            'k8s', PciAddress.parse(GPU0), Role.IDLE, 'MI300X'))
        result = self.run_([pod('a', compute_units=8, memory_mib=8)],
                           ledger=ledger)
        self.assertIn('ledger role is idle', self.messages(result)[0])
        self.assertEqual((), result.placements)
        plan = self.plan(result, [Workload('s', Platform.POD,
                                           Tenancy.TRUSTED, cus=38,
                                           memory_mib=1024)])
        self.assertNotIn(GPU0, plan.decision('s').gpus)

    def test_one_device_named_twice_in_two_ways_is_not_a_crash(self):
        # partition 0 of an unpartitioned GPU is the GPU itself
        result = self.run_([pod('twice', compute_units=8, memory_mib=8),
                            pod('twice', compute_units=8, memory_mib=8,
                                partition=0)])
        (message,) = self.messages(result)
        self.assertIn('pod/team/twice on k8s GPU 0000:05:00.0: cannot be '
                      'kept as it is', message)
        self.assertIsNotNone(self.held(result, 'k8s', GPU0))

    def test_ledger_entries_of_gpus_no_inventory_has_are_left_out(self):
        ledger = av_ledger.build(self.ledger.assignments + (
            av_ledger.GpuAssignment('gone', PciAddress.parse(GPU0),
                                    Role.K8S_SHARED, 'MI300X'),
            av_ledger.GpuAssignment('k8s', PciAddress.parse('0000:99:00.0'),
                                    Role.K8S_SHARED, 'MI300X')))
        result = self.run_([pod('a', compute_units=8, memory_mib=8)],
                           ledger=ledger)
        self.assertEqual(
            ['- on gone GPU 0000:05:00.0: the ledger gives this GPU role '
             'k8s-shared, but the host has no inventory: the entry is left '
             'out',
             '- on k8s GPU 0000:99:00.0: the ledger gives this GPU role '
             'k8s-shared, but its host\'s inventory has no GPU there: the '
             'entry is left out'], self.messages(result))
        self.assertEqual(self.ledger, result.ledger)
        self.assertEqual(1, len(result.placements))

    def test_more_slices_than_the_policy_allows(self):
        self.conf = utils.conf(max_slices_per_gpu=2)
        result = self.run_([pod('p%d' % i, compute_units=8, memory_mib=8)
                            for i in range(3)])
        (message,) = self.messages(result)
        self.assertIn('pod/team/p2 on k8s GPU 0000:05:00.0: cannot be kept '
                      'as it is', message)
        self.assertIn('max_slices_per_gpu', message)
        plan = self.plan(result, [Workload('s', Platform.POD,
                                           Tenancy.TRUSTED, cus=8,
                                           memory_mib=8)])
        self.assertNotIn(GPU0, plan.decision('s').gpus)

    def test_a_bad_address_is_a_problem_not_a_crash(self):
        result = self.run_([pod('bad', address='not-an-address')])
        self.assertIn("GPU 'not-an-address' is not a PCI address",
                      self.messages(result)[0])

    def test_roles_of_two_families_on_one_host_keep_the_gpus_idle(self):
        # an unroled amdgpu host: a VM and a pod on it cannot both have
        # their role (GIM and amdgpu on one host)
        result = self.run_([vm('a', host='k8s', vfs=1),
                            pod('b', address=GPU1, compute_units=8,
                                memory_mib=8)], ledger=None)
        roles = {str(a.address): a.role for a in result.ledger.assignments}
        self.assertNotIn(Role.NOVA_VF, roles.values())
        self.assertTrue(result.warnings)


class TestPartitioned(RunningTestCase):

    def setUp(self):
        super().setUp()
        self.hosts = [utils.host('cpx', gpus=1, mode='cpx')]
        self.ledger = av_ledger.build([av_ledger.GpuAssignment(
            'cpx', PciAddress.parse(GPU0), Role.K8S_SHARED, 'MI300X')])

    def test_slices_live_in_their_partition(self):
        result = self.run_([pod('a', host='cpx', partition=3,
                                compute_units=38, memory_mib=1024),
                            pod('b', host='cpx', partition=3,
                                compute_units=38, memory_mib=1024)])
        (message,) = [str(w) for w in result.warnings]
        self.assertIn('holds 38 CUs of partition 3, but only 0 are free',
                      message)
        a = self.by_name(result)['pod/team/a']
        self.assertEqual((3, tuple(range(38))), (a.grants[0].partition,
                                                 a.grants[0].cus))

    def test_a_whole_gpu_claim_of_a_shared_gpu_takes_every_partition(self):
        result = self.run_([pod('w', host='cpx', whole=True)])
        (message,) = [str(w) for w in result.warnings]
        self.assertIn('pod/team/w on cpx GPU 0000:05:00.0: holds the GPU as '
                      'a whole device, but the ledger role is k8s-shared',
                      message)
        (decision,) = result.placements
        self.assertEqual(8, len(decision.grants))
        self.assertEqual({38}, {len(g.cus) for g in decision.grants})


_ADDRESSES = (GPU0, GPU1, '0000:99:00.0', None, 'junk')


@hyp_st.composite
def _holdings(draw):
    cloud = draw(hyp_st.sampled_from(running.CLOUDS))
    cus = draw(hyp_st.none() | hyp_st.lists(
        hyp_st.integers(-2, 400), max_size=40).map(tuple))
    return running.Holding(
        '%s/%d' % (cloud, draw(hyp_st.integers(0, 6))), cloud,
        draw(hyp_st.sampled_from(('k8s', 'gim', 'gone'))),
        draw(hyp_st.sampled_from(_ADDRESSES)),
        whole=draw(hyp_st.booleans()),
        partition=draw(hyp_st.none() | hyp_st.integers(-1, 9)),
        compute_units=draw(hyp_st.integers(-5, 1000)),
        memory_mib=draw(hyp_st.integers(-5, 1 << 20)), cus=cus,
        vfs=draw(hyp_st.integers(0, 12)),
        problem=draw(hyp_st.none() | hyp_st.just('odd')))


class TestAnyLiveState(RunningTestCase):
    """Whatever the clouds report, the plan is made and never books a
    device twice."""

    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(hyp_st.lists(_holdings(), max_size=12),
                      hyp_st.booleans())
    def test_never_a_crash_never_a_double_booking(self, holdings, ledger):
        result = self.run_(holdings, ledger='default' if ledger else None)
        plan = self.plan(result, [Workload('new', Platform.POD,
                                           Tenancy.TRUSTED, cus=8,
                                           memory_mib=8)])
        owners: dict = {}
        for d in plan.decisions:
            for g in d.grants:
                if g.vf_index is not None:
                    units = [('vf', g.vf_index)]
                elif g.cus is not None:
                    units = [('cu', g.partition, c) for c in g.cus]
                else:
                    units = [('whole',)]
                for unit in units:
                    key = (d.host, g.address) + unit
                    self.assertNotIn(key, owners, d.workload)
                    owners[key] = d.workload
        new = plan.decision('new')
        if new.placed:
            # never on a GPU whose consumer's holding is unreadable
            for h in result_problems(holdings):
                self.assertFalse(h.host == new.host and (
                    h.address is None or h.address in new.gpus), h)


def result_problems(holdings):
    return [h for h in holdings if h.problem or h.address is None]


class TestUnhealthy(RunningTestCase):
    """A sick GPU takes no new work: by its host inventory's RAS counts or
    as a cloud reports it."""

    def sick_hosts(self, host, address, uncorrectable=1):
        result = []
        for inventory in self.hosts:
            if inventory.hostname == host:
                inventory = dataclasses.replace(inventory, gpus=tuple(
                    dataclasses.replace(g, health=GpuHealth(ras=(RasCount(
                        'umc', uncorrectable),)))
                    if str(g.address) == address else g
                    for g in inventory.gpus))
            result.append(inventory)
        return result

    def test_a_sick_dedicated_gpu_is_held(self):
        self.hosts = self.sick_hosts('k8s', GPU1)
        result = self.run_([])
        self.assertEqual(['held/k8s/%s' % GPU1], list(self.by_name(result)))
        self.assertIn('unhealthy (1 uncorrectable RAS errors (umc 1), more '
                      'than 0)', ' '.join(str(w) for w in result.warnings))
        plan = self.plan(result, [
            Workload('whole', Platform.POD, Tenancy.TRUSTED, gpus=1)])
        (new,) = [d for d in plan.decisions if not d.existing]
        self.assertFalse(new.placed)

    def test_the_threshold_is_an_option(self):
        self.hosts = self.sick_hosts('k8s', GPU1, uncorrectable=2)
        self.conf.set_override('max_uncorrectable', 2, 'health')
        self.assertEqual([], list(self.by_name(self.run_([]))))

    def test_a_vf_gpu_reported_sick_keeps_its_vms_and_takes_no_more(self):
        result = running.placements(
            self.conf, self.hosts, self.ledger, [vm('a', vfs=2)],
            {('gim', GPU0): 'registered health: false'})
        names = self.by_name(result)
        self.assertIn('instance/a', names)
        self.assertIn('held/gim/%s' % GPU0, names)
        plan = self.plan(result, [
            Workload('tenant', Platform.VM, memory_mib=20480, cus=38)])
        (new,) = [d for d in plan.decisions if not d.existing]
        self.assertEqual(('gim', (GPU1,)), (new.host, new.gpus))

    def test_a_sick_gpu_without_a_role_is_kept_idle(self):
        self.hosts = self.sick_hosts('k8s', GPU0)
        result = running.placements(self.conf, self.hosts, None, [])
        assert result.ledger is not None
        self.assertEqual(Role.IDLE, result.ledger.get(
            'k8s', PciAddress.parse(GPU0)).role)
        self.assertIn('is unhealthy: it is kept idle',
                      ' '.join(str(w) for w in result.warnings))
