"""Properties of any plan of a small random fleet and workload list."""

from __future__ import annotations

import functools

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import planner as av_planner
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Sensitivity
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from tests.unit.policy import utils

HOST_KINDS = (
    ('MI300X', 'gim-cpx', 'nps1'), ('MI300X', 'spx', 'nps1'),
    ('MI300X', 'cpx', 'nps4'), ('MI300X', 'vfio', 'nps1'),
    ('MI210', 'spx', 'nps1'), ('MI300A', 'spx', 'nps1'),
)


@functools.lru_cache(maxsize=2)
def _setup(mixed: bool):
    conf = utils.conf(allow_mixed_host_drivers=mixed, max_slices_per_gpu=4)
    return conf, av_engine.Engine(conf)


@st.composite
def fleets(draw):
    count = draw(st.integers(1, 3))
    hosts = []
    for i in range(count):
        model, mode, nps = draw(st.sampled_from(HOST_KINDS))
        gpus = draw(st.integers(1, 4))
        hosts.append(utils.host('h%d' % i, mode, model, gpus, nps))
    return hosts


@st.composite
def workloads(draw):
    result = []
    for i in range(draw(st.integers(1, 12))):
        compute = draw(st.one_of(st.none(), st.integers(1, 320),
                                 st.sampled_from(['5%', '10%', '12%', '25%',
                                                  '50%', '100%'])))
        cus = compute if isinstance(compute, int) else None
        percent = int(compute[:-1]) if isinstance(compute, str) else None
        result.append(Workload(
            'w%d' % i, draw(st.sampled_from(list(Platform))),
            draw(st.sampled_from(list(Tenancy))),
            gpus=draw(st.integers(1, 5)),
            memory_mib=draw(st.one_of(st.none(), st.integers(1, 200_000))),
            cus=cus, percent=percent, p2p=draw(st.booleans()),
            sensitivity=draw(st.sampled_from(list(Sensitivity))),
            numa_node=draw(st.one_of(st.none(), st.integers(0, 1))),
            same_numa=draw(st.booleans()),
            priority=draw(st.integers(0, 5))))
    return result


class TestPlanProperties(testtools.TestCase):

    @settings(max_examples=50)
    @given(fleets(), workloads(), st.booleans())
    def test_plans_are_safe(self, hosts, items, mixed):
        conf, engine = _setup(mixed)
        plan = av_planner.Planner(conf, hosts, engine=engine).plan(items)
        self.assertEqual([], utils.invariants(plan, hosts, items))
        self.assertEqual([w.name for w in items],
                         [d.workload for d in plan.decisions])
        summary = plan.summary()
        self.assertLessEqual(summary['placed'], plan.bound.placed)
        for decision in plan.decisions:
            if decision.unverified:
                self.assertTrue(mixed)
        # the ledger of this plan is a valid starting point: re-planning
        # nothing new keeps every placement
        again = av_planner.Planner(conf, hosts, plan.ledger, [
            d for d in plan.decisions if d.placed], engine=engine).plan([])
        self.assertEqual(plan.ledger, again.ledger)
