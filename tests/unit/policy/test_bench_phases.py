"""``bench/planner.py --phases``: the timers count every call of each
part and leave the planner as they found it."""

from __future__ import annotations

import contextlib
import io

import testtools

from tests.unit.policy import test_plan_stable
from tests.unit.policy import utils


class TestPhases(testtools.TestCase):

    def test_counts_the_parts_and_puts_them_back(self):
        bench = test_plan_stable._bench()
        before = [owner.__dict__[name] for _p, owner, name in bench.PHASES]
        fleet = bench.make_fleet(4, 8, 1)
        items = bench.make_workloads(40, 2)
        conf = utils.conf(improve_seconds=0.0)
        with bench.timed_phases() as (seconds, calls):
            plan = bench.planner.plan(conf, fleet, items)
        self.assertEqual(before, [owner.__dict__[name]
                                  for _p, owner, name in bench.PHASES])
        # one commit per placed workload, one build, one bound
        placed = plan.summary()['placed']
        self.assertGreater(placed, 0)
        self.assertEqual(placed, calls['commit'])
        self.assertEqual(1, calls['build the fleet state'])
        self.assertEqual(1, calls['bound'])
        self.assertGreater(calls['search'], 0)
        self.assertTrue(all(v >= 0 for v in seconds.values()))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            bench.phases(4, 8, 40, 1)
        text = out.getvalue()
        for part in dict.fromkeys(p for p, _o, _n in bench.PHASES):
            self.assertIn(part, text)
        self.assertIn('without the searches', text)
        self.assertGreater(bench.timer_cost(1000), 0.0)
