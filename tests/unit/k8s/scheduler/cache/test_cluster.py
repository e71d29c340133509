"""The extender's cache: decoding, reservations, the list-then-watch loop."""

from __future__ import annotations

import threading
from typing import Any

import testtools

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import hami
from tests.unit.k8s.fit.test_placement import device
from tests.unit.k8s.fit.test_placement import pod as make_pod


def node(name: str, devices: list[hami.DeviceInfo] | None = None,
         value: str | None = None, **status: Any) -> dict[str, Any]:
    annotations = {}
    if value is not None:
        annotations[hami.NODE_REGISTER] = value
    elif devices is not None:
        annotations[hami.NODE_REGISTER] = hami.encode_node_register(devices)
    return {'metadata': {'name': name, 'annotations': annotations},
            'status': status}


def gpu_pod(name: str, node_name: str, value: str, rv: int = 1,
            phase: str = 'Pending', **annotations: str) -> dict[str, Any]:
    annotations = dict(annotations)
    annotations.setdefault(hami.DEVICES_ALLOCATED, value)
    annotations.setdefault(hami.VGPU_NODE, node_name)
    return {'metadata': {'name': name, 'namespace': 'ns',
                         'resourceVersion': str(rv),
                         'annotations': annotations},
            'spec': {}, 'status': {'phase': phase}}


class DecodeTest(testtools.TestCase):

    def test_nodes(self) -> None:
        self.assertEqual((), schedcache.decode_node(node('a')).devices)
        entry = schedcache.decode_node(node(
            'a', [device('g0'), device('g0', 1), device('x', kind='Instinct'),
                  device('g1', devcore=0)]))
        # every device of the AMD registration is AMD, whatever its type
        # (as HAMi's scheduler takes it)
        self.assertEqual(['g0', 'x'], [d.id for d in entry.devices])
        entry = schedcache.decode_node(node('a', [device('g0')],
                                            capacity={'amd.com/gpu': '0'}))
        self.assertIn('capacity 0', str(entry.problem))
        entry = schedcache.decode_node(node('a', value='[{"id": 3}, '
                                            '{"id": "g1", "count": 1, '
                                            '"devmem": 10, "devcore": 4, '
                                            '"type": "AMD", "health": true}]'))
        self.assertEqual(['g1'], [d.id for d in entry.devices])
        entry = schedcache.decode_node(node('a', value='[1, 2'))
        self.assertIn('unreadable hami.io/node-amd-register',
                      str(entry.problem))

    def test_pods(self) -> None:
        value = 'g0,AMD,10,4:;'
        entry = schedcache.decode_pod(gpu_pod('p', 'n', value, **{
            hami.CU_ALLOCATED: '{"g0": "0-3"}'}))
        assert entry is not None
        self.assertEqual(('ns/p', 'n', {'g0': 0xF}),
                         (entry.key, entry.node, entry.cu_masks))
        self.assertIsNone(schedcache.decode_pod(gpu_pod(
            'p', 'n', value, phase='Succeeded')))
        self.assertIsNone(schedcache.decode_pod(gpu_pod('p', '', value)))
        for bad in ({hami.DEVICES_ALLOCATED: 'g0,AMD:;'},
                    {hami.CU_ALLOCATED: '{"g0": "3-0"}'}):
            entry = schedcache.decode_pod(gpu_pod('p', 'n', value, **bad))
            assert entry is not None
            self.assertIn('pod ns/p carries an unreadable annotation',
                          str(entry.problem))


class CacheTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cache = schedcache.ClusterCache()
        self.cache.replace_nodes([node('n1', [device('g0')])])
        self.cache.replace_pods([], 1)
        self.request = fit.pod_request(make_pod({'amd.com/gpucores': 60,
                                                 'amd.com/gpumem': 1}))

    def test_reservations_stop_double_booking(self) -> None:
        self.assertTrue(self.cache.synced)
        first = self.cache.decide_and_reserve('ns/a', self.request, ['n1'])
        self.assertIsNotNone(first.fit)
        second = self.cache.decide_and_reserve('ns/b', self.request, ['n1'])
        self.assertIsNone(second.fit)
        self.assertIn('too few free CUs', second.failed['n1'])
        # a pod filtered again does not compete with itself
        again = self.cache.decide_and_reserve('ns/a', self.request, ['n1'])
        self.assertIsNotNone(again.fit)
        self.assertEqual('n1', self.cache.placement('ns/a'))
        self.cache.cancel('ns/a')
        self.assertIsNone(self.cache.placement('ns/a'))
        self.assertIsNotNone(self.cache.decide_and_reserve(
            'ns/b', self.request, ['n1']).fit)

    def test_reservation_lasts_until_the_watch_catches_up(self) -> None:
        decision = self.cache.decide_and_reserve('ns/a', self.request,
                                                 ['n1'])
        assert decision.fit is not None
        value = hami.encode_pod_devices(decision.fit.containers)
        self.cache.confirm('ns/a', 10)
        # an older event (without the annotations) does not end it
        stale = gpu_pod('a', 'n1', value, rv=9)
        del stale['metadata']['annotations'][hami.DEVICES_ALLOCATED]
        self.cache.set_pod(stale)
        self.assertEqual(1, self.cache.reservation_count())
        self.assertEqual(182, self.cache.view('n1').gpus[0].used_cores)
        self.cache.set_pod(gpu_pod('a', 'n1', value, rv=10))
        self.assertEqual(0, self.cache.reservation_count())
        self.assertEqual(182, self.cache.view('n1').gpus[0].used_cores)
        self.cache.delete_pod(gpu_pod('a', 'n1', value, rv=11))
        self.assertEqual(0, self.cache.view('n1').gpus[0].used_cores)

    def test_relist_ends_seen_reservations(self) -> None:
        self.cache.decide_and_reserve('ns/a', self.request, ['n1'])
        self.cache.confirm('ns/a', 5)
        self.cache.decide_and_reserve('ns/b', fit.pod_request(make_pod(
            {'amd.com/gpucores': 10, 'amd.com/gpumem': 1})), ['n1'])
        self.cache.replace_pods([], 7)
        # a is gone from the list: its reservation ends; b is in flight
        self.assertIsNone(self.cache.placement('ns/a'))
        self.assertEqual('n1', self.cache.placement('ns/b'))

    def test_a_reservation_in_flight_outranks_a_listed_placement(
            self) -> None:
        # b is reserved on n1 and not confirmed; the list still shows it
        # on n2 (an older allocation): n1 holds it and n2 does not count
        # it, until the reservation ends
        self.cache.set_node(node('n2', [device('h0')]))
        self.cache.decide_and_reserve('ns/b', self.request, ['n1'])
        listed = schedcache.decode_pod(gpu_pod('b', 'n2', 'h0,AMD,10,30:;',
                                               rv=3))
        assert listed is not None
        self.cache.load_pods([('ns/b', listed, None), ('ns/c', None, None)],
                             4)
        self.assertEqual('n1', self.cache.placement('ns/b'))
        # the pods per node agree with the placements
        by_node: dict[str, set[str]] = {}
        for key, where in self.cache._placed.items():
            by_node.setdefault(where, set()).add(key)
        self.assertEqual(by_node, self.cache._by_node)
        self.assertEqual(0, self.cache.view('n2').gpus[0].used_cores)
        self.assertEqual(182, self.cache.view('n1').gpus[0].used_cores)
        self.cache.cancel('ns/b')
        self.assertEqual('n2', self.cache.placement('ns/b'))
        # the same after the reservation's end, key by key
        self.assertEqual({'n2': {'ns/b'}}, self.cache._by_node)
        self.assertEqual(30, self.cache.view('n2').gpus[0].used_cores)
        self.assertEqual(0, self.cache.view('n1').gpus[0].used_cores)

    def test_a_pod_listed_twice_counts_once_where_it_was_listed_last(
            self) -> None:
        self.cache.set_node(node('n2', [device('h0')]))
        first = schedcache.decode_pod(gpu_pod('b', 'n1', 'g0,AMD,10,30:;'))
        last = schedcache.decode_pod(gpu_pod('b', 'n2', 'h0,AMD,10,20:;'))
        assert first is not None and last is not None
        self.cache.load_pods([('ns/b', first, None), ('ns/b', last, None)],
                             4)
        self.assertEqual('n2', self.cache.placement('ns/b'))
        self.assertEqual({'n2': {'ns/b'}}, self.cache._by_node)
        self.assertEqual(0, self.cache.view('n1').gpus[0].used_cores)
        self.assertEqual(20, self.cache.view('n2').gpus[0].used_cores)

    def test_a_node_change_the_cache_does_not_read_keeps_its_view(
            self) -> None:
        self.cache.set_node(node('n2', [device('h0')]))
        view = self.cache.view('n2')
        locked = node('n2', [device('h0')])
        locked['metadata']['annotations'][hami.NODE_LOCK] = 'held'
        self.cache.set_node(locked)
        self.assertIs(view, self.cache.view('n2'))
        # what the cache reads changes: read again
        self.cache.set_node(node('n2', [device('h0'), device('h1', 1)]))
        self.assertEqual(['h0', 'h1'], [g.info.id for g in
                                        self.cache.view('n2').gpus])
        self.cache.set_node(node('n2', [device('h0'), device('h1', 1)],
                                 allocatable={'cpu': '8',
                                              'memory': '1Gi'}))
        self.assertEqual(8000, self.cache.host_free('n2').cpu)

    def test_node_events(self) -> None:
        self.cache.set_node(node('n2', [device('h0')]))
        self.assertEqual(2, self.cache.node_count())
        views, unknown = self.cache.views(['n1', 'n2', 'n3'])
        self.assertEqual(['n1', 'n2'], [v.name for v in views])
        self.assertEqual(['n3'], unknown)
        self.cache.delete_node('n2')
        self.assertIsNone(self.cache.view('n2'))

    def test_threads_never_overbook(self) -> None:
        small = fit.pod_request(make_pod({'amd.com/gpucores': 10,
                                          'amd.com/gpumem': 1}))
        won: list[str] = []

        def worker(n: int) -> None:
            for m in range(10):
                key = 'ns/p%d-%d' % (n, m)
                if self.cache.decide_and_reserve(key, small, ['n1']).fit:
                    won.append(key)

        threads = [threading.Thread(target=worker, args=(n,))
                   for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # 10 slots, 30 CUs each of 304
        self.assertEqual(10, len(won))
        self.assertEqual(300, self.cache.view('n1').gpus[0].used_cores)
