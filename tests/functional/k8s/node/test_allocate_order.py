"""Allocate as kubelet really calls it, end to end.

Pods go through the webhook, the extender's ``/filter`` and ``/bind`` (the
node lock) over HTTP, then kubelet's device manager through the kubelet
stand-in: Allocate for each container in pod order, an init container's
device IDs handed again to the next container, a sidecar's kept, a pod's
IDs freed once it left the node (before the API shows its phase),
PreStartContainer where asked for, plugin and kubelet restarts. The node's
device plugin (``hami`` mode, over its unix socket) must give each
container exactly its own grants from the allocation record, and release
the node lock after the pod's last container with GPUs.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import grpc
import testtools

from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster

RESOURCE = 'amd.com/gpu'


def slice_of(percent: int, mib: int = 4096, gpus: int = 1
             ) -> dict[str, str]:
    return {RESOURCE: str(gpus), 'amd.com/gpucores': str(percent),
            'amd.com/gpumem': str(mib)}


def masks(answer: Any) -> dict[int, int]:
    """CUs per container-local GPU of an Allocate answer (a whole GPU has
    no mask: -1)."""
    envs = dict(answer.envs)
    gpus = envs['ROCR_VISIBLE_DEVICES'].split(',')
    found = cumask.parse_hsa_cu_mask(envs['HSA_CU_MASK']).as_dict() \
        if 'HSA_CU_MASK' in envs else {}
    return {n: found.get(n, -1) for n in range(len(gpus))}


class _NodeTest(testtools.TestCase):
    """A node of ``GPUS`` GPUs: its plugin, the kubelet stand-in."""

    GPUS = 1

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(('n1',),
                                                       gpus=self.GPUS))
        self.server = self.cluster.kube.server
        self.dir = tempfile.mkdtemp(prefix='ao')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.kubelet = kubelet_fixture.KubeletStandIn(self.dir).start()
        self.addCleanup(self.kubelet.stop)
        self.plugin = self._plugin()
        self.kubelet.wait_for_devices(RESOURCE, count=10 * self.GPUS)

    def _api(self) -> Any:
        """The API client of the device plugin."""
        return self.cluster.api

    def _plugin(self) -> deviceplugin.DevicePlugin:
        plugin = deviceplugin.DevicePlugin(
            self.cluster.inventories['n1'], plugin_dir=self.dir,
            socket_name='amdgpu.sock', share_count=10, poll_interval=0.05,
            pod_source=podsource.KubernetesPodSource('n1', self._api()))
        plugin.start()
        self.addCleanup(plugin.stop)
        return plugin

    # -- the steps -------------------------------------------------------

    def _schedule(self, pod: dict[str, Any]) -> kubelet_fixture.PodSpec:
        """Webhook, filter and bind: the node lock is the pod's."""
        stored = self.cluster.create(pod)
        self.assertEqual(['n1'], self.cluster.filter(stored)['NodeNames'])
        self.assertEqual({'Error': ''}, self.cluster.bind(stored, 'n1'))
        meta = stored['metadata']
        return kubelet_fixture.PodSpec.from_api(self.cluster.read_pod(
            meta['namespace'], meta['name']))

    def _grants(self, uid: str) -> allocrecord.PodGrants:
        return recordstore.RecordStore(self.cluster.api).read(
            'n1')[0].pods[uid]

    def _lock(self) -> str | None:
        return (self.server.get_object('nodes', 'n1')['metadata'].get(
            'annotations') or {}).get(hami.NODE_LOCK)

    def _pod(self, spec: kubelet_fixture.PodSpec) -> dict[str, Any]:
        return self.cluster.read_pod(spec.namespace, spec.name)

    def _report_running(self, spec: kubelet_fixture.PodSpec) -> None:
        """What kubelet's status manager reports once the pod started."""
        self.cluster.api.patch_namespaced_pod_status(
            spec.name, spec.namespace, {'status': {
                'phase': 'Running', 'containerStatuses': [
                    {'name': c.name, 'ready': True, 'restartCount': 0,
                     'image': 'rocm', 'imageID': '',
                     'state': {'running': {}}}
                    for c in spec.containers]}})

    def _check_own(self, spec: kubelet_fixture.PodSpec,
                   held: dict[str, Any]) -> None:
        """Each container got exactly its own grants of the record."""
        grants = self._grants(spec.uid)
        units = {u.uuid.lower(): u for u in self.cluster.units['n1']}
        for index, container in enumerate(spec.ordered()):
            booked = grants.containers[index]
            if not booked:
                self.assertNotIn(container.name, held or {})
                continue
            _ids, answer = held[container.name][RESOURCE]
            self.assertEqual(','.join(units[g.gpu].rocr_id for g in booked),
                             answer.envs['ROCR_VISIBLE_DEVICES'],
                             container.name)
            expected = {n: -1 if g.cus == (1 << units[g.gpu].compute_units)
                        - 1 else g.cus for n, g in enumerate(booked)}
            self.assertEqual(expected, masks(answer), container.name)



class AllocateOrderTest(_NodeTest):

    def test_init_container_and_app_container_get_their_own(self) -> None:
        # the attack of the issue: kubelet hands the app container the
        # init container's device ID; the app container must still get
        # its own 50 %, and the lock must not stay held
        spec = self._schedule(cluster.gpu_pod(
            'job', [slice_of(50, 8192)], init=[slice_of(25, 1024)]))
        held = self.kubelet.admit_pod(spec)
        (init_ids, init), = held['init0'].values()
        (app_ids, app), = held['c0'].values()
        self.assertEqual(init_ids, app_ids)   # kubelet's reuse happened
        self.assertEqual({0: (1 << 76) - 1}, masks(init))
        self.assertEqual({0: ((1 << 152) - 1) << 76}, masks(app))
        self.assertEqual('1024m', init.envs['HIP_DEVICE_MEMORY_LIMIT_0'])
        self.assertEqual('8192m', app.envs['HIP_DEVICE_MEMORY_LIMIT_0'])
        self._check_own(spec, held)
        self.assertIsNone(self._lock())
        annotations = self._pod(spec)['metadata']['annotations']
        self.assertEqual('success', annotations[hami.BIND_PHASE])
        self.assertEqual(';;', annotations[hami.DEVICES_TO_ALLOCATE])
        # the containers start with what they were answered
        started = self.kubelet.start_pod(spec.uid)
        self.assertEqual(init.envs['HSA_CU_MASK'],
                         started['init0'].envs['HSA_CU_MASK'])
        self.assertEqual(app.envs['HSA_CU_MASK'],
                         started['c0'].envs['HSA_CU_MASK'])
        # the next pod binds at once and gets CUs no one holds
        following = self._schedule(cluster.gpu_pod('next', [slice_of(10)]))
        (_ids, answer), = self.kubelet.admit_pod(following)['c0'].values()
        self.assertEqual(0, masks(answer)[0] & ((1 << 228) - 1))
        self.assertEqual(30, masks(answer)[0].bit_count())

    def test_sidecars_keep_their_devices(self) -> None:
        pod = cluster.gpu_pod('sidecar', [slice_of(30), slice_of(10)],
                              init=[slice_of(10), slice_of(20)])
        pod['spec']['initContainers'][0]['restartPolicy'] = 'Always'
        spec = self._schedule(pod)
        self.assertEqual([True, False],
                         [c.restartable for c in spec.init_containers])
        held = self.kubelet.admit_pod(spec)
        ids = {name: held[name][RESOURCE][0] for name in held}
        # the sidecar's ID is its own; the init container's goes on to
        # the first container; the second container gets a fresh one
        self.assertEqual(ids['init1'], ids['c0'])
        self.assertEqual(3, len({ids['init0'], ids['init1'], ids['c1']}))
        self._check_own(spec, held)
        self.assertIsNone(self._lock())
        # a retry of the sidecar's Allocate (its answer lost) is its own
        sidecar = self._grants(spec.uid).containers[0][0].cus
        stub = self.kubelet.plugins[RESOURCE].stub
        again = stub.Allocate(deviceplugin.api_pb2.AllocateRequest(
            container_requests=[deviceplugin.api_pb2.ContainerAllocateRequest(
                devices_ids=list(ids['init0']))]), timeout=30)
        self.assertEqual({0: sidecar}, masks(again.container_responses[0]))

    def test_pod_ended_on_the_node_before_its_phase_changed(self) -> None:
        first = self._schedule(cluster.gpu_pod('first', [slice_of(25)]))
        first_held = self.kubelet.admit_pod(first)
        self.kubelet.start_pod(first.uid)
        self._report_running(first)
        mirror = self._pod(first)['metadata']['annotations']
        # it ends on the node; the API still shows it running
        self.kubelet.remove_pod(first.uid)
        second = self._schedule(cluster.gpu_pod('second', [slice_of(50)]))
        held = self.kubelet.admit_pod(second)
        self.assertEqual(first_held['c0'][RESOURCE][0],
                         held['c0'][RESOURCE][0])   # the freed ID again
        self._check_own(second, held)
        self.assertEqual(0, masks(first_held['c0'][RESOURCE][1])[0]
                         & masks(held['c0'][RESOURCE][1])[0])
        self.assertEqual(mirror, self._pod(first)['metadata'][
            'annotations'])
        self.assertIsNone(self._lock())

    def test_freed_ids_without_a_lock_are_refused(self) -> None:
        first = self._schedule(cluster.gpu_pod('first', [slice_of(25)]))
        self.kubelet.admit_pod(first)
        self.kubelet.start_pod(first.uid)
        self._report_running(first)
        self.kubelet.remove_pod(first.uid)
        # a pod bound here whose lock is gone (expired, removed by hand)
        second = self._schedule(cluster.gpu_pod('second', [slice_of(50)]))
        self.cluster.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: None}}})
        before = (self._pod(first), self._pod(second))
        err = self.assertRaises(kubelet_fixture.AdmissionError,
                                self.kubelet.admit_pod, second)
        self.assertIsInstance(err.cause, grpc.RpcError)
        self.assertIn('no live node lock', err.cause.details())
        self.assertIn('team/first', err.cause.details())
        self.assertEqual(before, (self._pod(first), self._pod(second)))

    def test_plugin_restart_while_pods_run(self) -> None:
        spec = self._schedule(cluster.gpu_pod(
            'job', [slice_of(50)], init=[slice_of(25)]))
        held = self.kubelet.admit_pod(spec)
        started = self.kubelet.start_pod(spec.uid)
        calls = len(self.kubelet.calls.allocate)
        self.plugin.stop()
        self.assertTrue(self.kubelet.wait_for(
            lambda: self.kubelet.plugins[RESOURCE].stream_ended))
        self.assertEqual(set(), self.kubelet.manager.healthy[RESOURCE])
        self.plugin = self._plugin()
        self.assertTrue(self.kubelet.wait_for(
            lambda: len(self.kubelet.manager.healthy.get(RESOURCE, ()))
            == 10))
        # no Allocate for running containers; a restart reuses the answer
        self.assertEqual(started['c0'],
                         self.kubelet.restart_container(spec.uid, 'c0'))
        self.assertEqual(calls, len(self.kubelet.calls.allocate))
        following = self._schedule(cluster.gpu_pod('next', [slice_of(20)]))
        after = self.kubelet.admit_pod(following)
        self._check_own(following, after)
        taken = masks(held['c0'][RESOURCE][1])[0] | masks(
            held['init0'][RESOURCE][1])[0]
        self.assertEqual(0, taken & masks(after['c0'][RESOURCE][1])[0])

    def test_kubelet_restart_admits_running_pods_again(self) -> None:
        spec = self._schedule(cluster.gpu_pod(
            'job', [slice_of(50)], init=[slice_of(25)]))
        self.kubelet.admit_pod(spec)
        self.kubelet.start_pod(spec.uid)
        calls = len(self.kubelet.calls.allocate)
        self.kubelet.restart()
        self.kubelet.wait_for_devices(RESOURCE, count=10)
        self.assertTrue(self.kubelet.wait_for(
            lambda: len(self.kubelet.manager.healthy.get(RESOURCE, ()))
            == 10))
        self.assertEqual({}, self.kubelet.readmit())
        self.assertEqual(calls, len(self.kubelet.calls.allocate))
        following = self._schedule(cluster.gpu_pod('next', [slice_of(20)]))
        self._check_own(following, self.kubelet.admit_pod(following))
        self.assertIsNone(self._lock())


class MultiContainerTest(_NodeTest):
    """Pods of several containers on a node of two GPUs."""

    GPUS = 2

    def test_multi_container_pod(self) -> None:
        spec = self._schedule(cluster.gpu_pod('multi', [
            slice_of(20, gpus=2), slice_of(40), {}, slice_of(10)],
            init=[slice_of(20, gpus=2), {}]))
        held = self.kubelet.admit_pod(spec)
        self.assertEqual(['init0', 'c0', 'c1', 'c3'], sorted(
            held, key=lambda n: [c.name for c in spec.ordered()].index(n)))
        self.assertEqual(held['init0'][RESOURCE][0],
                         held['c0'][RESOURCE][0])
        self._check_own(spec, held)
        self.assertIsNone(self._lock())
        self.assertEqual(4, len([c for c in self.kubelet.calls.allocate
                                 if c[0] == RESOURCE]))

    def test_a_larger_container_keeps_its_init_containers_device(
            self) -> None:
        # kubelet asks GetPreferredAllocation for the whole request with
        # the init container's device as mustInclude; the plugin keeps it
        spec = self._schedule(cluster.gpu_pod(
            'grow', [slice_of(20, gpus=2)], init=[slice_of(10)]))
        held = self.kubelet.admit_pod(spec)
        (init_id,) = held['init0'][RESOURCE][0]
        self.assertIn(init_id, held['c0'][RESOURCE][0])
        _resource, available, must, size = self.kubelet.calls.preferred[-1]
        self.assertEqual(((init_id,), 2), (must, size))
        self.assertIn(init_id, available)
        # on two GPUs (device IDs are <GPU>-<slot>)
        self.assertEqual(2, len({i.rsplit('-', 1)[0]
                                 for i in held['c0'][RESOURCE][0]}))
        self._check_own(spec, held)
        self.assertIsNone(self._lock())
