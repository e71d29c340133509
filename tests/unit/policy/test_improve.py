"""The improvement pass after the greedy plan (``[policy]
improve_seconds``)."""

from __future__ import annotations

import functools
import os
import sys

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import planner as av_planner
from amdgpu_virt.policy.decision import Code
from tests.unit.policy import test_properties as props
from tests.unit.policy import utils

BENCH = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'bench')


@functools.lru_cache(maxsize=4)
def _setup(mixed: bool, improve: bool):
    conf = utils.conf(allow_mixed_host_drivers=mixed, max_slices_per_gpu=4,
                      improve_seconds=60.0 if improve else 0.0,
                      improve_tries=8)
    return conf, av_engine.Engine(conf)


def _plan(hosts, items, mixed, improve):
    conf, engine = _setup(mixed, improve)
    return av_planner.Planner(conf, hosts, engine=engine).plan(items)


def _priority(plan, items):
    prio = {w.name: w.priority for w in items}
    return sum(prio[d.workload] for d in plan.decisions if d.placed)


class TestImprovementProperties(testtools.TestCase):

    @settings(max_examples=60, deadline=None)
    @given(props.fleets(), props.workloads(), st.booleans())
    def test_never_overcommits_nor_lowers_the_placed_priority(
            self, hosts, items, mixed):
        greedy = _plan(hosts, items, mixed, False)
        improved = _plan(hosts, items, mixed, True)
        self.assertEqual([], utils.invariants(improved, hosts, items))
        self.assertGreaterEqual(_priority(improved, items),
                                _priority(greedy, items))
        self.assertEqual([w.name for w in items],
                         [d.workload for d in improved.decisions])
        # the improved plan is a valid start of an incremental plan
        conf, engine = _setup(mixed, False)
        again = av_planner.Planner(conf, hosts, improved.ledger, [
            d for d in improved.decisions if d.placed],
            engine=engine).plan([])
        self.assertEqual(improved.ledger, again.ledger)


class TestImprovement(testtools.TestCase):

    def setUp(self):
        super().setUp()
        sys.path.insert(0, BENCH)
        self.addCleanup(sys.path.remove, BENCH)
        import planner as bench_planner
        self.bench = bench_planner

    def test_raises_the_placed_priority_at_over_full_load(self):
        hosts = self.bench.make_fleet(20, 8, 42)
        items = self.bench.make_workloads(620, 43)
        greedy = _plan(hosts, items, False, False)
        improved = _plan(hosts, items, False, True)
        self.assertGreater(greedy.summary()['by_code']['unschedulable-now'],
                           0)
        self.assertGreater(_priority(improved, items),
                           _priority(greedy, items))
        self.assertEqual([], utils.invariants(improved, hosts, items))
        moved = [d for d in improved.decisions
                 if any(v.rule == 'improve' for v in d.trail)]
        self.assertTrue(moved)
        for d in moved:
            note = [v for v in d.trail if v.rule == 'improve'][0]
            if d.code is Code.PLACED and 'placed by' in note.message:
                self.assertIn('after moving', note.message)

    def test_off_by_default(self):
        hosts = self.bench.make_fleet(20, 8, 42)
        items = self.bench.make_workloads(620, 43)
        plan = utils.plan(hosts, items)
        self.assertFalse(any(v.rule == 'improve' for d in plan.decisions
                             for v in d.trail))
