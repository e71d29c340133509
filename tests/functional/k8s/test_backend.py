"""The ``kubernetes`` backend against the API server stand-in."""

from __future__ import annotations

import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import plugins
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s import agent
from amdgpu_virt.k8s import backend
from amdgpu_virt.k8s import devices
from amdgpu_virt.model import PciAddress
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient


class KubernetesBackendTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1',
                                                           gpus=2))
        self.units = devices.units_from_inventory(inventory)
        self.agent = agent.NodeAgent(
            agent.KubernetesNodeStore('n1', self.kube.api), self.units, 10)
        self.agent.sync_once()
        self.backend = plugins.load_driver(
            'amdgpu_virt.backends', 'kubernetes', conf_pkg.new_conf(),
            core_api=self.kube.api)
        self.first = PciAddress.parse(self.units[0].gpu_address)
        self.second = PciAddress.parse(self.units[1].gpu_address)

    def _pod(self, name: str, uuid: str, bound: bool) -> None:
        value = hami.encode_pod_devices([[hami.ContainerDevice(
            uuid, 'AMD Instinct MI300X', 1024, 30)]])
        pod = {'metadata': {'name': name, 'namespace': 'team',
                            'labels': {hami.VGPU_NODE: 'n1'},
                            'annotations': {hami.DEVICES_ALLOCATED: value,
                                            hami.VGPU_NODE: 'n1'}},
               'spec': {'containers': [{'name': 'c', 'image': 'x'}]}}
        if bound:
            pod['spec']['nodeName'] = 'n1'
        self.kube.server.put_object('pods', pod)

    def test_offered_and_consumers(self) -> None:
        self.assertIsInstance(self.backend, backend.KubernetesBackend)
        self.assertTrue(self.backend.is_offered('n1', self.first))
        self.assertFalse(self.backend.is_withdrawn('n1', self.first))
        self.assertFalse(self.backend.is_offered('gone', self.first))
        self.assertTrue(self.backend.is_withdrawn('gone', self.first))
        self.assertEqual((), self.backend.consumers('n1', self.first))
        self._pod('bound', self.units[0].uuid, True)
        self._pod('chosen', self.units[0].uuid, False)
        self._pod('other', self.units[1].uuid, True)
        self.assertEqual(('team/bound', 'team/chosen'),
                         self.backend.consumers('n1', self.first))
        self.assertEqual(('team/other',),
                         self.backend.consumers('n1', self.second))
        # withdrawn: the pods' devices are unknown now, so they may be on
        # this GPU (fail closed)
        self.agent.cleanup()
        self.assertTrue(self.backend.is_withdrawn('n1', self.first))
        self.assertEqual(('team/bound', 'team/chosen', 'team/other'),
                         self.backend.consumers('n1', self.first))
