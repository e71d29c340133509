"""Every filter and weigher, with hand-computed expectations."""

from __future__ import annotations

import testtools

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy.filters import constraints
from amdgpu_virt.policy.filters import interference
from amdgpu_virt.policy.filters import isolation
from amdgpu_virt.policy.filters import p2p
from amdgpu_virt.policy.filters import platform
from amdgpu_virt.policy.filters import size
from amdgpu_virt.policy.weighers import interference as w_interference
from amdgpu_virt.policy.weighers import numa as w_numa
from amdgpu_virt.policy.weighers import role as w_role
from amdgpu_virt.policy.weighers import stranding
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Sensitivity
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from tests.unit.policy import utils

MI300X = catalog.by_name('MI300X')
MI300A = catalog.by_name('MI300A')
MI210 = catalog.by_name('MI210')
DED = base.Option(Kind.DEDICATED, MI300X)
VF = base.Option(Kind.VF, MI300X, 8)
CU = base.Option(Kind.CU, MI300X)


def allowed(judgement):
    return {(o.kind, o.model.name) for o in judgement.allowed}


class TestFilters(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.conf = utils.conf()

    def test_platform(self):
        rule = platform.PlatformFilter(self.conf)
        vm = Workload('vm', Platform.VM)
        pod = Workload('pod', Platform.POD)
        self.assertTrue(rule.check(vm, VF).passed)
        self.assertTrue(rule.check(vm, DED).passed)
        verdict = rule.check(vm, CU)
        self.assertFalse(verdict.passed)
        self.assertIn('VM cannot use a CU mask', verdict.message)
        self.assertFalse(rule.check(pod, VF).passed)
        self.assertTrue(rule.check(pod, CU).passed)
        anywhere = Workload('any', Platform.ANY)
        self.assertTrue(all(rule.check(anywhere, o).passed
                            for o in (DED, VF, CU)))

    def test_isolation(self):
        rule = isolation.IsolationFilter(self.conf)
        isolated = Workload('i', Platform.POD, Tenancy.ISOLATED, percent=40)
        trusted = Workload('t', Platform.POD, Tenancy.TRUSTED, percent=40)
        verdict = rule.check(isolated, CU)
        self.assertFalse(verdict.passed)
        self.assertIn('not a security boundary', verdict.message)
        self.assertTrue(rule.check(trusted, CU).passed)
        self.assertTrue(rule.check(isolated, VF).passed)
        self.assertTrue(rule.check(isolated, DED).passed)

    def test_p2p(self):
        rule = p2p.P2pFilter(self.conf)
        job = Workload('train', gpus=4, p2p=True)
        self.assertTrue(rule.check(job, DED).passed)
        verdict = rule.check(job, VF)
        self.assertFalse(verdict.passed)
        self.assertIn('blocks P2P DMA between VFs', verdict.message)
        self.assertFalse(rule.check(job, CU).passed)
        single = Workload('one', gpus=1, p2p=True, memory_mib=1024, cus=8)
        self.assertTrue(rule.check(single, VF).passed)
        self.assertTrue(rule.check(Workload('n', gpus=4), VF).passed)

    def test_size_vf(self):
        rule = size.SizeFilter(self.conf)
        # one of 8 MI300X VFs: 304 // 8 = 38 CUs, (196608 - 512) // 8
        # = 24512 MiB; 30 GB = 28610 MiB does not fit
        vm = Workload('vm', Platform.VM, memory_mib=28610, cus=38)
        verdict = rule.check(vm, VF)
        self.assertFalse(verdict.passed)
        self.assertIn('28610 MiB', verdict.message)
        self.assertIn('38 CUs and 24512 MiB', verdict.message)
        fits = Workload('vm', Platform.VM, memory_mib=24512, cus=38)
        self.assertTrue(rule.check(fits, VF).passed)
        too_many_cus = Workload('vm', Platform.VM, memory_mib=1024, cus=39)
        self.assertFalse(rule.check(too_many_cus, VF).passed)

    def test_size_no_sriov(self):
        rule = size.SizeFilter(self.conf)
        verdict = rule.check(Workload('x', memory_mib=1024, cus=8),
                             base.Option(Kind.VF, MI300A, None))
        self.assertFalse(verdict.passed)
        self.assertIn('MI300A offers no VFs (the model has no SR-IOV)',
                      verdict.message)
        verdict = rule.check(Workload('x', memory_mib=1024, cus=8),
                             base.Option(Kind.VF, MI210, None))
        self.assertIn('none of its GPUs here can run the GIM driver',
                      verdict.message)

    def test_size_threshold(self):
        rule = size.SizeFilter(self.conf)
        half = Workload('h', memory_mib=96 * 1024, percent=50)
        self.assertTrue(rule.check(half, CU).passed)
        more = Workload('m', memory_mib=97 * 1024, percent=50)
        verdict = rule.check(more, CU)
        self.assertFalse(verdict.passed)
        self.assertIn('dedicated_threshold', verdict.message)
        self.assertFalse(rule.check(Workload('w'), CU).passed)
        self.conf.set_override('dedicated_threshold', 0.25, 'policy')
        self.assertFalse(rule.check(half, CU).passed)

    def test_size_bigger_than_gpu(self):
        rule = size.SizeFilter(self.conf)
        huge = Workload('huge', memory_mib=256 * 1024)
        for option in (DED, VF, CU):
            verdict = rule.check(huge, option)
            self.assertFalse(verdict.passed)
        self.assertIn('whole MI300X has 304 CUs and 196608 MiB',
                      rule.check(huge, DED).message)
        self.assertIn('per GPU (100% of a MI300X)',
                      rule.check(Workload('w'), DED).message)

    def test_interference(self):
        rule = interference.InterferenceFilter(self.conf)
        high = Workload('h', sensitivity=Sensitivity.HIGH, percent=10)
        medium = Workload('m', sensitivity=Sensitivity.MEDIUM, percent=10)
        verdict = rule.check(high, CU)
        self.assertFalse(verdict.passed)
        self.assertIn('cu_max_sensitivity', verdict.message)
        self.assertTrue(rule.check(medium, CU).passed)
        self.assertTrue(rule.check(high, VF).passed)
        self.conf.set_override('cu_max_sensitivity', 'low', 'policy')
        self.assertFalse(rule.check(medium, CU).passed)

    def test_constraints(self):
        rule = constraints.ConstraintsFilter(self.conf)
        pinned = Workload('p', models=('MI210',), numa_node=1)
        verdict = rule.check(pinned, DED)
        self.assertFalse(verdict.passed)
        self.assertIn('not among the requested MI210', verdict.message)
        self.assertTrue(rule.check(pinned, base.Option(Kind.DEDICATED,
                                                       MI210)).passed)
        gpus = utils.host('h').gpus
        self.assertIn('NUMA node 0, not 1',
                      rule.gpu_refusal(pinned, Kind.DEDICATED, gpus[0]))
        self.assertIsNone(rule.gpu_refusal(pinned, Kind.DEDICATED, gpus[7]))


class TestEngine(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.engine = utils.default_engine()
        self.options = self.engine.options([MI300X])

    def test_options_use_the_catalog_vf_count(self):
        kinds = [(o.kind, o.vf_count) for o in self.options]
        self.assertEqual([(Kind.DEDICATED, None), (Kind.VF, 8),
                          (Kind.CU, None)], kinds)
        # MI210 supports only 1 VF: the default 8 is replaced
        self.assertEqual(1, self.engine.vf_count_for(MI210))
        self.assertIsNone(self.engine.vf_count_for(MI300A))

    def test_gpus_are_checked_only_for_a_workload_a_filter_may_refuse(self):
        # the constraints filter refuses GPUs of another NUMA node: only a
        # workload pinned to one is checked GPU by GPU; kept per shape
        engine = av_engine.Engine(utils.conf())
        pinned = Workload('a', Platform.POD, Tenancy.TRUSTED, percent=10,
                          numa_node=1)
        free = Workload('b', Platform.POD, Tenancy.TRUSTED, percent=10)
        self.assertTrue(engine.checks_gpus_of(pinned))
        self.assertFalse(engine.checks_gpus_of(free))
        self.assertTrue(engine.checks_gpus_of(Workload(
            'c', Platform.POD, Tenancy.TRUSTED, percent=10, numa_node=1,
            priority=7)))
        self.assertFalse(engine.checks_gpus_of(free))

    def test_isolated_pod_at_40_percent_is_dedicated_only(self):
        pod = Workload('p', Platform.POD, Tenancy.ISOLATED, percent=40,
                       memory_mib=64 * 1024)
        judgement = self.engine.judge(pod, self.options)
        self.assertEqual({(Kind.DEDICATED, 'MI300X')}, allowed(judgement))

    def test_trusted_pod_at_25_percent_may_share(self):
        pod = Workload('p', Platform.POD, Tenancy.TRUSTED, percent=25,
                       memory_mib=48 * 1024)
        judgement = self.engine.judge(pod, self.options)
        self.assertEqual({(Kind.DEDICATED, 'MI300X'), (Kind.CU, 'MI300X')},
                         allowed(judgement))

    def test_trail_names_every_filter_for_every_kind(self):
        vm = Workload('vm', Platform.VM, memory_mib=28610, cus=38)
        judgement = self.engine.judge(vm, self.options)
        rules = {(v.rule, v.kind) for v in judgement.trail}
        for kind in Kind:
            for rule in ('platform', 'isolation', 'p2p', 'size',
                         'interference', 'constraints'):
                self.assertIn((rule, kind), rules)
        self.assertEqual({(Kind.DEDICATED, 'MI300X')}, allowed(judgement))

    def test_unknown_filter_fails_loudly(self):
        conf = utils.conf(enabled_filters=['platform', 'platfrom'])
        err = self.assertRaises(exception.DriverNotFound,
                                av_engine.Engine, conf)
        self.assertIn('platfrom', str(err))
        self.assertIn('amdgpu_virt.policy.filters', str(err))
        # The option that named it comes first, so an operator knows
        # which line of the configuration to fix.
        self.assertTrue(str(err).startswith('[policy] enabled_filters: '),
                        str(err))

    def test_unknown_weigher_and_strategy_name_their_option(self):
        conf = utils.conf(enabled_weighers=['stranding', 'nosuch'])
        err = self.assertRaises(exception.DriverNotFound,
                                av_engine.Engine, conf)
        self.assertTrue(str(err).startswith('[policy] enabled_weighers: '),
                        str(err))
        self.assertIn("named 'nosuch'", str(err))
        conf = utils.conf()
        conf.set_override('cu_strategy', 'worst-fit', group='sharing')
        err = self.assertRaises(exception.DriverNotFound,
                                av_engine.Engine, conf)
        self.assertTrue(str(err).startswith('[sharing] cu_strategy: '),
                        str(err))
        self.assertIn('known: best-fit, first-fit', str(err))

    def test_filters_can_be_disabled(self):
        engine = av_engine.Engine(utils.conf(enabled_filters=['platform']))
        pod = Workload('p', Platform.POD, Tenancy.ISOLATED, percent=40)
        judgement = engine.judge(pod, engine.options([MI300X]))
        self.assertIn((Kind.CU, 'MI300X'), allowed(judgement))

    def _candidate(self, kind, unit, in_role=1, nodes=(0,), unv=False):
        return base.Candidate(kind, MI300X, 'h', ('a',) * len(nodes),
                              nodes, unit[0], unit[1], in_role, unv)

    def test_weighers(self):
        conf = utils.conf()
        w = Workload('w', cus=76, memory_mib=48 * 1024,
                     sensitivity=Sensitivity.MEDIUM)
        whole = self._candidate(Kind.DEDICATED, (304, 196608))
        vf = self._candidate(Kind.VF, (38, 24512))
        cu = self._candidate(Kind.CU, (76, 48 * 1024))
        strand = stranding.StrandingWeigher(conf)
        self.assertAlmostEqual(0.25, strand.score(w, whole))
        self.assertAlmostEqual(1.0, strand.score(w, cu))
        small = Workload('s', cus=19, memory_mib=12 * 1024)
        # VF share 1/8, used 19/304 = 1/16 -> 1 - 1/16
        self.assertAlmostEqual(0.9375, strand.score(small, vf))
        role = w_role.RoleWeigher(conf)
        self.assertEqual(1.0, role.score(w, cu))
        self.assertEqual(0.5, role.score(w, self._candidate(
            Kind.CU, (76, 1), in_role=0)))
        self.assertEqual(0.0, role.score(w, self._candidate(
            Kind.CU, (76, 1), unv=True)))
        numa = w_numa.NumaWeigher(conf)
        self.assertEqual(0.5, numa.score(w, self._candidate(
            Kind.DEDICATED, (1, 1), nodes=(0, 1))))
        inter = w_interference.InterferenceWeigher(conf)
        self.assertEqual(0.5, inter.score(w, cu))
        self.assertEqual(1.0, inter.score(w, vf))

    def test_rank_applies_multipliers(self):
        w = Workload('w', Platform.POD, Tenancy.TRUSTED, cus=76,
                     memory_mib=48 * 1024)
        whole = self._candidate(Kind.DEDICATED, (304, 196608), in_role=0)
        cu = self._candidate(Kind.CU, (76, 48 * 1024), in_role=0)
        ranked = self.engine.rank(w, [whole, cu])
        self.assertIs(cu, ranked[0].candidate)
        # stranding 1 x 1 + role 0.5 x 0.5 + numa 1 x 0.25 + interf 0.5 x 0.5
        self.assertAlmostEqual(1.75, ranked[0].score)
        self.assertAlmostEqual(0.25 + 0.25 + 0.25 + 0.5, ranked[1].score)
        self.assertIn('stranding 1.00 x 1', ranked[0].explain())
        engine = av_engine.Engine(utils.conf(stranding_weight_multiplier=0.0,
                                             interference_weight_multiplier=2))
        self.assertIs(whole, engine.rank(w, [whole, cu])[0].candidate)


class TestOptions(testtools.TestCase):

    def test_overrides_stay_in_their_conf(self):
        first = utils.conf(allow_mixed_host_drivers=True, vf_count=1)
        second = utils.conf()
        self.assertTrue(first.policy.allow_mixed_host_drivers)
        self.assertFalse(second.policy.allow_mixed_host_drivers)
        self.assertEqual(8, second.policy.vf_count)

    def test_ranges(self):
        conf = utils.conf()
        self.assertRaises(ValueError, conf.set_override,
                          'dedicated_threshold', 1.5, 'policy')
        self.assertRaises(ValueError, conf.set_override, 'vf_count', 3,
                          'policy')
        self.assertRaises(ValueError, conf.set_override,
                          'cu_max_sensitivity', 'extreme', 'policy')
