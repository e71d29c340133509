"""The planner's decisions stay what they were on seeded fleets.

Each case plans a seeded fleet and workload mix of ``bench/planner.py``
(greedy, with the improvement pass, without the packing score, with
mixed host drivers allowed), then plans again incrementally with the
placed ones kept and new workloads added. The digest covers every
decision (code, host, grants, reason, score), every line of its trail as
``explain`` prints it, the ledger and every GPU's report. The digests
were recorded before the planner's trail became lazy and its searches
were made cheaper for large fleets, so a speed change that moves a
decision, or a word of a reason, fails here.

A change meant to move decisions records the new digests (``python -m
tests.unit.policy.test_plan_stable``) and says in its release note which
decisions move and why the plan is not worse.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys

import testtools

from amdgpu_virt.policy import planner as av_planner
from tests.unit.policy import utils

BENCH = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'bench')

#: name: (hosts, workloads, seed, [policy] overrides)
CASES = {
    'h20w300': (20, 300, 42, {}),
    'h20w620': (20, 620, 42, {}),
    'h20w620-improve': (20, 620, 42, dict(
        improve_seconds=600.0, improve_tries=8, max_slices_per_gpu=4)),
    'h60w1500-s7': (60, 1500, 7, {}),
    'h60w1900-s7-improve': (60, 1900, 7, dict(improve_seconds=600.0,
                                              improve_tries=4)),
    'h40w1000-s3-nopack': (40, 1000, 3, dict(packing=False)),
    'h40w1000-s3-mixed': (40, 1000, 3, dict(allow_mixed_host_drivers=True)),
}

#: recorded digests (first 16 hex digits of the SHA-256)
DIGESTS = {
    'h20w300': '4344315578b1fd77',
    'h20w620': '0920bf8a0104bee1',
    'h20w620-improve': '9454a2d54f8056b9',
    'h60w1500-s7': '506d55911c866e49',
    'h60w1900-s7-improve': '02a1369fa3c24b8a',
    'h40w1000-s3-nopack': 'b5475497c27c4ee7',
    'h40w1000-s3-mixed': '460c7abbe19b5910',
}


def _bench():
    sys.path.insert(0, BENCH)
    try:
        import planner as bench_planner
    finally:
        sys.path.remove(BENCH)
    return bench_planner


def _dump(plan) -> dict:
    return {'decisions': [d.to_dict(trail=True) for d in plan.decisions],
            'trail': [[str(v) for v in d.trail] for d in plan.decisions],
            'ledger': plan.ledger.to_dict(), 'summary': plan.summary(),
            'gpus': [g.to_dict() for g in plan.gpus],
            'cu_owners': [[list(c) for c in g.cu_owners]
                          for g in plan.gpus]}


def digest(name: str) -> tuple[str, dict]:
    """The digest of case ``name`` and a few figures of its plans."""
    bench = _bench()
    hosts, count, seed, policy = CASES[name]
    fleet = bench.make_fleet(hosts, 8, seed)
    items = bench.make_workloads(count, seed + 1)
    conf = utils.conf(**policy)
    plan = av_planner.plan(conf, fleet, items)
    placed = [d for d in plan.decisions if d.placed]
    more = [dataclasses.replace(w, name='x' + w.name)
            for w in bench.make_workloads(count // 5, seed + 2)]
    again = av_planner.plan(conf, fleet, more, plan.ledger, placed)
    data = _dump(plan)
    data['incremental'] = _dump(again)
    text = json.dumps(data, sort_keys=True, default=str)
    figures = {'placed': plan.summary()['placed'],
               'priority': plan.summary()['placed_priority'],
               'incremental_placed': again.summary()['placed']}
    return hashlib.sha256(text.encode()).hexdigest()[:16], figures


class TestPlanStable(testtools.TestCase):

    def _check(self, name):
        found, figures = digest(name)
        self.assertEqual(DIGESTS[name], found,
                         'case %s now plans differently (%s)' % (
                             name, figures))


for _name in CASES:
    setattr(TestPlanStable, 'test_%s' % _name.replace('-', '_'),
            lambda self, n=_name: self._check(n))


if __name__ == '__main__':
    for _name in CASES:
        print('    %r: %r,  # %s' % ((_name,) + digest(_name)))
