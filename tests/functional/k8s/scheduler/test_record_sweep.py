"""The record sweep removes a pod's bookings that can no longer be bound.

A filter that books a pod again on another node removes the earlier
booking; when that removal is lost (an extender killed in between), the
earlier booking used to hold its GPUs until ``unbound_ttl`` (the node
lock timeout, 300 s by default). The sweep now removes it at once when
it is older than the pod's current booking: the one on the node the
pod's mirror names. Through the extender and the API server stand-in.
"""

from __future__ import annotations

import time

import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.record import sweep as recordgc
from amdgpu_virt.k8s.scheduler import service as extender
from amdgpu_virt.sharing import hami
from tests.functional.k8s import cluster

NODES = ('n1', 'n2')
SMALL = {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
         'amd.com/gpumem': '1024'}


class SweepTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(NODES, gpus=1))
        self.store = recordstore.RecordStore(self.cluster.api)
        self.pod = self.cluster.create(cluster.gpu_pod('p', [SMALL]))
        # the filter books on n1 and writes the mirror naming n1
        answer = self.cluster.filter(self.pod, nodes=('n1',))
        self.assertEqual(['n1'], answer['NodeNames'], answer)
        self.current = self.store.read('n1')[0].find('team', 'p')
        assert self.current is not None
        self.assertEqual('n1', self.cluster.read_pod('team', 'p')[
            'metadata']['annotations'][hami.VGPU_NODE])

    def _stale(self, offset: int) -> None:
        """A booking of ``p`` on n2, ``offset`` seconds from the current
        one's time (its removal lost)."""
        unit = self.cluster.units['n2'][0]
        cluster.book(self.cluster.api, 'n2', self.pod, ((hami.ContainerDevice(
            unit.uuid, 'AMD', 1024, 76),),),
            sharedalloc.capacity(self.cluster.units['n2'], 10),
            when=self.current.time + offset)

    def _booked(self) -> list[str]:
        return [n for n in NODES
                if self.store.read(n)[0].find('team', 'p') is not None]

    def _sweep(self) -> int:
        return recordgc.Collector(self.store, self.cluster.api).sweep()

    def test_an_older_booking_elsewhere_goes_at_once(self) -> None:
        self._stale(-30)
        self.assertEqual(['n1', 'n2'], self._booked())
        self.assertEqual(1, self._sweep())
        self.assertEqual(['n1'], self._booked())
        # the current booking is untouched
        self.assertEqual(self.current,
                         self.store.read('n1')[0].find('team', 'p'))

    def test_a_newer_or_same_second_booking_stays(self) -> None:
        # a filter under way (its mirror not written yet), or clocks that
        # disagree: which is current is not known, so both wait for the
        # unbound timeout as before
        for offset in (30, 0):
            self._stale(offset)
            self.assertEqual(0, self._sweep())
            self.assertEqual(['n1', 'n2'], self._booked())

    def test_a_mirror_naming_a_node_without_the_booking_removes_nothing(
            self) -> None:
        # the pod's owner may write its annotations: a mirror that names a
        # node whose record does not hold the pod chooses nothing
        self._stale(-30)
        self.cluster.api.patch_namespaced_pod('p', 'team', {
            'metadata': {'annotations': {hami.VGPU_NODE: 'n9'}}})
        self.assertEqual(0, self._sweep())
        self.assertEqual(['n1', 'n2'], self._booked())
        # naming the older booking's node makes the newer one stay: the
        # annotation only picks among the pod's own bookings, and never
        # removes one newer than the booking it names
        self.cluster.api.patch_namespaced_pod('p', 'team', {
            'metadata': {'annotations': {hami.VGPU_NODE: 'n2'}}})
        self.assertEqual(0, self._sweep())
        self.assertEqual(['n1', 'n2'], self._booked())

    def test_a_bound_pod_keeps_only_its_node(self) -> None:
        self._stale(30)
        bound = self.cluster.bind(self.pod, 'n1')
        self.assertEqual('', bound.get('Error'), bound)
        self.assertEqual(1, self._sweep())
        self.assertEqual(['n1'], self._booked())


class RestartTest(testtools.TestCase):
    """Pods deleted while no extender ran keep no GPUs after it starts.

    The fault seen: their bookings stayed in the record until the first
    sweep, ``record_sweep_interval`` (120 s) after start, and a
    crash-looping extender never swept; other pods were refused "no
    room" meanwhile. The extender now sweeps right after its first list.
    """

    def test_bookings_of_pods_deleted_meanwhile_go_at_start(self) -> None:
        c = self.useFixture(cluster.Cluster(('n1',), gpus=1))
        whole = {'amd.com/gpu': '1'}
        first = c.create(cluster.gpu_pod('first', [whole]))
        self.assertEqual(['n1'], c.filter(first)['NodeNames'])
        store = recordstore.RecordStore(c.api)
        self.assertIsNotNone(store.read('n1')[0].find('team', 'first'))
        # the extender dies; the pod is deleted while none runs
        assert c.service is not None
        c.service.stop()
        c.api.delete_namespaced_pod('first', 'team')
        conf = conf_pkg.new_conf()
        for option, value in (('port', 0), ('metrics_port', 0),
                              ('watch_timeout', 30)):
            conf.set_override(option, value, group='scheduler')
        self.assertEqual(120, conf.scheduler.record_sweep_interval)
        began = time.monotonic()
        service = extender.Service(conf, client.CoreV1Api(
            c.kube.client_for(None)))
        service.start()
        self.addCleanup(service.stop)
        http = cluster.HttpJson(*service.address)
        self.addCleanup(http.close)
        second = c.create(cluster.gpu_pod('second', [whole]))
        while True:
            answer = http.post('/filter', {'Pod': second, 'Nodes': None,
                                           'NodeNames': ['n1']})
            if answer['NodeNames'] == ['n1']:
                break
            self.assertLess(time.monotonic() - began, 10, answer)
            time.sleep(0.1)
        self.assertIsNone(store.read('n1')[0].find('team', 'first'))
        self.assertGreaterEqual(service.collector.removed, 1)
