"""The fragmentation score: shapes, the request mix, placement costs."""

from __future__ import annotations

from typing import Any

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt.sharing import packing


def gpu(cus: float = 1.0, mem: float = 1.0, slot: bool = True,
        idle: bool | None = None) -> packing.GpuFree:
    return packing.GpuFree(cus, mem, slot,
                           cus >= 1.0 and mem >= 1.0 if idle is None
                           else idle)


class ShapeTest(testtools.TestCase):

    def test_prior(self) -> None:
        prior = packing.parse_prior(['0.25:3', '2', '8:0.5'])
        self.assertEqual([(packing.Shape.share(0.25, 0.25), 3.0),
                          (packing.Shape.whole_gpus(2), 1.0),
                          (packing.Shape.whole_gpus(8), 0.5)], list(prior))
        for bad in ('x', '0:1', '1.5:1', '0.5:-1', '100', '0.5:w'):
            self.assertRaisesRegex(exception.ConfigError, 'SIZE:WEIGHT',
                                   packing.parse_prior, [bad])

    def test_weights_sum_to_one(self) -> None:
        weights = packing.Weights.of(packing.parse_prior(
            packing.DEFAULT_PRIOR))
        total = sum(w for _c, _m, _b, w in weights.shares) + \
            sum(w for _k, w in weights.wholes)
        self.assertAlmostEqual(1.0, total)
        self.assertEqual(packing.Weights((), ()), packing.Weights.of([]))


class ScoreTest(testtools.TestCase):

    def test_fragments_by_shape(self) -> None:
        score = packing.Score(packing.Weights.of([
            (packing.Shape.share(0.5, 0.5), 1.0),
            (packing.Shape.whole_gpus(2), 1.0)]))
        # 0.3 free: too little for a half, and not idle
        self.assertAlmostEqual(0.5 * 0.3, score.share_fragment(0.3, 1.0,
                                                               True))
        # enough CUs but no slot, or no memory: all of it is fragment
        self.assertAlmostEqual(0.5 * 0.6, score.share_fragment(0.6, 1.0,
                                                               False))
        self.assertAlmostEqual(0.5 * 0.6, score.share_fragment(0.6, 0.2,
                                                               True))
        self.assertEqual(0.0, score.share_fragment(0.6, 0.6, True))
        # two idle GPUs hold the pair: only the partial free counts
        self.assertAlmostEqual(0.5 * 0.3, score.whole_fragment(2, 0.3))
        self.assertAlmostEqual(0.5 * 1.3, score.whole_fragment(1, 0.3))

    def test_filling_a_fragment_beats_opening_an_idle_gpu(self) -> None:
        score = packing.Score(packing.Weights.of(packing.parse_prior(
            packing.DEFAULT_PRIOR)))
        node = [gpu(), gpu(), gpu(0.25, 0.25, idle=False)]
        into_fragment = packing.placement_cost(
            score, node, {2: packing.after(node[2], 0.25, 0.25, True)})
        into_idle = packing.placement_cost(
            score, node, {0: packing.after(node[0], 0.25, 0.25, True)})
        self.assertLess(into_fragment, into_idle)

    @given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20),
                              st.booleans()), min_size=1, max_size=8),
           st.integers(0, 7), st.integers(1, 20), st.integers(0, 20),
           st.booleans())
    def test_costs_are_differences_of_fragmentation(
            self, raw: list[Any], index: int, cus: int, mem: int,
            slot: bool) -> None:
        score = packing.Score(packing.Weights.of(packing.parse_prior(
            packing.DEFAULT_PRIOR)))
        node = [gpu(c / 20, m / 20, s, c == 20 and m == 20 and s)
                for c, m, s in raw]
        index %= len(node)
        share, room = min(cus / 20, node[index].cus), mem / 20
        new = packing.after(node[index], share, room, slot)
        changed = list(node)
        changed[index] = new
        expected = score.node_fragment(changed) - score.node_fragment(node)
        cost = packing.placement_cost(score, node, {index: new})
        self.assertAlmostEqual(expected, cost, places=6)
        idle = sum(1 for g in node if g.idle)
        partial = sum(g.cus for g in node if not g.idle)
        self.assertAlmostEqual(cost, packing.share_cost(
            score, node[index], share, room, slot, idle, partial), places=3)


class OneRangeTest(testtools.TestCase):
    """When a consumer must get one range of CUs, the free ranges count."""

    def test_runs_of(self) -> None:
        # CUs 0-1 and 4-7 free on an 8-CU GPU
        self.assertEqual((0.25, 0.5), packing.runs_of(0b11110011, 8))
        self.assertEqual((), packing.runs_of(0, 8))

    def test_ranges_too_short_are_fragment(self) -> None:
        score = packing.Score(packing.Weights.of([
            (packing.Shape.share(0.3, 0.1), 1.0)]))
        # half a GPU free: in one range it holds the share ...
        self.assertEqual(0.0, score.share_fragment(0.5, 1.0, True,
                                                   runs=(0.5,)))
        # ... in two quarters it does not, though the count says it does
        self.assertAlmostEqual(0.5, score.share_fragment(0.5, 1.0, True,
                                                         runs=(0.25, 0.25)))
        self.assertEqual(0.0, score.share_fragment(0.5, 1.0, True))
        # the short range alone is fragment next to a long one
        self.assertAlmostEqual(0.2, score.share_fragment(
            0.6, 1.0, True, runs=(0.2, 0.4)))
        # no slot or no memory: every range
        self.assertAlmostEqual(0.6, score.share_fragment(
            0.6, 1.0, False, runs=(0.2, 0.4)))
        self.assertAlmostEqual(0.6, score.share_fragment(
            0.6, 0.05, True, runs=(0.2, 0.4)))

    def test_cost_prefers_keeping_a_long_range(self) -> None:
        score = packing.Score(packing.Weights.of([
            (packing.Shape.share(0.5, 0.1), 1.0),
            (packing.Shape.share(0.1, 0.1), 1.0)]))
        # two GPUs with 0.6 free: one range, or a 0.1 and a 0.5 range;
        # a 0.1 share that fills the short range keeps both halves usable
        whole = packing.GpuFree(0.6, 1.0, True, False, runs=(0.6,))
        split = packing.GpuFree(0.6, 1.0, True, False, runs=(0.1, 0.5))
        into_whole = packing.share_cost(score, whole, 0.1, 0.1, True, 0,
                                        1.2, runs_after=(0.5,))
        into_split = packing.share_cost(score, split, 0.1, 0.1, True, 0,
                                        1.2, runs_after=(0.5,))
        self.assertLess(into_split, into_whole)
        options = [packing.Option((whole, split), 0, 0.1, 0.1,
                                  runs_after=(0.5,)),
                   packing.Option((whole, split), 1, 0.1, 0.1,
                                  runs_after=(0.5,))]
        self.assertEqual(1, packing.best(score, options))
        # without ranges both GPUs look alike: the first wins the tie
        plain = (packing.GpuFree(0.6, 1.0, True, False),) * 2
        self.assertEqual(0, packing.best(score, [
            packing.Option(plain, 0, 0.1, 0.1),
            packing.Option(plain, 1, 0.1, 0.1)]))

    def test_tightest_run(self) -> None:
        self.assertAlmostEqual(0.1, packing.tightest_run((0.2, 0.4), 0.1))
        self.assertAlmostEqual(0.1, packing.tightest_run((0.2, 0.4), 0.3))
        self.assertEqual(1.0, packing.tightest_run((0.2,), 0.3))

    @given(st.lists(st.integers(1, 8), min_size=1, max_size=4),
           st.integers(0, 3), st.integers(1, 8))
    def test_ranged_costs_are_differences_of_fragmentation(
            self, lengths: list[int], which: int, take: int) -> None:
        score = packing.Score(packing.Weights.of(packing.parse_prior(
            packing.DEFAULT_PRIOR)))
        runs = tuple(sorted(n / 16 for n in lengths))
        which %= len(runs)
        take = min(take, lengths[which])
        left = list(runs)
        left[which] -= take / 16
        left_runs = tuple(sorted(r for r in left if r > 1e-9))
        before = packing.GpuFree(sum(runs), 1.0, True, False, runs=runs)
        new = packing.after(before, take / 16, 0.0, True, runs=left_runs)
        other = gpu()
        expected = score.node_fragment([new, other]) - \
            score.node_fragment([before, other])
        self.assertAlmostEqual(expected, packing.placement_cost(
            score, [before, other], {0: new}), places=6)
        self.assertAlmostEqual(expected, packing.share_cost(
            score, before, take / 16, 0.0, True, 1, before.cus,
            runs_after=left_runs), places=3)


class MixTest(testtools.TestCase):

    def test_prior_then_what_is_asked(self) -> None:
        mix = packing.Mix(packing.parse_prior(['8']), window=4,
                          prior_weight=1, refresh=1)
        self.assertEqual(((8, 1.0),), mix.score.weights.wholes)
        half = packing.Shape.share(0.5, 0.5)
        for _ in range(6):
            mix.record([half])
        weights = mix.score.weights
        # the window keeps 4 requests; the prior weighs one
        self.assertEqual(((0.5, 0.5, 0, 0.8),), weights.shares)
        self.assertEqual(((8, 0.2),), weights.wholes)

    def test_score_is_kept_between_refreshes(self) -> None:
        mix = packing.Mix(refresh=3)
        first = mix.score
        mix.record([packing.Shape.whole_gpus(1)])
        self.assertIs(first, mix.score)
        mix.record([])
        mix.record([])
        self.assertIsNot(first, mix.score)


class PlannerEntryTest(testtools.TestCase):

    def test_best_fills_a_fragment_and_spares_big_hosts(self) -> None:
        score = packing.score_of([(packing.Shape.share(0.25, 0.25), 4.0),
                                  (packing.Shape.whole_gpus(8), 1.0)])
        big = tuple(gpu() for _ in range(8))
        small = (gpu(),)
        used = (gpu(0.25, 0.25, idle=False), gpu())
        options = [packing.Option(big, 0, 0.25, 0.25),
                   packing.Option(small, 0, 0.25, 0.25),
                   packing.Option(used, 1, 0.25, 0.25),
                   packing.Option(used, 0, 0.25, 0.25)]
        # the partly used GPU, exactly filled
        self.assertEqual(3, packing.best(score, options))
        # without it: the one-GPU host rather than breaking the 8-GPU one
        self.assertEqual(1, packing.best(score, options[:2]))
        self.assertIsNone(packing.best(score, []))
        self.assertEqual(packing.parse_prior(packing.DEFAULT_PRIOR)[0][0].cus,
                         packing.score_of().weights.shares[0][0])
