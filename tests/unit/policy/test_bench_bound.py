"""The upper bound of bench/gpushare_bound.py on cases small enough to
know the best placement by hand: no placement ever beats the bound, and
where the best placement is known the bound is exactly it."""

from __future__ import annotations

import importlib
import os
import sys

import testtools

BENCH = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'bench')


def _bench():
    sys.path.insert(0, BENCH)
    try:
        return (importlib.import_module('gpushare_bound'),
                importlib.import_module('_gpushare_model'))
    finally:
        sys.path.remove(BENCH)


class BoundTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.bench, self.model = _bench()
        self.preset = self.model.PRESETS['today']

    def cluster(self, *kinds):
        return [self.model.Node('n%d' % i, gpus, name, 16 * gpus, 256 * gpus)
                for i, (gpus, name) in enumerate(kinds)]

    def share(self, percent, n=0):
        return self.model.Task('s%d-%d' % (percent, n), 1, percent, 1024,
                               1, 4)

    def whole(self, gpus, n=0):
        return self.model.Task('w%d-%d' % (gpus, n), gpus, 100, 0, 1, 8)

    def test_shares_that_pair_up_fill_their_gpus(self):
        # 81 % + 10 % fit one MI300X (246 + 30 of 304 CUs): all of it
        cluster = self.cluster((2, 'MI300X'))
        tasks = [self.share(81, 0), self.share(81, 1), self.share(10, 0),
                 self.share(10, 1)]
        value, _columns = self.bench.bound(cluster, tasks)
        self.assertAlmostEqual(1.82, value)

    def test_two_large_shares_never_share_a_gpu(self):
        # three 60 % shares, two GPUs: 2 x 182 CUs > 304, so two at most
        cluster = self.cluster((2, 'MI300X'))
        tasks = [self.share(60, n) for n in range(3)]
        value, _columns = self.bench.bound(cluster, tasks)
        self.assertAlmostEqual(1.2, value)

    def test_percent_rounding_and_slots_count(self):
        # 10 shares of 10 % fill the slots of one GPU; on a 104-CU MI210
        # 10 % is 10 CUs, so the eleventh share needs a second GPU
        cluster = self.cluster((1, 'MI210'))
        tasks = [self.share(10, n) for n in range(11)]
        value, _columns = self.bench.bound(cluster, tasks)
        self.assertAlmostEqual(1.0, value)

    def test_whole_tasks_need_a_wide_enough_node_kind(self):
        # an 8-GPU task cannot use the GPUs of 4-GPU nodes
        cluster = self.cluster((4, 'MI300X'), (4, 'MI300X'))
        value, _columns = self.bench.bound(cluster, [self.whole(8),
                                                     self.whole(4)])
        self.assertAlmostEqual(4.0, value)

    def test_no_policy_beats_the_bound(self):
        # the trace's workload on a small cluster: best-fit placing the
        # offered tasks one by one never allocates more than the bound
        cluster = self.model.make_cluster(30, 1, self.preset)
        total = sum(len(n.gpus) for n in cluster)
        tasks = self.bench.offered(self.model.make_tasks(
            cluster, 1, self.model.MIXES['trace']), total, 1.0)
        value, _columns = self.bench.bound(cluster, tasks)
        allocated = 0.0
        for task in tasks:
            choices = []
            for node in cluster:
                if not node.room(task):
                    continue
                if task.whole:
                    idle = [g for g in node.gpus if g.idle]
                    if len(idle) >= task.gpus:
                        choices.append((node.free, node, idle[:task.gpus]))
                    continue
                for gpu in node.fitting(task):
                    choices.append((gpu.free, node, [gpu]))
            if choices:
                _free, node, gpus = min(choices, key=lambda c: c[0])
                allocated += self.model.apply((node, gpus), task)
        self.assertGreater(allocated, 0.8 * total)
        self.assertLessEqual(allocated, value + 1e-9)
        self.assertLessEqual(value, total)
