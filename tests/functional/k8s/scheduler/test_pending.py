"""The filter takes its pod from the pod watch when it can, and a watch
that is behind costs a retry on the API's pod, never a booking lost or
left behind."""

from __future__ import annotations

import time
from typing import Any

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.scheduler import pending as schedpending
from amdgpu_virt.sharing import hami
from tests.functional.k8s import cluster

NODES = ('n1', 'n2')
SMALL = {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
         'amd.com/gpumem': '1024'}


class PendingFilterTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(NODES, gpus=1))
        self.server = self.cluster.kube.server
        self.service = self.cluster.service
        assert self.service is not None
        self.store = recordstore.RecordStore(self.cluster.api)

    def _records(self) -> dict[str, allocrecord.Record]:
        return {n: self.store.read(n)[0] for n in NODES}

    def _pod_reads(self, name: str) -> int:
        return sum(1 for line in self.server.requests
                   if line.startswith('GET ') and
                   line.split('?')[0].endswith('/pods/%s' % name))

    def _seen(self, name: str) -> None:
        deadline = time.monotonic() + 10
        while self.service.pending.get('team', name, self.server.get_object(
                'pods', name, 'team')['metadata']['uid']) is None:
            self.assertLess(time.monotonic(), deadline, 'never watched')
            time.sleep(0.01)

    def test_a_watched_pod_is_not_read_again(self) -> None:
        pod = self.cluster.create(cluster.gpu_pod('p', [SMALL]))
        self._seen('p')
        reads = self._pod_reads('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        self.assertEqual(reads, self._pod_reads('p'))
        self.assertIsNotNone(self._records()[node].find('team', 'p'))
        self.assertEqual(node, self.cluster.read_pod('team', 'p')[
            'metadata']['annotations'][hami.VGPU_NODE])

    def test_a_pod_bound_behind_the_watchs_back_is_refused(self) -> None:
        pod = self.cluster.create(cluster.gpu_pod('p', [SMALL]))
        self._seen('p')
        stale = schedpending.PendingPods()
        stale.observe('ADDED', self.cluster.read_pod('team', 'p'))
        self.service.extender.pending = stale
        # bound by someone else; this extender's watch has not shown it
        self.cluster.api.create_namespaced_pod_binding(
            'p', 'team', {'apiVersion': 'v1', 'kind': 'Binding',
                          'metadata': {'name': 'p', 'namespace': 'team'},
                          'target': {'apiVersion': 'v1', 'kind': 'Node',
                                     'name': 'n2'}},
            _preload_content=False)
        before = self._records()
        answer = self.cluster.filter(pod)
        self.assertIn('already bound to node n2', answer['Error'])
        # the booking made on the watch's pod was undone
        self.assertEqual(before, self._records())
        self.assertNotIn(hami.VGPU_NODE, self.cluster.read_pod(
            'team', 'p')['metadata'].get('annotations') or {})

    def test_a_pod_changed_behind_the_watchs_back_is_placed(self) -> None:
        pod = self.cluster.create(cluster.gpu_pod('p', [SMALL]))
        self._seen('p')
        stale = schedpending.PendingPods()
        stale.observe('ADDED', self.cluster.read_pod('team', 'p'))
        self.service.extender.pending = stale
        self.cluster.api.patch_namespaced_pod(
            'p', 'team', {'metadata': {'labels': {'x': 'y'}}},
            _content_type='application/merge-patch+json',
            _preload_content=False)
        node = self.cluster.filter(pod)['NodeNames'][0]
        records = self._records()
        self.assertIsNotNone(records[node].find('team', 'p'))
        # booked once: the refused attempt left nothing behind
        self.assertEqual([node], [n for n in NODES
                                  if records[n].find('team', 'p')])
        self.assertEqual(node, self.cluster.read_pod('team', 'p')[
            'metadata']['annotations'][hami.VGPU_NODE])

    def test_first_booking_never_replaces_one(self) -> None:
        pod = self.cluster.create(cluster.gpu_pod('p', [SMALL]))
        node = self.cluster.filter(pod)['NodeNames'][0]
        before = self._records()
        held = before[node].find('team', 'p')
        assert held is not None
        containers = hami.decode_pod_devices(self.cluster.read_pod(
            'team', 'p')['metadata']['annotations'][
                hami.DEVICES_ALLOCATED])
        bookings: Any = self.service.extender.bookings
        err = self.assertRaises(
            exception.WatchBehind, bookings.book, node,
            pod['metadata']['uid'], 'team', 'p', containers, first=True)
        self.assertIn('holds it already', str(err))
        self.assertEqual(before, self._records())

    def test_a_first_booking_whose_answer_was_lost_is_not_left(
            self) -> None:
        # the client sends a PUT again when its answer is lost (urllib3
        # retries idempotent methods); the second PUT, at the version the
        # first one changed, gets 409, and the record then holds the pod:
        # the filter's own booking, which must not stay behind when the
        # decision on the API's pod takes another node
        pod = self.cluster.create(cluster.gpu_pod('p', [SMALL]))
        self._seen('p')
        bookings: Any = self.service.extender.bookings
        records = bookings.records
        write = records._write
        lost: list[str] = []

        def answer_lost(node: str, new: Any, version: Any) -> Any:
            written = write(node, new, version)
            if not lost and new.find('team', 'p') is not None:
                lost.append(node)
                raise exception.KubernetesConflict(obj='configmap')
            return written

        cache = self.service.extender.cache
        decide = cache.decide_and_reserve

        def elsewhere(key: str, request: Any, candidates: Any) -> Any:
            # the second decision goes to the other node (its view of
            # the first one may have changed meanwhile)
            return decide(key, request, [n for n in candidates
                                         if n not in lost])

        self.useFixture(fixtures.MockPatchObject(records, '_write',
                                                 answer_lost))
        self.useFixture(fixtures.MockPatchObject(
            cache, 'decide_and_reserve', elsewhere))
        node = self.cluster.filter(pod)['NodeNames'][0]
        self.assertEqual(1, len(lost))
        self.assertNotEqual(lost[0], node)
        held = self._records()
        self.assertEqual([node], [n for n in NODES
                                  if held[n].find('team', 'p')])
        self.assertEqual(node, self.cluster.read_pod('team', 'p')[
            'metadata']['annotations'][hami.VGPU_NODE])
