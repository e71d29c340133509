"""The fleet planner: placements, roles and constraints."""

from __future__ import annotations

import testtools

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.inventory import fleet
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import planner as av_planner
from amdgpu_virt.policy import statefile as av_statefile
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import UNVERIFIED
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Sensitivity
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from tests.unit.policy import utils


def roles_of(plan, host):
    return [a.role for a in plan.ledger.for_host(host)]


class TestPlacements(testtools.TestCase):

    def test_isolated_pod_at_40_percent_gets_dedicated(self):
        hosts = [utils.host('bm', 'spx')]
        pod = Workload('p', Platform.POD, Tenancy.ISOLATED, percent=40,
                       memory_mib=64 * 1024, sensitivity=Sensitivity.LOW)
        plan = utils.plan(hosts, [pod])
        d = plan.decision('p')
        self.assertEqual(Code.PLACED, d.code)
        self.assertEqual(Kind.DEDICATED, d.kind)
        self.assertEqual([Role.K8S_DEDICATED] + [Role.IDLE] * 7,
                         roles_of(plan, 'bm'))
        self.assertIn('not a security boundary', '\n'.join(
            str(v) for v in d.trail))

    def test_vm_of_30_gb_cannot_take_a_24_gb_vf(self):
        hosts = [utils.host('gim', 'gim-cpx')]
        vm = Workload('vm', Platform.VM, memory_mib=28610, cus=38)
        small = Workload('small', Platform.VM, memory_mib=20 * 1024, cus=38)
        plan = utils.plan(hosts, [vm, small])
        self.assertEqual(Kind.DEDICATED, plan.decision('vm').kind)
        self.assertEqual(Kind.VF, plan.decision('small').kind)
        roles = roles_of(plan, 'gim')
        self.assertEqual(1, roles.count(Role.NOVA_DEDICATED))
        self.assertEqual(1, roles.count(Role.NOVA_VF))
        vf = [a for a in plan.ledger.assignments if a.role is Role.NOVA_VF]
        self.assertEqual(8, vf[0].vf_count)

    def test_p2p_training_gets_four_dedicated_gpus_on_one_host(self):
        hosts = [utils.host('a', 'spx', gpus=2), utils.host('b', 'spx')]
        job = Workload('train', Platform.POD, Tenancy.TRUSTED, gpus=4,
                       p2p=True)
        d = utils.plan(hosts, [job]).decision('train')
        self.assertEqual(Kind.DEDICATED, d.kind)
        self.assertEqual('b', d.host)
        self.assertEqual(4, len(set(d.gpus)))
        self.assertTrue(all(g.vf_index is None and g.cus is None
                            for g in d.grants))

    def test_trusted_pod_at_25_percent_gets_76_cus(self):
        hosts = [utils.host('bm', 'spx')]
        pod = Workload('p', Platform.POD, Tenancy.TRUSTED, percent=25,
                       memory_mib=48 * 1024)
        d = utils.plan(hosts, [pod]).decision('p')
        self.assertEqual(Kind.CU, d.kind)
        self.assertEqual(tuple(range(76)), d.grants[0].cus)
        self.assertEqual('CU 0-75', d.grants[0].describe())
        self.assertIsNone(d.grants[0].partition)

    def test_slices_fill_a_shared_gpu_before_opening_another(self):
        hosts = [utils.host('bm', 'spx')]
        pods = [Workload('p%d' % i, Platform.POD, Tenancy.TRUSTED,
                         percent=25, memory_mib=40 * 1024) for i in range(5)]
        plan = utils.plan(hosts, pods)
        self.assertEqual(2, roles_of(plan, 'bm').count(Role.K8S_SHARED))
        self.assertEqual(1, len({plan.decision('p%d' % i).gpus[0]
                                 for i in range(4)}))
        self.assertEqual([], utils.invariants(plan, hosts, pods))

    def test_cpx_partitions_bound_a_slice(self):
        # CPX/NPS4: eight devices of 38 CUs / ~24 GB. A 30-CU slice fits
        # one as it is.
        hosts = [utils.host('cpx', 'cpx', nps='nps4')]
        small = Workload('small', Platform.POD, Tenancy.TRUSTED, cus=30,
                         memory_mib=16 * 1024)
        plan = utils.plan(hosts, [small])
        d = plan.decision('small')
        self.assertEqual(Kind.CU, d.kind)
        self.assertEqual(0, d.grants[0].partition)
        shared = [a for a in plan.ledger.assignments
                  if a.role is Role.K8S_SHARED]
        self.assertEqual(('CPX', 'NPS4'), (shared[0].compute_mode,
                                           shared[0].memory_mode))

    def test_nps4_gpu_switches_to_qpx_for_larger_slices(self):
        # 76 CUs fit no CPX partition; QPX (valid with NPS4, switched
        # live) gives four devices of 76 CUs / ~48 GB. SPX needs NPS1,
        # so 100 CUs get a whole GPU.
        hosts = [utils.host('cpx', 'cpx', nps='nps4')]
        big = Workload('big', Platform.POD, Tenancy.TRUSTED, percent=25,
                       memory_mib=16 * 1024)
        small = Workload('small', Platform.POD, Tenancy.TRUSTED, cus=30,
                         memory_mib=16 * 1024)
        huge = Workload('huge', Platform.POD, Tenancy.TRUSTED, cus=100,
                        memory_mib=16 * 1024)
        plan = utils.plan(hosts, [big, small, huge])
        d = plan.decision('big')
        self.assertEqual(Kind.CU, d.kind)
        self.assertEqual(tuple(range(76)), d.grants[0].cus)
        self.assertEqual(d.gpus, plan.decision('small').gpus)
        self.assertEqual(Kind.DEDICATED, plan.decision('huge').kind)
        item = plan.ledger.get('cpx', d.gpus[0])
        self.assertEqual(('QPX', 'NPS4'), (item.compute_mode,
                                           item.memory_mode))
        self.assertEqual([], utils.invariants(plan, hosts,
                                              [big, small, huge]))

    def test_numa_constraint(self):
        hosts = [utils.host('bm', 'spx')]
        pod = Workload('p', Platform.POD, Tenancy.TRUSTED, percent=10,
                       memory_mib=8192, numa_node=1)
        d = utils.plan(hosts, [pod]).decision('p')
        gpu = hosts[0].gpu(d.gpus[0])
        self.assertEqual(1, gpu.numa_node)

    def test_model_constraint(self):
        hosts = [utils.host('bm', 'spx'),
                 utils.host('old', 'spx', model='MI210', gpus=4)]
        pod = Workload('p', Platform.POD, Tenancy.TRUSTED, models=('MI210',))
        self.assertEqual('old', utils.plan(hosts, [pod]).decision('p').host)

    def test_max_slices_per_gpu(self):
        hosts = [utils.host('bm', 'spx', gpus=1)]
        pods = [Workload('p%d' % i, Platform.POD, Tenancy.TRUSTED, cus=8,
                         memory_mib=1024) for i in range(4)]
        plan = utils.plan(hosts, pods, utils.conf(max_slices_per_gpu=3))
        codes = [plan.decision('p%d' % i).code for i in range(4)]
        self.assertEqual([Code.PLACED] * 3 + [Code.UNSCHEDULABLE], codes)


class TestCodes(testtools.TestCase):

    def test_unschedulable_now_has_numbers(self):
        hosts = [utils.host('gim', 'gim-cpx', gpus=2)]
        vms = [Workload('vm%d' % i, Platform.VM) for i in range(3)]
        plan = utils.plan(hosts, vms)
        d = plan.decision('vm2')
        self.assertEqual(Code.UNSCHEDULABLE, d.code)
        self.assertIn('needs 1 whole MI300X GPU(s)', d.reason)
        self.assertIn('0 unassigned', d.reason)
        self.assertIsNone(d.kind)

    def test_never_fits_too_many_gpus(self):
        hosts = [utils.host('bm', 'spx')]
        job = Workload('huge', Platform.VM, gpus=16, p2p=True)
        d = utils.plan(hosts, [job]).decision('huge')
        self.assertEqual(Code.NEVER, d.code)
        self.assertIn('needs 16 whole MI300X GPUs on one host', d.reason)
        self.assertIn('is 8', d.reason)

    def test_never_fits_no_kind(self):
        hosts = [utils.host('bm', 'spx')]
        huge = Workload('huge', memory_mib=256 * 1024)
        d = utils.plan(hosts, [huge]).decision('huge')
        self.assertEqual(Code.NEVER, d.code)
        self.assertIn('no kind is allowed', d.reason)

    def test_empty_fleet(self):
        plan = utils.plan([], [Workload('a')])
        self.assertEqual(Code.NEVER, plan.decision('a').code)
        self.assertIn('no GPUs', plan.decision('a').reason)
        self.assertEqual(0, plan.summary()['gpus'])

    def test_duplicate_names(self):
        hosts = [utils.host('bm', 'spx')]
        self.assertRaises(exception.PlanError, utils.plan, hosts,
                          [Workload('a'), Workload('a')])


class TestDriverFamilies(testtools.TestCase):

    def test_pods_never_go_to_a_gim_host(self):
        hosts = [utils.host('gim', 'gim-cpx')]
        pod = Workload('p', Platform.POD, Tenancy.TRUSTED, percent=10,
                       memory_mib=8192)
        plan = utils.plan(hosts, [pod])
        d = plan.decision('p')
        self.assertEqual(Code.NEVER, d.code)
        self.assertIn('k8s-dedicated is 0', d.reason)
        self.assertNotIn(Role.K8S_SHARED, roles_of(plan, 'gim'))

    def test_vms_get_no_vf_on_an_amdgpu_host(self):
        hosts = [utils.host('bm', 'spx')]
        vm = Workload('vm', Platform.VM, memory_mib=8192, cus=19)
        plan = utils.plan(hosts, [vm])
        d = plan.decision('vm')
        self.assertEqual(Kind.DEDICATED, d.kind)
        self.assertEqual(Role.NOVA_DEDICATED, roles_of(plan, 'bm')[0])
        self.assertFalse(d.unverified)

    def test_mixing_is_marked_unverified(self):
        hosts = [utils.host('bm', 'spx')]
        vm = Workload('vm', Platform.VM, memory_mib=8192, cus=19)
        pod = Workload('p', Platform.POD, Tenancy.TRUSTED, percent=10,
                       memory_mib=8192)
        plan = utils.plan(hosts, [vm, pod],
                          utils.conf(allow_mixed_host_drivers=True))
        d = plan.decision('vm')
        self.assertEqual(Kind.VF, d.kind)
        self.assertTrue(d.unverified)
        self.assertIn(UNVERIFIED, d.reason)
        self.assertFalse(plan.decision('p').unverified)
        self.assertTrue(any(g.unverified for g in plan.gpus))

    def test_a_host_found_mixed_keeps_each_gpu_in_its_family(self):
        hosts = [utils.host('mix', gpu_modes=['gim-cpx', 'spx'], gpus=2)]
        vm = Workload('vm', Platform.VM, memory_mib=8192, cus=19)
        pod = Workload('p', Platform.POD, Tenancy.TRUSTED, percent=10,
                       memory_mib=8192)
        plan = utils.plan(hosts, [vm, pod])
        self.assertEqual([Role.NOVA_VF, Role.K8S_SHARED],
                         roles_of(plan, 'mix'))
        self.assertTrue(plan.decision('vm').unverified)
        self.assertTrue(plan.decision('p').unverified)
        self.assertIn('unverified on real hardware',
                      plan.decision('p').reason)

    def test_model_without_sriov_is_never_nova_vf(self):
        hosts = [utils.host('apu', 'spx', model='MI300A', gpus=4)]
        vm = Workload('vm', Platform.VM, memory_mib=8192, cus=19)
        plan = utils.plan(hosts, [vm],
                          utils.conf(allow_mixed_host_drivers=True))
        self.assertEqual(Kind.DEDICATED, plan.decision('vm').kind)
        self.assertNotIn(Role.NOVA_VF, roles_of(plan, 'apu'))

    def test_sample_fleet_roles_respect_families(self):
        hosts = fleet.load_fleet()
        from amdgpu_virt import data
        from amdgpu_virt.policy import workload as wl
        workloads = wl.load_workloads(data.path('sample_workloads.yaml'))
        plan = utils.plan(hosts, workloads)
        self.assertEqual([], utils.invariants(plan, hosts, workloads))
        for host in ('gim-0', 'gim-1'):
            self.assertTrue(set(roles_of(plan, host)) <= {
                Role.NOVA_VF, Role.NOVA_DEDICATED, Role.IDLE})
        for host in ('bm-0', 'bm-1', 'mi210-0'):
            self.assertNotIn(Role.NOVA_VF, roles_of(plan, host))
        for item in plan.ledger.assignments:
            if item.role is Role.NOVA_VF:
                catalog.check_vf_count(catalog.by_name(item.model),
                                       item.vf_count)
        # the ledger survives its own loader
        again = av_ledger.from_dict(yamlutil.load(plan.ledger.dumps(), 't'))
        self.assertEqual(plan.ledger, again)
        codes = {d.workload: d.code for d in plan.decisions}
        self.assertEqual(Code.NEVER, codes['llm-405b-train'])


class TestIncremental(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.hosts = [utils.host('gim', 'gim-cpx'), utils.host('bm', 'spx')]
        self.first = [
            Workload('t1', Platform.VM, memory_mib=20480, cus=38),
            Workload('p1', Platform.POD, Tenancy.TRUSTED, percent=25,
                     memory_mib=32768),
            Workload('d1', Platform.VM)]
        self.plan1 = utils.plan(self.hosts, self.first)

    def _state(self):
        text = yamlutil.dump(self.plan1.state_dict())
        return av_statefile.load_state(yamlutil.load(text, 'state'), 'state')

    def test_running_placements_do_not_move(self):
        ledger, existing = self._state()
        new = [Workload('t2', Platform.VM, memory_mib=20480, cus=38),
               Workload('p2', Platform.POD, Tenancy.TRUSTED, percent=25,
                        memory_mib=32768)]
        plan2 = utils.plan(self.hosts, new, ledger=ledger, existing=existing)
        for old in self.plan1.decisions:
            kept = plan2.decision(old.workload)
            self.assertTrue(kept.existing)
            self.assertEqual(old.grants, kept.grants)
            self.assertEqual(old.host, kept.host)
        for assignment in ledger.assignments:
            if assignment.role is not Role.IDLE:
                self.assertEqual(assignment,
                                 plan2.ledger.get(assignment.host,
                                                  assignment.address))
        t2 = plan2.decision('t2')
        p2 = plan2.decision('p2')
        self.assertEqual(Kind.VF, t2.kind)
        self.assertNotEqual(self.plan1.decision('t1').grants[0].vf_index,
                            t2.grants[0].vf_index)
        self.assertEqual(Kind.CU, p2.kind)
        self.assertEqual(tuple(range(76, 152)), p2.grants[0].cus)
        everything = self.first + new
        self.assertEqual([], utils.invariants(plan2, self.hosts, everything))
        self.assertEqual(2, plan2.summary()['workloads'])
        self.assertEqual(3, plan2.summary()['existing'])

    def test_switched_compute_mode_survives_the_state_file(self):
        hosts = [utils.host('cpx', 'cpx', nps='nps4', gpus=1)]
        first = [Workload('big', Platform.POD, Tenancy.TRUSTED, percent=25,
                          memory_mib=16 * 1024)]
        plan1 = utils.plan(hosts, first)
        text = yamlutil.dump(plan1.state_dict())
        ledger, existing = av_statefile.load_state(
            yamlutil.load(text, 'state'), 'state')
        more = [Workload('next', Platform.POD, Tenancy.TRUSTED, percent=25,
                         memory_mib=16 * 1024)]
        plan2 = utils.plan(hosts, more, ledger=ledger, existing=existing)
        d = plan2.decision('next')
        self.assertEqual(Kind.CU, d.kind)
        self.assertEqual(1, d.grants[0].partition)
        self.assertEqual('QPX', plan2.ledger.assignments[0].compute_mode)
        self.assertEqual([], utils.invariants(plan2, hosts, first + more))

    def test_idle_gpus_of_the_ledger_stay_idle(self):
        ledger, existing = self._state()
        plan2 = utils.plan(self.hosts, [Workload('d2', Platform.VM)],
                           ledger=ledger, existing=existing)
        self.assertEqual(Code.UNSCHEDULABLE, plan2.decision('d2').code)

    def test_conflicting_placement_is_refused(self):
        ledger, existing = self._state()
        twice = existing + [existing[0].__class__(
            workload='ghost', code=Code.PLACED, reason='', kind=Kind.VF,
            host=existing[0].host, grants=existing[0].grants)]
        err = self.assertRaises(exception.PlanError, av_planner.Planner,
                                utils.conf(), self.hosts, ledger, twice)
        self.assertIn('ghost', str(err))
        self.assertIn('not free', str(err))

    def test_role_mismatch_is_refused(self):
        data = self.plan1.state_dict()
        data['placements'][0]['kind'] = 'cu'
        ledger, existing = av_statefile.load_state(data, 'state.yaml')
        err = self.assertRaises(exception.PlanError, av_planner.Planner,
                                utils.conf(), self.hosts, ledger, existing)
        self.assertIn('placements: t1', str(err))
        self.assertIn('needs k8s-shared', str(err))

    def test_ledger_role_against_the_host_family_is_refused(self):
        bad = av_ledger.from_dict({'version': 1, 'hosts': {'gim': {'gpus': [
            {'address': '0000:05:00.0', 'model': 'MI300X',
             'role': 'k8s-shared'}]}}})
        err = self.assertRaises(exception.PlanError, av_planner.Planner,
                                utils.conf(), self.hosts, bad)
        self.assertIn('allow_mixed_host_drivers', str(err))

    def test_ledger_vf_count_is_checked(self):
        from amdgpu_virt.model import PciAddress
        bad = av_ledger.build([av_ledger.GpuAssignment(
            'gim', PciAddress.parse('0000:05:00.0'), Role.NOVA_VF, 'MI300X',
            vf_count=4)])
        err = self.assertRaises(exception.PlanError, av_planner.Planner,
                                utils.conf(), self.hosts, bad)
        self.assertIn('VF count 4', str(err))
        self.assertIn('allowed: 1, 8', str(err))

    def test_ledger_for_an_unknown_gpu_is_refused(self):
        bad = av_ledger.from_dict({'version': 1, 'hosts': {'nowhere': {
            'gpus': [{'address': '0000:05:00.0', 'model': 'MI300X',
                      'role': 'idle'}]}}})
        err = self.assertRaises(exception.PlanError, av_planner.Planner,
                                utils.conf(), self.hosts, bad)
        self.assertIn('nowhere', str(err))

    def test_bad_placements_file(self):
        for raw, text in (({'kind': 'gpu'}, "kind 'gpu'"),
                          ({'kind': 'vf', 'workload': 'x', 'host': 'h',
                            'grants': [{'address': 'a', 'vf': 'one'}]},
                           'grants[0]'),
                          ({'kind': 'vf'}, 'required')):
            err = self.assertRaises(exception.PlanError,
                                    av_statefile.placements_from_dict, [raw],
                                    'f.yaml')
            self.assertIn(text, str(err))
            self.assertIn('placements[0]', str(err))


class TestBound(testtools.TestCase):

    def test_bound_by_capacity(self):
        hosts = [utils.host('gim', 'gim-cpx', gpus=2)]
        vms = [Workload('vm%d' % i, Platform.VM, priority=i)
               for i in range(3)]
        plan = utils.plan(hosts, vms)
        bound = plan.bound
        self.assertEqual(2, bound.placed)
        self.assertEqual(3, bound.feasible)
        # fractional knapsack: priorities 2 and 1 fill both GPUs
        self.assertEqual(3, bound.priority)
        self.assertEqual(2, plan.summary()['placed'])
        self.assertEqual(0, plan.summary()['distance_to_bound'])
        self.assertEqual(3, plan.summary()['placed_priority'])

    def test_bound_counts_small_footprints(self):
        hosts = [utils.host('gim', 'gim-cpx', gpus=1)]
        vms = [Workload('vm%d' % i, Platform.VM, memory_mib=8192, cus=19)
               for i in range(10)]
        plan = utils.plan(hosts, vms)
        self.assertEqual(8, plan.bound.placed)
        self.assertEqual(8, plan.summary()['placed'])
        self.assertEqual(8, plan.bound.by_kind['vf'])
        self.assertEqual(1, plan.bound.by_kind['dedicated'])

    def test_pods_are_bounded_by_the_gpus_pods_may_use(self):
        hosts = [utils.host('gim', 'gim-cpx'), utils.host('bm', 'spx',
                                                          gpus=1)]
        pods = [Workload('p%d' % i, Platform.POD, priority=1)
                for i in range(4)]
        vms = [Workload('vm', Platform.VM, priority=1)]
        plan = utils.plan(hosts, pods + vms)
        # 9 GPUs would hold all five, but pods may use only bm's one GPU
        self.assertEqual(2, plan.bound.placed)
        self.assertEqual(2, plan.bound.priority)
        self.assertEqual(2, plan.summary()['placed'])


class TestGpuReports(testtools.TestCase):
    """One report per GPU: what each role's figures say."""

    def test_each_role_reports_its_mode_users_and_use(self):
        hosts = [utils.host('gim', 'gim-cpx', gpus=1),
                 utils.host('bm', 'spx', gpus=3),
                 utils.host('pt', 'vfio', gpus=1)]
        plan = utils.plan(hosts, [
            Workload('vm-small', Platform.VM, memory_mib=8192, cus=19),
            Workload('vm-whole', Platform.VM, Tenancy.ISOLATED),
            Workload('pod-a', Platform.POD, Tenancy.TRUSTED, percent=25,
                     memory_mib=16 * 1024),
            Workload('pod-b', Platform.POD, Tenancy.TRUSTED, percent=10,
                     memory_mib=16 * 1024),
            Workload('pod-iso', Platform.POD, Tenancy.ISOLATED, percent=40,
                     memory_mib=64 * 1024, sensitivity=Sensitivity.LOW)])
        by_role = {}
        for report in plan.gpus:
            by_role.setdefault(report.role, []).append(report)
        self.assertEqual(len(plan.gpus), 5)
        vf, = by_role[Role.NOVA_VF]
        self.assertEqual('8 VFs (CPX)', vf.mode)
        self.assertEqual(('vm-small',) + (None,) * 7, vf.vf_owners)
        # one VF of eight given; the VM asks 19 of 304 CUs, 8 of 192 GiB
        self.assertEqual((0.125, 19 / 304), (vf.granted, vf.demand))
        shared, = by_role[Role.K8S_SHARED]
        self.assertEqual('SPX/NPS1', shared.mode)
        self.assertEqual(('pod-a', 'pod-b'), shared.used_by)
        # 76 + 30 CUs in two runs, one after the other
        self.assertEqual((('pod-a', None, 0, 76), ('pod-b', None, 76, 30)),
                         shared.cu_owners)
        self.assertEqual(((None, 304),), shared.partitions)
        # granted: the CUs in use; demand: summed per grant
        self.assertEqual((106 / 304, 76 / 304 + 30 / 304),
                         (shared.granted, shared.demand))
        dedicated, = by_role[Role.K8S_DEDICATED]
        self.assertEqual(('SPX/NPS1', ('pod-iso',), 1.0),
                         (dedicated.mode, dedicated.used_by,
                          dedicated.granted))
        passthrough, = by_role[Role.NOVA_DEDICATED]
        self.assertEqual(('vfio-pci', ('vm-whole',), 1.0, 1.0),
                         (passthrough.mode, passthrough.used_by,
                          passthrough.granted, passthrough.demand))
        idle, = by_role[Role.IDLE]
        self.assertEqual(('-', (), 0.0, 0.0, (), ()),
                         (idle.mode, idle.used_by, idle.granted,
                          idle.demand, idle.cu_owners, idle.partitions))


class TestFastConstructors(testtools.TestCase):

    def test_they_make_the_same_instances(self):
        # the planner's own constructors of its hottest records give the
        # dataclasses' instances, field for field
        from amdgpu_virt import catalog
        from amdgpu_virt.model import Kind
        from amdgpu_virt.policy import base
        from amdgpu_virt.policy import decision
        from amdgpu_virt.policy.decision import Code
        from amdgpu_virt.policy.decision import Decision
        from amdgpu_virt.policy.decision import Grant
        model = catalog.by_name('MI300X')
        args = (Kind.CU, model, 'h1', ('0000:05:00.0',), (1,), 38, 24576,
                1, True)
        made = base.candidate(*args)
        self.assertEqual(base.Candidate(*args), made)
        self.assertEqual(base.Candidate(*args).profile(), made.profile())
        self.assertIs(type(made), base.Candidate)
        grants = (Grant('0000:05:00.0', 1024, 38, cus=(0, 1)),)
        placed = decision.placed('w', 'why', Kind.CU, 'h1', grants, (), 2.5,
                                 True)
        self.assertEqual(Decision('w', Code.PLACED, 'why', Kind.CU, 'h1',
                                  grants, (), 2.5, True), placed)
        self.assertFalse(placed.existing)
        self.assertTrue(placed.placed)
