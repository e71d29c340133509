"""The node side end to end, with the scheduler's part played by the test.

Agent, device plugin, API server stand-in and kubelet stand-in run
together: the agent registers the GPUs, the test does what a HAMi
scheduler does with that registration (allocation annotations, node lock,
binding through ``pods/binding``), and kubelet's Allocate completes the
pod's allocation. The scheduler extender itself is not part of this test.
"""

from __future__ import annotations

import datetime
import shutil
import tempfile

import testtools
from kubernetes import client

from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster

RESOURCE = 'amd.com/gpu'


class NodeFlowTest(testtools.TestCase):

    def test_register_schedule_bind_allocate(self) -> None:
        kube = self.useFixture(kubeclient.ApiServerFixture())
        api = kube.api
        api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name='n1')))
        directory = tempfile.mkdtemp(prefix='nf')
        self.addCleanup(shutil.rmtree, directory, True)
        kubelet = kubelet_fixture.KubeletStandIn(directory).start()
        self.addCleanup(kubelet.stop)
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1',
                                                           gpus=2))
        units = devices.units_from_inventory(inventory)
        node_agent = agent.NodeAgent(
            agent.KubernetesNodeStore('n1', api), units, 10)
        plugin = deviceplugin.DevicePlugin(
            inventory, plugin_dir=directory, socket_name='amdgpu.sock',
            share_count=10, poll_interval=0.05,
            pod_source=podsource.KubernetesPodSource('n1', api)).start()
        self.addCleanup(plugin.stop)

        # node side: registration and kubelet capacity agree
        self.assertTrue(node_agent.sync_once())
        registered = hami.decode_node_register(api.read_node(
            'n1').metadata.annotations[hami.NODE_REGISTER])
        endpoint = kubelet.wait_for_devices(RESOURCE, count=20)
        self.assertEqual(sum(d.count for d in registered), endpoint.capacity)

        # the scheduler's part: half of the second GPU, 32 GiB
        created = api.create_namespaced_pod('team', client.V1Pod(
            metadata=client.V1ObjectMeta(name='job', namespace='team'),
            spec=client.V1PodSpec(containers=[client.V1Container(
                name='main', image='rocm', resources=client.
                V1ResourceRequirements(limits={
                    'amd.com/gpu': '1', 'amd.com/gpucores': '50',
                    'amd.com/gpumem': '32768'}))])))
        device = registered[1]
        cus = hami.percent_to_cus(50, device.devcore)
        value = hami.encode_pod_devices([[hami.ContainerDevice(
            device.id, device.type, 32768, cus)]])
        cluster.book(api, 'n1', created, ((hami.ContainerDevice(
            device.id, device.type, 32768, cus),),),
            allocrecord.capacity_of(registered))
        now = datetime.datetime.now(datetime.UTC)
        api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: hami.encode_node_lock(hami.NodeLock(
                now, 'team', 'job'))}}},
            _content_type='application/merge-patch+json')
        api.patch_namespaced_pod('job', 'team', {'metadata': {
            'labels': {hami.VGPU_NODE: 'n1'},
            'annotations': {
                hami.DEVICES_TO_ALLOCATE: value,
                hami.DEVICES_ALLOCATED: value, hami.VGPU_NODE: 'n1',
                hami.VGPU_TIME: hami.encode_unix_time(now.timestamp()),
                hami.BIND_PHASE: 'allocating',
                hami.BIND_TIME: hami.encode_unix_time(now.timestamp())}}})
        api.create_namespaced_pod_binding(
            'job', 'team', client.V1Binding(
                metadata=client.V1ObjectMeta(name='job'),
                target=client.V1ObjectReference(kind='Node', name='n1')),
            _preload_content=False)

        # kubelet admits the container
        _chosen, response = kubelet.admit(RESOURCE, 1)
        self.assertEqual('GPU-%s' % units[1].uuid,
                         response.envs['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0:0-151', response.envs['HSA_CU_MASK'])
        self.assertEqual('32768m', response.envs['HIP_DEVICE_MEMORY_LIMIT_0'])
        self.assertEqual(
            ['/dev/kfd', units[1].card_path, units[1].render_path],
            [d.host_path for d in response.devices])
        pod = api.read_namespaced_pod('job', 'team')
        self.assertEqual('success', pod.metadata.annotations[
            hami.BIND_PHASE])
        self.assertEqual({units[1].uuid: (1 << 152) - 1},
                         hami.decode_cu_allocated(pod.metadata.annotations[
                             hami.CU_ALLOCATED]))
        self.assertNotIn(hami.NODE_LOCK, api.read_node(
            'n1').metadata.annotations)
        # nothing changed on the node side: the agent writes nothing
        self.assertFalse(node_agent.sync_once())
