"""The cache's node indexes against a full recomputation, and what the
decisions on them admit."""

from __future__ import annotations

from typing import Any

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing
from tests.unit.k8s.fit.test_placement import device
from tests.unit.k8s.scheduler.cache.test_cluster import gpu_pod
from tests.unit.k8s.scheduler.cache.test_cluster import node

#: small nodes of mixed GPUs: MI300X, MI210, an RDNA card (CUs in pairs)
#: and a 20-CU card; 3 slots each so that slots run out too
NODES = {
    'a': [device('a0', 0, count=3), device('a1', 1, count=3)],
    'b': [device('b0', 0, count=3, devcore=104, devmem=65536)],
    'c': [device('c0', 0, count=3, devcore=96, devmem=49152, cuPerWGP=2),
          device('c1', 1, count=3, devcore=96, devmem=49152, cuPerWGP=2),
          device('c2', 2, count=3, devcore=96, devmem=49152, cuPerWGP=2)],
    'd': [device('d0', 0, count=3, devcore=20, devmem=16384)],
}
NAMES = sorted(NODES) + ['gone']

_container = st.builds(
    fit.ContainerRequest, st.just('c'), st.integers(1, 3),
    st.sampled_from((0, 1024, 8192, 40000)),
    st.sampled_from((1, 3, 5, 10, 25, 33, 50, 60, 99, 100)))
_request = st.builds(
    lambda containers, node_policy, gpu_policy, named: fit.PodRequest(
        tuple(containers), node_policy=node_policy, gpu_policy=gpu_policy,
        gpu_policy_set=named),
    st.lists(_container, min_size=1, max_size=2),
    st.sampled_from(('binpack', 'spread')),
    st.sampled_from(('spread', 'binpack', 'numa')), st.booleans())
#: ('place', request, seen by the watch?) or ('leave', which placed pod)
_ops = st.lists(st.one_of(
    st.tuples(st.just('place'), _request, st.booleans()),
    st.tuples(st.just('leave'), st.integers(0, 50), st.booleans())),
    min_size=1, max_size=40)


class _Run:
    """Feeds a cache the way the extender and its watch do."""

    def __init__(self, mix: packing.Mix | None) -> None:
        self.cache = schedcache.ClusterCache(mix=mix, candidates=2)
        self.cache.replace_nodes([node(n, d) for n, d in NODES.items()])
        self.cache.replace_pods([], 1)
        self.live: dict[str, dict[str, Any]] = {}
        self.version = 1
        self.number = 0

    def place(self, request: fit.PodRequest, seen: bool) -> fit.Decision:
        self.number += 1
        name = 'p%d' % self.number
        decision = self.cache.decide_and_reserve('ns/' + name, request,
                                                 NAMES)
        if decision.fit is not None:
            self.version += 1
            self.cache.confirm('ns/' + name, self.version)
            pod = gpu_pod(name, decision.fit.node, hami.encode_pod_devices(
                decision.fit.containers), rv=self.version)
            self.live[name] = pod
            if seen:
                self.cache.set_pod(pod)
        return decision

    def leave(self, which: int) -> None:
        if self.live:
            name = sorted(self.live)[which % len(self.live)]
            self.cache.delete_pod(self.live.pop(name))

    def settle(self) -> None:
        """The watch shows every live pod."""
        for pod in self.live.values():
            self.cache.set_pod(pod)

    def fresh(self) -> schedcache.ClusterCache:
        """The same cluster, listed from scratch."""
        cache = schedcache.ClusterCache()
        cache.replace_nodes([node(n, d) for n, d in NODES.items()])
        cache.replace_pods(list(self.live.values()), self.version)
        return cache


def _expected_index(cache: schedcache.ClusterCache
                    ) -> dict[str, tuple[int, int, int]]:
    result = {}
    for view in cache.views(sorted(NODES))[0]:
        buckets = schedcache.buckets_of(view)
        if buckets[0] >= 0 or buckets[1]:
            result[view.name] = buckets
    return result


class IndexPropertyTest(testtools.TestCase):

    @settings(max_examples=60, deadline=None)
    @given(_ops, st.booleans())
    def test_indexes_agree_with_a_recomputation(self, ops: list[Any],
                                                packed: bool) -> None:
        run = _Run(packing.Mix(refresh=1) if packed else None)
        for op, arg, seen in ops:
            if op == 'place':
                run.place(arg, seen)
            else:
                run.leave(arg)
            # reservations and all: the indexes follow the views
            self.assertEqual(_expected_index(run.cache),
                             run.cache.index_snapshot())
        run.settle()
        fresh = run.fresh()
        self.assertEqual(_expected_index(fresh), run.cache.index_snapshot())
        for name in NODES:
            mine, theirs = run.cache.view(name), fresh.view(name)
            assert mine is not None and theirs is not None
            self.assertEqual(theirs.gpus, mine.gpus)

    @settings(max_examples=60, deadline=None)
    @given(_ops)
    def test_the_score_never_over_commits(self, ops: list[Any]) -> None:
        run = _Run(packing.Mix(refresh=1))
        for op, arg, seen in ops:
            if op == 'place':
                decision = run.place(arg, seen)
                if decision.fit is not None:
                    # the chosen node really takes the pod, and no node
                    # is both failed and unresolvable
                    self.assertFalse(set(decision.failed) &
                                     set(decision.unresolvable))
                    self.assertNotIn(decision.fit.node, decision.failed)
            else:
                run.leave(arg)
        run.settle()
        for view in run.fresh().views(sorted(NODES))[0]:
            self.assertIsNone(view.problem)
            for gpu in view.gpus:
                self.assertLessEqual(gpu.used_slots, gpu.info.count)
                self.assertLessEqual(gpu.used_cores, gpu.info.devcore)
                self.assertLessEqual(gpu.used_mem, gpu.info.devmem)

    @settings(max_examples=60, deadline=None)
    @given(_ops)
    def test_hami_order_is_unchanged_by_the_indexes(self, ops: list[Any]
                                                    ) -> None:
        # without the score, the first node that fits in the policy's
        # order, as a walk over every node finds it
        run = _Run(None)
        for op, arg, seen in ops:
            if op == 'place':
                views, unknown = run.cache.views(NAMES)
                walk = fit.decide(views, arg, unknown)
                decision = run.place(arg, seen)
                self.assertEqual(
                    walk.fit.node if walk.fit else None,
                    decision.fit.node if decision.fit else None)
                # what the walk found unresolvable is so here too
                self.assertLessEqual(set(walk.unresolvable),
                                     set(decision.unresolvable))
                if decision.fit is None:
                    self.assertEqual(set(NAMES), set(decision.failed) |
                                     set(decision.unresolvable))
            else:
                run.leave(arg)
