"""The extender against direct callers, lost answers, deleted pods, rivals.

Anyone who reaches the extender's port may call ``/filter`` and
``/bind``; the API may fail or lose answers (the fault proxy in front of
the API server stand-in); pods are deleted at any time; a second
extender may run. Each test attacks and then checks that nothing was
booked or bound that should not be, and that no lock is left behind.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import testtools

from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.scheduler import fencing
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import faultproxy
from tests.functional.k8s import cluster

NODES = ('n1', 'n2')
SMALL = {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
         'amd.com/gpumem': '1024'}


class _Base(testtools.TestCase):

    faults: dict[str, Any] | None = None
    overrides: dict[tuple[str, str], Any] | None = None
    extenders = 1

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(
            NODES, gpus=1, faults=self.faults, overrides=self.overrides,
            extenders=self.extenders))
        self.server = self.cluster.kube.server
        self.store = recordstore.RecordStore(self.cluster.api)

    def _pod(self, name: str, namespace: str = 'team',
             limits: dict[str, str] | None = None) -> dict[str, Any]:
        return self.cluster.create(cluster.gpu_pod(
            name, [limits or SMALL], namespace=namespace))

    def _records(self) -> dict[str, allocrecord.Record]:
        return {n: self.store.read(n)[0] for n in NODES}

    def _lock(self, node: str) -> str | None:
        return (self.server.get_object('nodes', node)['metadata'].get(
            'annotations') or {}).get(hami.NODE_LOCK)


class DirectCallerTest(_Base):
    """Threat 3: requests that kube-scheduler would never send."""

    def test_filter_refuses_a_bound_pod(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))
        before = self._records()
        answer = self.cluster.filter(pod)
        self.assertIn('already bound to node %s' % node, answer['Error'])
        self.assertEqual(before, self._records())

    def test_forged_pod_bodies_are_not_trusted(self) -> None:
        pod = self._pod('p')
        forged = dict(pod, metadata=dict(pod['metadata'], uid='forged'))
        self.assertIn('is not the uid of pod team/p',
                      self.cluster.filter(forged)['Error'])
        # a body that asks for more than the pod does books what the pod
        # asks for
        bigger = cluster.gpu_pod('p', [{'amd.com/gpu': '1'}])
        bigger['metadata']['uid'] = pod['metadata']['uid']
        node = self.cluster.filter(bigger)['NodeNames'][0]
        grants = self._records()[node].find('team', 'p')
        assert grants is not None
        self.assertEqual(1024, grants.containers[0][0].mem)
        self.assertEqual(76, grants.containers[0][0].cus.bit_count())

    def test_pods_of_another_scheduler_are_refused(self) -> None:
        pod = self.server.put_object('pods', cluster.gpu_pod(
            'other', [SMALL], namespace='secure'))
        self.assertEqual('default-scheduler', pod['spec']['schedulerName'])
        self.assertIn("is not this extender's profile",
                      self.cluster.filter(pod)['Error'])
        self.assertIn("is not this extender's profile",
                      self.cluster.bind(pod, 'n1')['Error'])
        self.assertIsNone(self.server.get_object(
            'pods', 'other', 'secure')['spec'].get('nodeName'))
        self.assertEqual({}, {n: r.pods for n, r in self._records().items()
                              if r.pods})

    def test_bind_to_a_node_the_record_does_not_name(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        other = next(n for n in NODES if n != node)
        answer = self.cluster.bind(pod, other)
        self.assertIn('does not place pod team/p', answer['Error'])
        self.assertIsNone(self.cluster.read_pod('team', 'p')['spec'].get(
            'nodeName'))
        self.assertIsNone(self._lock(other))
        # a pod never filtered is not bound either
        lone = self._pod('lone')
        self.assertIn('does not place pod team/lone',
                      self.cluster.bind(lone, node)['Error'])

    def test_pod_deleted_mid_allocation_leaves_nothing_booked(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        self.assertIsNotNone(self._records()[node].find('team', 'p'))
        self.cluster.api.delete_namespaced_pod('p', 'team')
        self.assertTrue(faultproxy.wait_for(
            lambda: self._records()[node].find('team', 'p') is None),
            'the booking of a deleted pod stayed')
        answer = self.cluster.bind(pod, node)
        self.assertIn('GET pod team/p', answer['Error'])
        self.assertIsNone(self._lock(node))

    def test_the_sweep_removes_what_nobody_holds(self) -> None:
        live = self._pod('live')
        node = self.cluster.filter(live)['NodeNames'][0]
        stale = self._pod('stale')
        capacity = allocrecord.capacity_of(
            g.info for g in self.cluster.service.cache.view(node).gpus)
        devices = ((hami.ContainerDevice(next(iter(capacity)), 'AMD', 1,
                                         1),),)
        # a pod that is gone, and one left unbound since long ago (its
        # scheduler died between filter and bind)
        for uid, name, when in (('ghost-uid', 'ghost', int(time.time())),
                                (stale['metadata']['uid'], 'stale', 1)):
            self.store.update(node, lambda r, uid=uid, name=name,
                              when=when: allocrecord.book(
                                  r, uid, 'team', name, when, devices,
                                  capacity))
        self.assertEqual(3, len(self._records()[node].pods))
        self.assertEqual(2, self.cluster.service.collector.sweep())
        record = self._records()[node]
        self.assertEqual(['live'], [g.name for g in record.pods.values()])
        self.assertEqual(0, self.cluster.service.collector.sweep())

    def test_filter_after_filter_moves_the_booking(self) -> None:
        pod = self._pod('p')
        first = self.cluster.filter(pod)['NodeNames'][0]
        other = next(n for n in NODES if n != first)
        self.assertEqual([other], self.cluster.filter(
            pod, nodes=(other,))['NodeNames'])
        records = self._records()
        self.assertIsNone(records[first].find('team', 'p'))
        self.assertIsNotNone(records[other].find('team', 'p'))


class RivalExtenderTest(_Base):
    """Threat 5: a second extender with a cache of its own."""

    extenders = 2

    def test_the_record_refuses_what_a_rival_booked(self) -> None:
        # the rival's pod watch is stuck: its cache never sees the first
        # extender's booking
        self.cluster.services[1].watchers[1].stop()
        whole = {'amd.com/gpu': '1'}
        first = self._pod('first', limits=whole)
        node = self.cluster.filter(first, nodes=('n1',))['NodeNames'][0]
        second = self._pod('second', limits=whole)
        answer = self.cluster.filter(second, nodes=('n1',), via=1)
        self.assertEqual([], answer['NodeNames'])
        self.assertIn('allocation record', answer['FailedNodes'][node])
        record = self._records()[node]
        self.assertIsNotNone(record.find('team', 'first'))
        self.assertIsNone(record.find('team', 'second'))

    def test_a_refused_node_sends_the_pod_to_the_next_that_fits(self) -> None:
        # the rival's cache keeps choosing the node the record refuses (a
        # booking it does not see): the same call tries the next node
        self.cluster.services[1].watchers[1].stop()
        whole = {'amd.com/gpu': '1'}
        first = self._pod('first', limits=whole)
        taken = self.cluster.filter(first, nodes=('n1',))['NodeNames'][0]
        second = self._pod('second', limits=whole)
        answer = self.cluster.filter(second, nodes=NODES, via=1)
        (other,) = set(NODES) - {taken}
        self.assertEqual([other], answer['NodeNames'], answer)
        records = self._records()
        self.assertIsNotNone(records[other].find('team', 'second'))
        self.assertIsNone(records[taken].find('team', 'second'))
        self.assertIsNotNone(records[taken].find('team', 'first'))


class LostAnswerTest(_Base):
    """The API answers 500, resets, or applies a write and loses the
    answer (fault proxy between the extender and the API server)."""

    faults = {'lifetime': 300.0}

    def _rule(self, fault: faultproxy.Fault, method: str,
              path: str) -> faultproxy.Rule:
        assert self.cluster.proxy is not None
        return self.cluster.proxy.add_rule(faultproxy.Rule(fault, method,
                                                           path))

    def test_binding_applied_but_answer_lost(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        self._rule(faultproxy.Fault.RESET_AFTER, 'POST', '/binding')
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))
        stored = self.cluster.read_pod('team', 'p')
        self.assertEqual(node, stored['spec']['nodeName'])
        self.assertEqual('allocating',
                         stored['metadata']['annotations'][hami.BIND_PHASE])
        # the lock stays for the device plugin, which releases it
        lock = self._lock(node)
        assert lock is not None
        self.assertTrue(hami.decode_node_lock(lock).held_by('team', 'p'))

    def test_binding_lost_on_the_way(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        for fault in (faultproxy.Fault.RESET, faultproxy.Fault.ERROR):
            self._rule(fault, 'POST', '/binding')
            answer = self.cluster.bind(pod, node)
            self.assertIn('pods/binding', answer['Error'])
            # released at once, not after the lock timeout
            self.assertIsNone(self._lock(node))
            stored = self.cluster.read_pod('team', 'p')
            self.assertIsNone(stored['spec'].get('nodeName'))
            self.assertEqual('failed', stored['metadata']['annotations'][
                hami.BIND_PHASE])
        # kube-scheduler's retry goes through
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))

    def test_record_write_answer_lost(self) -> None:
        pod = self._pod('p')
        # the first booking creates the record (POST)
        self._rule(faultproxy.Fault.RESET_AFTER, 'POST', '/configmaps')
        answer = self.cluster.filter(pod)
        # the booking went through but its answer was lost: the filter
        # fails and removes it, kube-scheduler's retry books again
        self.assertIn('configmap', answer['Error'])
        self.assertEqual({}, {n: r for n, r in self._records().items()
                              if r.find('team', 'p') is not None})
        answer = self.cluster.filter(pod)
        node = answer['NodeNames'][0]
        booked = [n for n, r in self._records().items()
                  if r.find('team', 'p') is not None]
        self.assertEqual([node], booked)


class StaleLockTest(_Base):
    """A failed bind whose lock release was lost does not hold the node
    for the whole lock timeout."""

    overrides = {('scheduler', 'node_lock_grace'): 0.5}

    def test_lock_of_an_unbound_pod_is_stale_after_the_grace(self) -> None:
        holder = self._pod('holder')
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        value = hami.encode_node_lock(hami.NodeLock(
            datetime.datetime.now(datetime.UTC), 'team', 'holder'))
        self.cluster.api.patch_node(node, {'metadata': {'annotations': {
            hami.NODE_LOCK: value}}})
        del holder
        started = time.monotonic()
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))
        self.assertLess(time.monotonic() - started, 8)
        lock = self._lock(node)
        assert lock is not None
        self.assertTrue(hami.decode_node_lock(lock).held_by('team', 'p'))


class LeaseFenceTest(_Base):
    """The extender answers only while its kube-scheduler leads."""

    overrides = {('scheduler', 'leader_lease'): 'amdgpu-virt-scheduler',
                 ('scheduler', 'leader_identity'): 'sched-0'}

    def _lease(self, holder: str, renewed: datetime.datetime) -> None:
        body = {'metadata': {'name': 'amdgpu-virt-scheduler',
                             'namespace': 'amdgpu-virt'},
                'spec': {'holderIdentity': holder,
                         'leaseDurationSeconds': 15,
                         'renewTime': renewed.strftime(
                             '%Y-%m-%dT%H:%M:%S.%fZ')}}
        existing = self.server.get_object('leases', 'amdgpu-virt-scheduler',
                                          'amdgpu-virt')
        if existing is None:
            self.cluster.kube.coordination.create_namespaced_lease(
                'amdgpu-virt', body)
        else:
            self.cluster.kube.coordination.patch_namespaced_lease(
                'amdgpu-virt-scheduler', 'amdgpu-virt', body)
        fence = self.cluster.service.extender.fence
        assert fence is not None
        fence._good_until = 0.0

    def test_fenced_until_it_leads(self) -> None:
        pod = self._pod('p')
        self.assertIn('Not answering', self.cluster.filter(pod)['Error'])
        now = datetime.datetime.now(datetime.UTC)
        self._lease('sched-1_1234', now)
        self.assertIn("held by 'sched-1_1234'",
                      self.cluster.filter(pod)['Error'])
        self._lease('sched-0_abcd', now - datetime.timedelta(seconds=60))
        self.assertIn('expired', self.cluster.filter(pod)['Error'])
        self.assertIn('expired', self.cluster.bind(pod, 'n1')['Error'])
        self.assertEqual({}, {n: r.pods for n, r in self._records().items()
                              if r.pods})
        self._lease('sched-0_abcd', now)
        node = self.cluster.filter(pod)['NodeNames'][0]
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))

    def test_holds(self) -> None:
        now = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
        spec = {'holderIdentity': 'a_1', 'leaseDurationSeconds': 15,
                'renewTime': '2026-12-01T00:00:00.000000Z'}
        self.assertIsNone(fencing.holds(spec, 'a', now))
        self.assertIsNone(fencing.holds(dict(spec, holderIdentity='a'),
                                        'a', now))
        for bad, needle in ((None, 'no spec'), ({}, 'no holder'),
                            (dict(spec, holderIdentity='ab_1'), 'held by'),
                            (dict(spec, renewTime='x'), 'not a time'),
                            (dict(spec, leaseDurationSeconds='1'),
                             'no renewTime')):
            self.assertIn(needle, str(fencing.holds(bad, 'a', now)))
        self.assertIn('expired', str(fencing.holds(
            spec, 'a', now + datetime.timedelta(seconds=16))))
