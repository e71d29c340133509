"""The packed decision's node ranking: summary keys against the full fit,
and the memo that keeps them across refreshes of the request mix."""

from __future__ import annotations

from typing import Any

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.fit import rank as fitrank
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing
from tests.unit.k8s.fit.test_placement import device
from tests.unit.k8s.scheduler.cache.test_index import NODES
from tests.unit.k8s.scheduler.cache.test_index import _ops
from tests.unit.k8s.scheduler.cache.test_index import _Run

_one = st.builds(
    fit.ContainerRequest, st.just('c'), st.integers(1, 3),
    st.sampled_from((0, 1024, 8192, 40000)),
    st.sampled_from((1, 3, 5, 10, 25, 33, 50, 60, 99, 100)))


def _score() -> packing.Score:
    return packing.score_of()


def _view(*used: tuple[int, int, int]) -> fit.NodeView:
    """An 8-GPU MI300X node whose GPU i already has ``used[i]`` (slots,
    CUs, MiB) taken by one pod each."""
    devices = [device('g%d' % i, i) for i in range(8)]
    pods = []
    for index, (slots, cus, mem) in enumerate(used):
        for number in range(slots):
            pods.append(('ns/p%d-%d' % (index, number), ((
                hami.ContainerDevice('g%d' % index, 'AMD', mem // slots,
                                         cus // slots),),), None))
    return fit.build_view('n', devices, pods)


class FastKeyTest(testtools.TestCase):

    @settings(max_examples=60, deadline=None)
    @given(_ops, st.lists(_one, min_size=1, max_size=6))
    def test_summary_key_agrees_with_the_full_fit(
            self, ops: list[Any], wants: list[fit.ContainerRequest]) -> None:
        # on any state random placements and departures leave, the key
        # from the summary says "cannot hold it" exactly when the full
        # fit finds no room
        run = _Run(packing.Mix(refresh=1))
        for op, arg, seen in ops:
            if op == 'place':
                run.place(arg, seen)
            else:
                run.leave(arg)
        score = _score()
        for view in run.cache.views(sorted(NODES))[0]:
            if view.problem:
                continue   # in no index: never ranked
            for want in wants:
                request = fit.PodRequest((want,))
                self.assertIs(want, fitrank.summary_ranked(request))
                key = fitrank.fast_key(score, view, want)
                placed = fit.fit_node(view, request, score=score)
                self.assertEqual(key is None, isinstance(placed, str),
                                 (view.name, want, placed))

    def test_multi_gpu_share_takes_the_cheapest_gpus(self) -> None:
        score = _score()
        # GPUs 0 and 1 half used, the others idle: two 25 % shares go on
        # the half-used ones (no idle GPU broken), which the key says
        view = _view((1, 152, 98304), (1, 152, 98304))
        want = fit.ContainerRequest('c', 2, 49152, 25)
        key = fitrank.fast_key(score, view, want)
        assert key is not None
        placed = fit.fit_node(view, fit.PodRequest((want,)), score=score)
        assert isinstance(placed, fit.NodeFit)
        self.assertEqual({'g0', 'g1'}, {d.uuid for d in placed.containers[0]})
        self.assertEqual(key[0], fitrank.placement_key(
            score, view, placed.containers)[0])
        # the same pair on idle GPUs would cost more
        idle = _view()
        other = fitrank.fast_key(score, idle, want)
        assert other is not None
        self.assertLess(key[0], other[0])
        # more shares than GPUs with room: none
        self.assertIsNone(fitrank.fast_key(
            score, _view(*[(10, 0, 0)] * 7), want))

    def test_requests_that_need_the_full_fit(self) -> None:
        want = fit.ContainerRequest('c', 2, 1024, 10)
        self.assertIsNone(fitrank.summary_ranked(fit.PodRequest(
            (want,), gpu_policy='numa')))
        self.assertIsNone(fitrank.summary_ranked(fit.PodRequest(
            (want, want))))
        self.assertIsNone(fitrank.summary_ranked(fit.PodRequest(
            (want,), use_types=('mi300x',))))
        whole = fit.ContainerRequest('c', 2)
        self.assertIs(whole, fitrank.summary_ranked(fit.PodRequest(
            (fit.ContainerRequest('init'), whole), gpu_policy='numa')))


class KeyMemoTest(testtools.TestCase):

    def test_keys_survive_a_refresh_and_are_renewed_in_bounds(self) -> None:
        first = packing.score_of([(packing.Shape.share(0.5, 0.5), 1.0)])
        second = packing.score_of([(packing.Shape.share(0.05, 0.05), 1.0)])
        memo = fitrank.KeyMemo(renew=1)
        want = fit.ContainerRequest('c', 1, 1024, 10)
        views = [_view((1, 30 * n, 1024)) for n in range(1, 4)]
        memo.begin(first)
        old = [memo.key(v, want, 'shape') for v in views]
        self.assertEqual(3, memo.computed)
        memo.begin(first)
        self.assertEqual(old, [memo.key(v, want, 'shape') for v in views])
        self.assertEqual(3, memo.computed)
        # a new mix: one key renewed per decision, the others as they were
        memo.begin(second)
        keys = [memo.key(v, want, 'shape') for v in views]
        self.assertEqual(fitrank.fast_key(second, views[0], want), keys[0])
        self.assertEqual(old[1:], keys[1:])
        self.assertEqual((4, 2), (memo.computed, memo.stale_used))
        memo.begin(second)
        memo.begin(second)
        for _ in range(2):
            memo.begin(second)
            for view in views:
                memo.key(view, want, 'shape')
        self.assertEqual([fitrank.fast_key(second, v, want) for v in views],
                         [memo.key(v, want, 'shape') for v in views])

    def test_cannot_hold_is_never_stale_and_size_is_bounded(self) -> None:
        memo = fitrank.KeyMemo(size=2, renew=0)
        full = _view(*[(10, 0, 0)] * 8)
        want = fit.ContainerRequest('c', 1, 1024, 10)
        memo.begin(_score())
        self.assertIsNone(memo.key(full, want, 'a'))
        memo.begin(packing.score_of([(packing.Shape.whole_gpus(1), 1.0)]))
        self.assertIsNone(memo.key(full, want, 'a'))
        self.assertEqual(0, memo.stale_used)
        memo.key(full, want, 'b')
        memo.key(full, want, 'c')
        self.assertEqual(2, len(memo))
