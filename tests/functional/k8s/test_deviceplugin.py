"""The device plugin and the kubelet stand-in over real unix sockets."""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import threading

import grpc
import testtools
from kubernetes import client

from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s import deviceplugin
from amdgpu_virt.k8s import devices
from amdgpu_virt.k8s import pods
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import kubelet as kubelet_fixture

RESOURCE = 'amd.com/gpu'


class DevicePluginTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        # unix socket paths are limited to ~107 bytes: keep the dir short
        self.dir = tempfile.mkdtemp(prefix='dp')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.dev_root = os.path.join(self.dir, 'root')
        self.plugin_dir = os.path.join(self.dir, 'dp')
        os.makedirs(self.plugin_dir)
        self.inventory = simulate.design_host(
            simulate.HostSpec(hostname='n1', mode='spx'))
        self.units = devices.units_from_inventory(self.inventory)
        # AMD device nodes cannot exist here: fake them under a root dir
        os.makedirs(os.path.join(self.dev_root, 'dev', 'dri'))
        open(os.path.join(self.dev_root, 'dev', 'kfd'), 'w').close()
        for unit in self.units:
            for path in (unit.card_path, unit.render_path):
                open(os.path.join(self.dev_root, path.lstrip('/')),
                     'w').close()
        self.kubelet = kubelet_fixture.KubeletStandIn(self.plugin_dir)
        self.kubelet.start()
        self.addCleanup(self.kubelet.stop)

    def _plugin(self, share_count: int = 2) -> deviceplugin.DevicePlugin:
        plugin = deviceplugin.DevicePlugin(
            self.inventory, plugin_dir=self.plugin_dir,
            socket_name='amdgpu.sock', resource_name=RESOURCE,
            share_count=share_count, poll_interval=0.05,
            health=deviceplugin.device_node_health(self.dev_root))
        plugin.start()
        self.addCleanup(plugin.stop)
        return plugin

    def test_registers_and_lists_devices(self) -> None:
        self._plugin(share_count=2)
        endpoint = self.kubelet.wait_for_devices(RESOURCE, count=16)
        request = self.kubelet.register_requests[0]
        self.assertEqual(('v1beta1', 'amdgpu.sock', RESOURCE, True),
                         (request.version, request.endpoint,
                          request.resource_name,
                          request.options.get_preferred_allocation_available))
        self.assertEqual(16, endpoint.capacity)
        first = endpoint.devices[0]
        self.assertEqual('%s-0' % self.units[0].uuid, first.ID)
        self.assertEqual([0], [n.ID for n in first.topology.nodes])
        self.assertEqual([1], [n.ID for n in
                               endpoint.devices[-1].topology.nodes])

    def test_whole_gpu_allocation(self) -> None:
        self._plugin(share_count=2)
        self.kubelet.wait_for_devices(RESOURCE, count=16)
        chosen, response = self.kubelet.admit(RESOURCE, 2)
        # GetPreferredAllocation spreads over two distinct GPUs
        self.assertEqual([self.units[0].device_id(0),
                          self.units[1].device_id(0)], chosen)
        self.assertEqual(
            'GPU-%s,GPU-%s' % (self.units[0].uuid, self.units[1].uuid),
            response.envs['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0,1', response.envs['HIP_VISIBLE_DEVICES'])
        self.assertEqual(
            ['/dev/kfd', '/dev/dri/card1', '/dev/dri/renderD128',
             '/dev/dri/card9', '/dev/dri/renderD136'],
            [d.host_path for d in response.devices])
        self.assertEqual({'rw'}, {d.permissions for d in response.devices})
        # the next whole-GPU container gets the next untouched GPUs
        chosen, _response = self.kubelet.admit(RESOURCE, 1)
        self.assertEqual([self.units[2].device_id(0)], chosen)

    def test_allocate_unknown_device_is_refused(self) -> None:
        self._plugin()
        endpoint = self.kubelet.wait_for_devices(RESOURCE)
        err = self.assertRaises(
            grpc.RpcError, endpoint.stub.Allocate, api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(
                    devices_ids=['feedfacefeedface-0'])]), timeout=10)
        self.assertEqual(grpc.StatusCode.INVALID_ARGUMENT, err.code())
        self.assertIn('feedfacefeedface-0', err.details())

    def test_health_change_sends_new_list(self) -> None:
        self._plugin(share_count=1)
        self.kubelet.wait_for_devices(RESOURCE, count=8)
        os.unlink(os.path.join(self.dev_root,
                               self.units[3].render_path.lstrip('/')))
        endpoint = self.kubelet.wait_for_devices(RESOURCE, updates=2)
        self.assertEqual(7, endpoint.capacity)
        sick = [d.ID for d in endpoint.devices if d.health == 'Unhealthy']
        self.assertEqual([self.units[3].device_id(0)], sick)

    def test_reregisters_after_kubelet_restart(self) -> None:
        plugin = self._plugin(share_count=1)
        self.kubelet.wait_for_devices(RESOURCE, count=8)
        self.kubelet.restart()
        self.assertEqual({}, self.kubelet.plugins)
        endpoint = self.kubelet.wait_for_devices(RESOURCE, count=8)
        self.assertEqual(2, len(self.kubelet.register_requests))
        self.assertEqual(2, plugin.registrations)
        self.assertTrue(os.path.exists(plugin.socket_path))
        chosen, response = self.kubelet.admit(RESOURCE, 1)
        self.assertEqual(1, len(chosen))
        self.assertTrue(response.envs['ROCR_VISIBLE_DEVICES'].startswith(
            'GPU-'))
        self.assertEqual(8, endpoint.capacity)

    def test_waits_for_kubelet_then_registers(self) -> None:
        self.kubelet.stop()
        plugin = self._plugin()
        self.assertEqual(0, plugin.registrations)
        self.kubelet.start()
        self.kubelet.wait_for_devices(RESOURCE, count=16)
        self.assertEqual(1, plugin.registrations)

    def test_clean_shutdown_removes_socket(self) -> None:
        plugin = self._plugin()
        self.kubelet.wait_for_devices(RESOURCE)
        plugin.stop()
        self.assertFalse(os.path.exists(plugin.socket_path))
        self.assertTrue(self.kubelet.wait_for(
            lambda: self.kubelet.plugins[RESOURCE].stream_ended))


class HamiAllocateTest(testtools.TestCase):
    """Allocate for a HAMi-scheduled pod: kubelet stand-in + API stand-in."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.dir = tempfile.mkdtemp(prefix='dp')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.kubelet = kubelet_fixture.KubeletStandIn(self.dir).start()
        self.addCleanup(self.kubelet.stop)
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1'))
        self.units = devices.units_from_inventory(inventory)
        self.plugin = deviceplugin.DevicePlugin(
            inventory, plugin_dir=self.dir, socket_name='amdgpu.sock',
            share_count=10, poll_interval=0.05,
            pod_source=pods.KubernetesPodSource('n1', self.kube.api))
        self.plugin.start()
        self.addCleanup(self.plugin.stop)
        self.kubelet.wait_for_devices(RESOURCE, count=80)
        self.lock = '%s,team,job' % hami.format_rfc3339(
            datetime.datetime.now(datetime.UTC))
        self.kube.api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name='n1', annotations={hami.NODE_LOCK: self.lock})))

    def _pod(self, name: str, annotations: dict[str, str]) -> None:
        self.kube.server.put_object('pods', {
            'metadata': {'name': name, 'namespace': 'team',
                         'annotations': annotations},
            'spec': {'nodeName': 'n1', 'containers': [{'name': 'main'}]},
            'status': {'phase': 'Running'}})

    def test_allocates_free_cus_and_records_them(self) -> None:
        uuid = self.units[0].uuid
        self._pod('neighbour', {hami.CU_ALLOCATED: '{"%s":"0-151"}' % uuid})
        value = '%s,AMD Instinct MI300X,49152,76:;' % uuid
        self._pod('job', {hami.BIND_PHASE: 'allocating',
                          hami.VGPU_NODE: 'n1', hami.BIND_TIME: '1',
                          hami.DEVICES_TO_ALLOCATE: value,
                          hami.DEVICES_ALLOCATED: value})
        _chosen, response = self.kubelet.admit(RESOURCE, 1)
        self.assertEqual('GPU-%s' % uuid,
                         response.envs['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0:152-227', response.envs['HSA_CU_MASK'])
        self.assertEqual('49152m', response.envs['HIP_DEVICE_MEMORY_LIMIT_0'])
        self.assertEqual(hami.LD_AUDIT_LIBRARY, response.envs['LD_AUDIT'])
        self.assertEqual([hami.LD_AUDIT_LIBRARY],
                         [m.host_path for m in response.mounts])
        pod = self.kube.api.read_namespaced_pod('job', 'team')
        annotations = pod.metadata.annotations
        self.assertEqual('{"%s":"152-227"}' % uuid,
                         annotations[hami.CU_ALLOCATED])
        self.assertEqual('success', annotations[hami.BIND_PHASE])
        self.assertEqual(';', annotations[hami.DEVICES_TO_ALLOCATE])
        self.assertEqual(value, annotations[hami.DEVICES_ALLOCATED])
        node = self.kube.api.read_node('n1')
        self.assertNotIn(hami.NODE_LOCK, node.metadata.annotations or {})

    def test_failure_marks_the_pod_and_releases_the_lock(self) -> None:
        self._pod('job', {hami.BIND_PHASE: 'allocating',
                          hami.VGPU_NODE: 'n1', hami.BIND_TIME: '1',
                          hami.DEVICES_TO_ALLOCATE: 'nosuchgpu,AMD,1,1:;'})
        err = self.assertRaises(grpc.RpcError, self.kubelet.admit,
                                RESOURCE, 1)
        self.assertIn('nosuchgpu', err.details())
        pod = self.kube.api.read_namespaced_pod('job', 'team')
        self.assertEqual('failed',
                         pod.metadata.annotations[hami.BIND_PHASE])
        node = self.kube.api.read_node('n1')
        self.assertNotIn(hami.NODE_LOCK, node.metadata.annotations or {})

    def test_no_pending_pod_is_refused(self) -> None:
        err = self.assertRaises(grpc.RpcError, self.kubelet.admit,
                                RESOURCE, 1)
        self.assertEqual(grpc.StatusCode.INVALID_ARGUMENT, err.code())
        self.assertIn('no pod on node n1', err.details())

    def test_parallel_allocations_never_share_a_cu(self) -> None:
        # kubelet serialises Allocate, but nothing in the protocol forces
        # it: eight concurrent calls for eight pods sharing one GPU must
        # still get disjoint CUs that add up to the whole GPU
        self.kube.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: None}}})
        uuid = self.units[0].uuid
        for n in range(8):
            value = '%s,AMD,1024,38:;' % uuid
            self._pod('p%d' % n, {hami.BIND_PHASE: 'allocating',
                                  hami.VGPU_NODE: 'n1',
                                  hami.BIND_TIME: str(100 + n),
                                  hami.DEVICES_TO_ALLOCATE: value})
        stub = self.kubelet.plugins[RESOURCE].stub
        ids = [d.ID for d in self.kubelet.plugins[RESOURCE].devices]
        masks: list[str] = []
        errors: list[Exception] = []

        def allocate(n: int) -> None:
            try:
                response = stub.Allocate(api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(
                        devices_ids=[ids[n]])]), timeout=30)
                masks.append(response.container_responses[0].envs[
                    'HSA_CU_MASK'])
            except Exception as err:
                errors.append(err)

        threads = [threading.Thread(target=allocate, args=(n,))
                   for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self.assertEqual([], errors)
        union = 0
        for n in range(8):
            pod = self.kube.api.read_namespaced_pod('p%d' % n, 'team')
            self.assertEqual('success',
                             pod.metadata.annotations[hami.BIND_PHASE])
            cus = hami.decode_cu_allocated(
                pod.metadata.annotations[hami.CU_ALLOCATED])[uuid]
            self.assertEqual(38, cus.bit_count())
            self.assertEqual(0, union & cus, 'pod p%d overlaps' % n)
            union |= cus
        self.assertEqual((1 << 304) - 1, union)
        self.assertEqual(8, len(set(masks)))
