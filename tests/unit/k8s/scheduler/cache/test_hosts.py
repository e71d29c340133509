"""The hosts beside the GPUs in the extender's cache: what every pod asks
of its node, whatever its scheduler; decisions that never over-commit a
host; the score that counts GPU capacity a host can no longer feed."""

from __future__ import annotations

from typing import Any

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.fit import host as fithost
from amdgpu_virt.k8s.scheduler import core
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import hosts as cachehosts
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing
from tests.unit.k8s.fit.test_placement import device

GI = 1 << 30


def _node(name: str, gpus: int, cpu: str, memory: str,
          devcore: int = 304) -> dict[str, Any]:
    devices = [device('%s-g%d' % (name, n), n, devcore=devcore)
               for n in range(gpus)]
    annotations = {hami.NODE_REGISTER: hami.encode_node_register(devices)} \
        if gpus else {}
    return {'metadata': {'name': name, 'annotations': annotations},
            'status': {'allocatable': {'cpu': cpu, 'memory': memory}}}


def _pod(name: str, cpu: str, memory: str, node: str = '',
         limits: dict[str, str] | None = None, phase: str = 'Running',
         **annotations: str) -> dict[str, Any]:
    spec: dict[str, Any] = {'containers': [{'name': 'c', 'resources': {
        'requests': {'cpu': cpu, 'memory': memory},
        'limits': limits or {}}}]}
    if node:
        spec['nodeName'] = node
    return {'metadata': {'name': name, 'namespace': 'ns',
                         'resourceVersion': '1',
                         'annotations': annotations},
            'spec': spec, 'status': {'phase': phase}}


class LedgerTest(testtools.TestCase):

    def test_counts_follow_pods_and_placements(self) -> None:
        ledger = cachehosts.HostLedger()
        ledger.set_allocatable('n1', fithost.HostAmount(8000, 16 * GI))
        ledger.set_allocatable('n2', fithost.HostAmount(8000, 16 * GI))
        self.assertIsNone(ledger.free('n3'))
        ledger.set_pod('ns/a', ('n1', fithost.HostAmount(2000, GI)))
        ledger.set_pod('ns/b', ('', fithost.HostAmount(1000, GI)))
        self.assertEqual(fithost.HostAmount(6000, 15 * GI), ledger.free('n1'))
        # the extender places b (not bound yet) on n2, with its request
        ledger.place('ns/b', 'n2', shown=True)
        self.assertEqual(fithost.HostAmount(7000, 15 * GI), ledger.free('n2'))
        # bound where it was placed: counted once
        ledger.set_pod('ns/b', ('n2', fithost.HostAmount(1000, GI)))
        ledger.place('ns/b', None)
        self.assertEqual(fithost.HostAmount(7000, 15 * GI), ledger.free('n2'))
        self.assertEqual(2, len(ledger))
        # an unreadable request makes the node's host unknown while it
        # lasts
        ledger.set_pod('ns/c', ('n1', None))
        self.assertIsNone(ledger.free('n1'))
        ledger.set_pod('ns/c', None)
        ledger.set_pod('ns/a', None)
        self.assertEqual(fithost.HostAmount(8000, 16 * GI), ledger.free('n1'))

    def test_a_fresh_list_recounts(self) -> None:
        ledger = cachehosts.HostLedger()
        ledger.load_nodes([('n1', fithost.HostAmount(8000, 16 * GI))])
        ledger.set_pod('ns/old', ('n1', fithost.HostAmount(4000, GI)))
        ledger.load_pods(
            [('ns/a', ('n1', fithost.HostAmount(1000, GI)))],
            [('ns/r', 'n1', fithost.HostAmount(500, GI), False)])
        self.assertEqual(fithost.HostAmount(6500, 14 * GI), ledger.free('n1'))


class CacheHostTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cache = schedcache.ClusterCache(mix=packing.Mix(refresh=1))
        self.cache.replace_nodes([_node('n1', 1, '8', '16Gi'),
                                  _node('n2', 1, '8', '16Gi')])
        self.cache.replace_pods([_pod('web', '6', '4Gi', 'n1')], 1)
        self.request = fit.pod_request(_pod('p', '4', '4Gi', limits={
            'amd.com/gpu': '1', 'amd.com/gpucores': '25',
            'amd.com/gpumem': '1024'}))

    def test_pods_without_gpus_take_the_host(self) -> None:
        self.assertEqual(fithost.HostAmount(2000, 12 * GI),
                         self.cache.host_free('n1'))
        decision = self.cache.decide_and_reserve('ns/p', self.request,
                                                 ['n1'])
        self.assertIsNone(decision.fit)
        self.assertIn('too little CPU or memory left on the host',
                      decision.failed['n1'])
        # the web pod finishes: n1 has room again
        self.cache.set_pod(_pod('web', '6', '4Gi', 'n1', phase='Succeeded'))
        self.assertIsNotNone(self.cache.decide_and_reserve(
            'ns/p', self.request, ['n1']).fit)

    def test_a_reservation_holds_the_host_until_the_pod_is_bound(
            self) -> None:
        decision = self.cache.decide_and_reserve('ns/p', self.request,
                                                 ['n2'])
        assert decision.fit is not None
        self.assertEqual(fithost.HostAmount(4000, 12 * GI),
                         self.cache.host_free('n2'))
        value = hami.encode_pod_devices(decision.fit.containers)
        self.cache.confirm('ns/p', 5)
        # the mirror seen, the pod not bound yet: still counted there
        mirrored = _pod('p', '4', '4Gi', **{hami.DEVICES_ALLOCATED: value,
                                            hami.VGPU_NODE: 'n2'})
        mirrored['metadata']['resourceVersion'] = '5'
        self.cache.set_pod(mirrored)
        self.assertEqual(0, self.cache.reservation_count())
        self.assertEqual(fithost.HostAmount(4000, 12 * GI),
                         self.cache.host_free('n2'))
        mirrored['spec']['nodeName'] = 'n2'
        self.cache.set_pod(mirrored)
        self.assertEqual(fithost.HostAmount(4000, 12 * GI),
                         self.cache.host_free('n2'))
        self.cache.delete_pod(mirrored)
        self.assertEqual(fithost.HostAmount(8000, 16 * GI),
                         self.cache.host_free('n2'))

    def test_first_fit_skips_a_full_host_too(self) -> None:
        cache = schedcache.ClusterCache()
        cache.replace_nodes([_node('n1', 1, '8', '16Gi'),
                             _node('n2', 1, '8', '16Gi')])
        cache.replace_pods([_pod('web', '6', '4Gi', 'n1')], 1)
        decision = cache.decide_and_reserve('ns/p', self.request,
                                            ['n1', 'n2'])
        assert decision.fit is not None
        self.assertEqual('n2', decision.fit.node)

    def test_stranding_of_pods_without_gpus(self) -> None:
        cache = schedcache.ClusterCache(mix=packing.Mix(refresh=1))
        cache.replace_nodes([_node('gpu', 8, '96', '1Ti'),
                             _node('cpu', 0, '96', '1Ti')])
        cache.replace_pods([], 1)
        # the recent GPU requests ask 10 cores each
        for number in range(5):
            cache.decide_and_reserve('ns/w%d' % number, fit.pod_request(
                _pod('w', '10', '8Gi', limits={'amd.com/gpu': '1'})),
                ['gpu'])
        # 46 cores left beside 3 idle GPUs
        costs = cache.stranding(['gpu', 'cpu', 'unknown'],
                                fithost.HostAmount(4000, 64 * GI))
        self.assertEqual({'gpu', 'cpu'}, set(costs))
        # 42 cores left: every recent request still fits, none lost
        self.assertEqual({'gpu': 0.0, 'cpu': 0.0}, costs)
        costs = cache.stranding(['gpu', 'cpu'],
                                fithost.HostAmount(40000, 64 * GI))
        # 6 cores left: at 10 cores per GPU they feed 0.6 of the 3 idle
        # GPUs; and what is left is lost to the next recent request too
        # (5 of them, beside the prior's 30 that ask nothing of hosts)
        self.assertGreater(costs['gpu'], 2.4 + 0.3)
        self.assertLessEqual(costs['gpu'], 2.4 + 3 * 5 / 35 + 1e-9)
        self.assertEqual(0.0, costs['cpu'])
        self.assertEqual({'gpu': 0, 'cpu': 10}, core.gpuless_scores(costs))
        self.assertEqual({'a': 10, 'b': 10},
                         core.gpuless_scores({'a': 0.0, 'b': 0.0}))


_gpu_request = st.builds(
    lambda nums, percent, cpu, memory: _pod(
        'x', '%dm' % cpu, '%dMi' % memory, limits={
            'amd.com/gpu': str(nums), 'amd.com/gpucores': str(percent),
            **({'amd.com/gpumem': '4096'} if percent < 100 else {})}),
    st.integers(1, 2), st.sampled_from((10, 25, 50, 100)),
    st.integers(0, 8000), st.integers(0, 16384))
#: ('gpu', pod) or ('bare', cpu millicores, MiB, node) or ('leave', n)
_ops = st.lists(st.one_of(
    st.tuples(st.just('gpu'), _gpu_request),
    st.tuples(st.just('bare'), st.integers(0, 6000), st.integers(0, 12000),
              st.sampled_from(('a', 'b', 'c'))),
    st.tuples(st.just('leave'), st.integers(0, 50))),
    min_size=1, max_size=40)


class HostPropertyTest(testtools.TestCase):

    @settings(max_examples=80, deadline=None)
    @given(_ops, st.booleans())
    def test_decisions_never_over_commit_a_host(self, ops: list[Any],
                                                packed: bool) -> None:
        nodes = {'a': (2, 8000, 16384), 'b': (1, 4000, 8192),
                 'c': (4, 16000, 32768)}
        cache = schedcache.ClusterCache(
            mix=packing.Mix(refresh=1) if packed else None, candidates=2)
        cache.replace_nodes([_node(n, g, '%dm' % c, '%dMi' % m, 104)
                             for n, (g, c, m) in nodes.items()])
        cache.replace_pods([], 1)
        live: dict[str, tuple[str, int, int, dict[str, Any]]] = {}
        version = 1
        for number, op in enumerate(ops):
            name = 'p%d' % number
            if op[0] == 'leave':
                if live:
                    key = sorted(live)[op[1] % len(live)]
                    cache.delete_pod(live.pop(key)[3])
                continue
            version += 1
            if op[0] == 'bare':
                # a pod of another scheduler, bound by it: it may
                # over-commit what this cache counts, never this cache
                _bare, cpu, memory, where = op
                obj = _pod(name, '%dm' % cpu, '%dMi' % memory, where)
                obj['metadata']['resourceVersion'] = str(version)
                cache.set_pod(obj)
                live['ns/' + name] = (where, cpu, memory, obj)
                continue
            obj = op[1]
            obj['metadata']['name'] = name
            request = fit.pod_request(obj)
            asked = request.host
            assert asked is not None
            before = {n: sum(c for w, c, _m, _o in live.values() if w == n)
                      for n in nodes}
            before_mem = {n: sum(m for w, _c, m, _o in live.values()
                                 if w == n) for n in nodes}
            decision = cache.decide_and_reserve('ns/' + name, request,
                                                sorted(nodes))
            if decision.fit is None:
                continue
            where = decision.fit.node
            cpu_total, mem_total = nodes[where][1], nodes[where][2]
            # never beyond what the host had left
            self.assertLessEqual(before[where] + asked.cpu, cpu_total)
            self.assertLessEqual(before_mem[where] * (1 << 20) +
                                 asked.memory, mem_total * (1 << 20))
            cache.confirm('ns/' + name, version)
            obj['metadata']['resourceVersion'] = str(version)
            obj['metadata']['annotations'] = {
                hami.DEVICES_ALLOCATED: hami.encode_pod_devices(
                    decision.fit.containers), hami.VGPU_NODE: where}
            obj['spec']['nodeName'] = where
            cache.set_pod(obj)
            live['ns/' + name] = (where, asked.cpu,
                                  asked.memory >> 20, obj)
        for view in cache.views(sorted(nodes))[0]:
            for gpu in view.gpus:
                self.assertLessEqual(gpu.used_slots, gpu.info.count)
                self.assertLessEqual(gpu.used_cores, gpu.info.devcore)
                self.assertLessEqual(gpu.used_mem, gpu.info.devmem)
