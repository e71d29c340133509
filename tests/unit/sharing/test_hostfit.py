"""The host beside the GPUs: recent host demands, what a free host cannot
hold of them, and the cost of a placement with the host counted."""

from __future__ import annotations

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt.sharing import hostfit
from amdgpu_virt.sharing import packing

GI = 1 << 30

_demand = st.tuples(st.integers(0, 64000), st.integers(0, 256 * GI))


class DemandsTest(testtools.TestCase):

    @given(st.lists(_demand, max_size=30), st.floats(0, 100),
           st.lists(_demand, min_size=1, max_size=10))
    def test_blocked_is_the_weight_of_what_does_not_fit(
            self, demands: list[tuple[int, int]], prior: float,
            frees: list[tuple[int, int]]) -> None:
        window = hostfit.Window(1000)
        for cpu, memory in demands:
            window.record(cpu, memory)
        found = window.demands(prior)
        total = len(demands) + prior
        for cpu, memory in frees:
            rounded = [hostfit.rounded(c, m) for c, m in demands]
            expected = sum(1 for c, m in rounded
                           if (c or m) and (c > cpu or m > memory)) / total \
                if total else 0.0
            self.assertAlmostEqual(expected, found.blocked(cpu, memory))
            # memoised answers are the same
            self.assertAlmostEqual(expected, found.blocked(cpu, memory))

    def test_the_window_forgets_old_requests(self) -> None:
        window = hostfit.Window(3)
        for cpu in (8000, 8000, 1000, 1000, 1000):
            window.record(cpu, GI)
        self.assertEqual(3, len(window))
        self.assertEqual(0.0, window.demands().blocked(1000, GI))
        window.record(8000, GI)
        self.assertAlmostEqual(1 / 3, window.demands().blocked(1000, GI))

    def test_requests_without_host_demand_never_block(self) -> None:
        window = hostfit.Window()
        window.record(0, 0)
        self.assertEqual((), window.demands().items)
        self.assertEqual(0.0, window.demands().blocked(0, 0))


class CostTest(testtools.TestCase):

    def test_without_blocking_the_gpu_cost_stands(self) -> None:
        self.assertEqual(0.25, hostfit.placement_cost(0.25, 1.0, 4.0, 0, 0))

    def test_a_request_that_exhausts_the_host_strands_what_is_usable(
            self) -> None:
        # 4 usable GPUs, all lost once the host is full
        self.assertEqual(3.0, hostfit.placement_cost(0.0, 1.0, 4.0, 0.0,
                                                     1.0))
        # the same request on a host that was full anyway uses stranded
        # capacity: the best place for it
        self.assertEqual(-1.0, hostfit.placement_cost(0.0, 1.0, 4.0, 1.0,
                                                      1.0))
        # a pod without GPU strands in proportion
        self.assertEqual(2.0, hostfit.placement_cost(0.0, 0.0, 4.0, 0.0,
                                                     0.5))

    @given(st.floats(0, 8), st.floats(0, 1), st.floats(0, 1),
           st.floats(0, 1))
    def test_cost_is_the_change_of_the_node_fragmentation(
            self, total: float, gpu_share: float, before: float,
            after: float) -> None:
        # F + b (T - F) before and after a placement taking `taken` that
        # adds `delta` to F
        fragment = total * gpu_share / 2
        taken = total * gpu_share / 2
        delta = 0.1 * taken
        node_before = fragment + before * (total - fragment)
        new_fragment = fragment + delta
        node_after = new_fragment + after * (total - taken - new_fragment)
        self.assertAlmostEqual(
            node_after - node_before,
            hostfit.placement_cost(delta, taken, total - fragment, before,
                                   after))

    def test_what_a_host_cannot_feed_at_the_mix_rate(self) -> None:
        rate = (10000.0, 8.0 * GI)
        self.assertEqual(0.0, hostfit.unfed(3.0, 40000, 64 * GI, rate))
        self.assertAlmostEqual(2.4, hostfit.unfed(3.0, 6000, 64 * GI, rate))
        # memory binds there
        self.assertAlmostEqual(2.0, hostfit.unfed(3.0, 40000, 8 * GI, rate))
        self.assertEqual(0.0, hostfit.unfed(3.0, 0, 0, (0.0, 0.0)))
        # a light request on a host short of CPU lowers what is unfed
        before = hostfit.unfed(3.0, 6000, 64 * GI, rate)
        after = hostfit.unfed(2.0, 5000, 60 * GI, rate)
        self.assertLess(hostfit.placement_cost(0, 1, 0, 0, 0, before,
                                               after), 0)

    def test_the_mix_feeds_the_score(self) -> None:
        mix = packing.Mix(refresh=1, prior_weight=0)
        mix.record([packing.Shape.whole_gpus(1)], (10000, 8 * GI))
        mix.record([packing.Shape.share(0.5, 0.1)], (10000, 8 * GI))
        self.assertEqual(1.0, mix.score.hosts.blocked(9000, 64 * GI))
        self.assertEqual(0.0, mix.score.hosts.blocked(10000, 8 * GI))
        # 20 cores and 16 GiB for 1.5 GPUs of capacity
        per_gpu = mix.score.hosts.per_gpu
        self.assertAlmostEqual(20000 / 1.5, per_gpu[0])
        self.assertAlmostEqual(16 * GI / 1.5, per_gpu[1])
