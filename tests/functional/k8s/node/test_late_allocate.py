"""A late Allocate of a pod deleted mid-allocation, however late.

The real extender (``/filter``, ``/bind`` over HTTP) takes the node lock
for the pod it binds; the node's device plugin serves kubelet's Allocate
(the kubelet stand-in over gRPC) for the pod that lock names. When the
pod is deleted (or deleted and created again under its name) between its
bind and its Allocate, the kubelet's Allocate for it may still come, and
come late. The lock grace is made tiny here: the next pod's bind does not
take the lock over however long after the grace it comes, the late
Allocate is refused naming the pod and its UID, and only then does the
next pod get the lock and, from its own Allocate, exactly its own grants.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import grpc
import testtools

from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster

RESOURCE = 'amd.com/gpu'
SMALL = {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
         'amd.com/gpumem': '1024'}
GRACE = 0.05


class LateAllocateTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(
            ('n1',), gpus=1, overrides={
                ('scheduler', 'node_lock_grace'): GRACE,
                ('scheduler', 'node_lock_wait'): 0.3}))
        self.server = self.cluster.kube.server
        directory = tempfile.mkdtemp(prefix='late')
        self.addCleanup(shutil.rmtree, directory, True)
        self.kubelet = kubelet_fixture.KubeletStandIn(directory).start()
        self.addCleanup(self.kubelet.stop)
        plugin = deviceplugin.DevicePlugin(
            self.cluster.inventories['n1'], plugin_dir=directory,
            socket_name='amdgpu.sock', share_count=10, poll_interval=0.05,
            pod_source=podsource.KubernetesPodSource('n1', self.cluster.api))
        plugin.start()
        self.addCleanup(plugin.stop)
        self.kubelet.wait_for_devices(RESOURCE, count=10)

    def _scheduled(self, name: str) -> dict[str, Any]:
        """Created, filtered onto n1 and bound: the lock is its own."""
        pod = self.cluster.create(cluster.gpu_pod(name, [SMALL]))
        self.assertEqual(['n1'], self.cluster.filter(pod)['NodeNames'])
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, 'n1'))
        return pod

    def _lock(self) -> tuple[str | None, str | None]:
        annotations = self.server.get_object('nodes', 'n1')['metadata'].get(
            'annotations') or {}
        return annotations.get(hami.NODE_LOCK), nodelock.lock_uid(annotations)

    def _cus(self, response: Any) -> int:
        return cumask.parse_hsa_cu_mask(
            response.envs['HSA_CU_MASK']).as_dict()[0]

    def _booked(self, uid: str) -> int:
        record = recordstore.RecordStore(self.cluster.api).read('n1')[0]
        return record.pods[uid].containers[0][0].cus

    def _next_waits_then_gets_its_own(self, late_uid: str,
                                      name: str) -> None:
        """Past the grace the next pod's bind still waits; the late
        Allocate is refused; then the next pod is bound and served its
        own grants."""
        following = self.cluster.create(cluster.gpu_pod(name, [SMALL])) \
            if name != 'db-0' else self.server.get_object(
                'pods', name, 'team')
        self.assertEqual(['n1'], self.cluster.filter(following)[
            'NodeNames'])
        time.sleep(GRACE * 4)
        answer = self.cluster.bind(following, 'n1')
        self.assertIn('hami.io/mutex.lock not acquired', answer['Error'])
        self.assertEqual(late_uid, self._lock()[1])
        self.assertIsNone(self.server.get_object(
            'pods', name, 'team')['spec'].get('nodeName'))
        # the late Allocate of the deleted pod: refused, naming it
        err = self.assertRaises(grpc.RpcError, self.kubelet.admit,
                                RESOURCE, 1)
        self.assertEqual(grpc.StatusCode.INVALID_ARGUMENT, err.code())
        self.assertIn('(uid %s)' % late_uid, err.details())
        self.assertEqual((None, None), self._lock())
        # now the next pod binds and gets exactly its own CUs
        self.assertEqual({'Error': ''}, self.cluster.bind(following, 'n1'))
        uid = following['metadata']['uid']
        self.assertEqual(uid, self._lock()[1])
        _ids, response = self.kubelet.admit(RESOURCE, 1)
        self.assertEqual(self._booked(uid), self._cus(response))
        self.assertEqual('success', self.server.get_object(
            'pods', name, 'team')['metadata']['annotations'][
                hami.BIND_PHASE])
        self.assertEqual((None, None), self._lock())

    def test_deleted_mid_allocation_late_after_the_grace(self) -> None:
        gone = self._scheduled('gone')
        uid = gone['metadata']['uid']
        self.assertEqual(uid, self._lock()[1])
        self.cluster.api.delete_namespaced_pod('gone', 'team')
        self._next_waits_then_gets_its_own(uid, 'next')

    def test_deleted_and_created_again_with_the_same_name(self) -> None:
        old = self._scheduled('db-0')
        uid = old['metadata']['uid']
        self.cluster.api.delete_namespaced_pod('db-0', 'team')
        again = self.cluster.create(cluster.gpu_pod('db-0', [SMALL]))
        self.assertNotEqual(uid, again['metadata']['uid'])
        self._next_waits_then_gets_its_own(uid, 'db-0')
