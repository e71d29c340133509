"""Allocate through API faults: never another pod's grants or mirror.

The node's device plugin reaches the API server stand-in through the
fault-injecting proxy (500s, resets, answers lost after the write,
truncated answers and delays, by seeded schedule, plus rules that hit the
lock release and the mirror write); the extender reaches it directly.
Pods with init containers, sidecars and several containers are scheduled
one after the other and admitted through the kubelet stand-in, and pods
end on the node before the API shows it (their device IDs then go to the
next pods). After every admission:

* each container got exactly its own grants of the allocation record;
* the plugin wrote pod annotations of the admitted pod only (no other
  pod's allocation rewritten);
* the node lock is released (or stale: its pod is allocated or failed);

and at the end the mirrors (``hami.io/amd-cu-allocated``) of the pods
still live agree with the record and never overlap.
"""

from __future__ import annotations

import datetime
import random
import re
from typing import Any

import testtools
import testtools.content
from kubernetes import client

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import faultproxy
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster
from tests.functional.k8s.node import test_allocate_order as order

RESOURCE = order.RESOURCE
Fault = faultproxy.Fault
SEED = 20261206
PODS = 24
RATES = {Fault.ERROR: 0.04, Fault.RESET: 0.03, Fault.RESET_AFTER: 0.03,
         Fault.TRUNCATE: 0.02, Fault.DELAY: 0.04}
_POD_PATH = re.compile(r'^/api/v1/namespaces/([^/]+)/pods/([^/?]+)(\?|$)')


def _shape(rng: random.Random, number: int) -> dict[str, Any]:
    """A pod of a seeded shape: one container, init + container, a
    sidecar, or several containers."""
    kind = number % 4
    name = 'p%02d' % number
    small = (5, 10, 15)
    if kind == 0:
        return cluster.gpu_pod(name, [order.slice_of(rng.choice(small))])
    if kind == 1:
        return cluster.gpu_pod(name, [order.slice_of(rng.choice(small))],
                               init=[order.slice_of(rng.choice(small))])
    if kind == 2:
        pod = cluster.gpu_pod(name, [order.slice_of(5)],
                              init=[order.slice_of(5), order.slice_of(5)])
        pod['spec']['initContainers'][0]['restartPolicy'] = 'Always'
        return pod
    return cluster.gpu_pod(name, [order.slice_of(5), {},
                                  order.slice_of(10)])


class AllocateThroughFaultsTest(order._NodeTest):

    GPUS = 2

    def _api(self) -> Any:
        self.faults = self.useFixture(faultproxy.FaultProxyFixture(
            self.cluster.kube, seed=SEED, rates=RATES, delay=0.02,
            lifetime=600, rules=[
                # the release's answer lost, the mirror refused, the
                # record read reset: once each, early
                faultproxy.Rule(Fault.RESET_AFTER, 'PATCH', '/nodes/n1',
                                times=1),
                faultproxy.Rule(Fault.ERROR, 'PATCH', '/pods/', times=1,
                                skip=1),
                faultproxy.Rule(Fault.RESET, 'GET', '/configmaps/',
                                times=1, skip=2)]))
        return self.faults.api

    def _patched_pods(self, since: int) -> set[str]:
        found = set()
        for method, path, _fault in self.faults.proxy.log[since:]:
            match = _POD_PATH.match(path)
            if method == 'PATCH' and match:
                found.add('%s/%s' % (match.group(1), match.group(2)))
        return found

    def _end(self, spec: kubelet_fixture.PodSpec, phase: str) -> None:
        """What kubelet's status manager reports, late, of a pod that
        ended on the node."""
        self.cluster.api.patch_namespaced_pod_status(
            spec.name, spec.namespace, {'status': {'phase': phase}})

    def test_no_cross_pod_answer_or_rewrite(self) -> None:
        rng = random.Random(SEED)
        running: list[kubelet_fixture.PodSpec] = []
        ended: list[kubelet_fixture.PodSpec] = []
        rejected = []
        locker = nodelock.NodeLocker(self.cluster.api)
        for number in range(PODS):
            # pods end on the node; the API learns it one pod later
            for spec in ended:
                self._end(spec, 'Succeeded')
            ended = []
            while len(running) > 2 or running and rng.random() < 0.4:
                spec = running.pop(rng.randrange(len(running)))
                self.kubelet.remove_pod(spec.uid)
                ended.append(spec)
            spec = self._schedule(_shape(rng, number))
            since = len(self.faults.proxy.log)
            try:
                held = self.kubelet.admit_pod(spec)
            except kubelet_fixture.AdmissionError as err:
                # kubelet rejects the pod: it fails
                rejected.append('%s: %s' % (spec.name, err))
                self._end(spec, 'Failed')
            else:
                self._check_own(spec, held)
                self.kubelet.start_pod(spec.uid)
                self._report_running(spec)
                running.append(spec)
            self.assertLessEqual(self._patched_pods(since),
                                 {'%s/%s' % (spec.namespace, spec.name)})
            value = self._lock()
            if value is not None:
                self.assertIsNone(locker.holder(
                    value, datetime.datetime.now(datetime.UTC), 'n1'))
        self.addDetail('figures', testtools.content.text_content(
            '%d pods, %d rejected; faults: %s' % (
                PODS, len(rejected), {f.value: self.faults.proxy.faults(f)
                                      for f in RATES})))
        self.assertLessEqual(len(rejected), 2, rejected)
        # the run met faults of every kind
        self.assertEqual(set(RATES), {f for f in RATES
                                      if self.faults.proxy.faults(f)})
        self._check_mirrors(running)

    def _check_mirrors(self, live: list[kubelet_fixture.PodSpec]) -> None:
        record = recordstore.RecordStore(self.cluster.api).read('n1')[0]
        held: dict[str, int] = {}
        for spec in live:
            annotations = self._pod(spec)['metadata']['annotations']
            mirror = hami.decode_cu_allocated(annotations[hami.CU_ALLOCATED])
            self.assertEqual(record.pods[spec.uid].masks(), mirror,
                             spec.name)
            self.assertEqual('success', annotations[hami.BIND_PHASE])
            for gpu, mask in mirror.items():
                self.assertEqual(0, held.get(gpu, 0) & mask, spec.name)
                held[gpu] = held.get(gpu, 0) | mask


class PodSourceFaultsTest(testtools.TestCase):
    """The plugin's API requests through single faults."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name='n1')))
        self.faults = self.useFixture(faultproxy.FaultProxyFixture(
            self.kube, delay=0.01))
        self.source = podsource.KubernetesPodSource(
            'n1', self.faults.api, sleep=lambda _s: None)

    def _lock(self, pod: str) -> None:
        value = hami.encode_node_lock(hami.NodeLock(
            datetime.datetime.now(datetime.UTC), 'ns', pod))
        self.kube.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: value}}})

    def _requests(self, method: str, part: str) -> list[Fault]:
        return [f for m, p, f in self.faults.proxy.log
                if m == method and part in p]

    def test_a_release_whose_answer_was_lost(self) -> None:
        self._lock('job')
        self.faults.proxy.add_rule(faultproxy.Rule(
            Fault.RESET_AFTER, 'PATCH', '/nodes/n1', times=1))
        self.source.release_lock('ns', 'job')
        self.assertEqual((None, None), self.source.node_lock_holder())
        self.assertEqual([Fault.RESET_AFTER],
                         self._requests('PATCH', '/nodes/n1'))

    def test_transient_failures_are_tried_again(self) -> None:
        self._lock('job')
        for fault in (Fault.ERROR, Fault.RESET, Fault.TRUNCATE):
            self.faults.proxy.add_rule(faultproxy.Rule(
                fault, 'GET', '/nodes/n1', times=1))
        self.assertEqual('job', hami.decode_node_lock(
            self.source.node_lock()).pod)
        self.assertEqual([Fault.ERROR, Fault.RESET, Fault.TRUNCATE,
                          Fault.PASS], self._requests('GET', '/nodes/n1'))

    def test_attempts_are_bounded(self) -> None:
        self.faults.proxy.add_rule(faultproxy.Rule(Fault.ERROR, 'GET',
                                                   '/pods', times=None))
        self.assertRaises(exception.KubernetesError,
                          self.source.pods_on_node)
        self.assertEqual(5, len(self._requests('GET', '/pods')))

    def test_answers_that_are_not_transient_fail_at_once(self) -> None:
        source = podsource.KubernetesPodSource('n2', self.faults.api)
        self.assertRaises(exception.KubernetesNotFound, source.node_lock)
        self.assertEqual(1, len(self._requests('GET', '/nodes/n2')))
