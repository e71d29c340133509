"""The node agent against the API server stand-in."""

from __future__ import annotations

import json
from typing import Any

import fixtures
import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient


class _Racing(agent.KubernetesNodeStore):
    """Changes the node between each read and write ``times`` times."""

    def __init__(self, node: str, api: Any, times: int) -> None:
        super().__init__(node, api)
        self.times = times

    def annotate(self, node: Any, annotations: Any) -> None:
        if self.times:
            self.times -= 1
            self.api.patch_node(self.node_name, {'metadata': {'labels': {
                'race': str(self.times)}}})
        super().annotate(node, annotations)


class NodeAgentTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        self.units = devices.units_from_inventory(simulate.design_host(
            simulate.HostSpec(hostname='n1', gpus=2)))
        self.healthy = {u.uuid: True for u in self.units}
        self.agent = agent.NodeAgent(
            agent.KubernetesNodeStore('n1', self.kube.api), self.units, 10,
            health=lambda unit: self.healthy[unit.uuid], interval=0.05)

    def _registered(self) -> tuple[hami.DeviceInfo, ...]:
        node = self.kube.api.read_node('n1')
        return hami.decode_node_register(
            node.metadata.annotations[hami.NODE_REGISTER])

    def test_registers_once_then_only_on_change(self) -> None:
        self.assertTrue(self.agent.sync_once())
        self.assertEqual([u.uuid for u in self.units],
                         [d.id for d in self._registered()])
        version = self.kube.api.read_node('n1').metadata.resource_version
        self.assertFalse(self.agent.sync_once())
        self.assertEqual(version, self.kube.api.read_node(
            'n1').metadata.resource_version)
        self.healthy[self.units[1].uuid] = False
        self.assertTrue(self.agent.sync_once())
        self.assertEqual([True, False],
                         [d.health for d in self._registered()])
        self.assertEqual(2, self.agent.writes)

    def test_equivalent_value_is_left_alone(self) -> None:
        # HAMi's docs write zero fields out; the meaning is the same
        entries = [dict(hami.device_to_json(d), index=d.index, numa=d.numa)
                   for d in agent.registration(self.units, 10, {})]
        self.kube.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_REGISTER: json.dumps(entries)}}})
        self.assertFalse(self.agent.sync_once())

    def test_unreadable_value_is_replaced(self) -> None:
        self.kube.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_REGISTER: '[{"count": "ten"}]'}}})
        self.assertTrue(self.agent.sync_once())
        self.assertEqual(2, len(self._registered()))

    def test_conflicts_are_retried(self) -> None:
        self.agent.store = _Racing('n1', self.kube.api, times=2)
        self.assertTrue(self.agent.sync_once())
        self.assertEqual(2, len(self._registered()))
        self.agent.store = _Racing('n1', self.kube.api, times=99)
        self.healthy[self.units[0].uuid] = False
        err = self.assertRaises(exception.KubernetesError,
                                self.agent.sync_once)
        self.assertIn('conflicts', str(err))

    def test_background_loop_and_cleanup(self) -> None:
        self.agent.start()
        self.addCleanup(self.agent.stop)
        kube = self.kube

        def registered() -> bool:
            node = kube.api.read_node('n1')
            return hami.NODE_REGISTER in (node.metadata.annotations or {})

        for _ in range(200):
            if registered():
                break
            self.agent._stop.wait(0.05)
        self.assertTrue(registered())
        self.agent.stop()
        self.agent.cleanup()
        self.assertFalse(registered())
        self.agent.cleanup()  # nothing left: no error

    def test_missing_node_names_it(self) -> None:
        lost = agent.NodeAgent(agent.KubernetesNodeStore('ghost',
                                                         self.kube.api),
                               self.units, 10)
        err = self.assertRaises(exception.KubernetesError, lost.sync_once)
        self.assertIn('ghost', str(err))


class LedgerConfigMapTest(testtools.TestCase):
    """The agent registers what the ledger ConfigMap gives its node."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        self.inventory = simulate.design_host(
            simulate.HostSpec(hostname='n1', gpus=2))
        self.gpus = [g.address for g in self.inventory.gpus]
        self.where = ledgermap.Location('kube-system', 'amdgpu-virt-ledger')
        conf = conf_pkg.new_conf()
        conf.set_override('ledger_source', 'configmap', 'kubernetes')
        conf.set_override('node_name', 'n1', 'kubernetes')
        conf.set_override('device_root', '/nonexistent', 'kubernetes')
        self.agent = agent.from_conf(
            conf, self.inventory,
            store=agent.KubernetesNodeStore('n1', self.kube.api))
        # the health check looks for /dev/kfd, which this machine lacks
        self.agent.health = lambda unit: True

    def write_ledger(self, *roles: Role) -> None:
        ledgermap.write(self.kube.api, av_ledger.build([
            av_ledger.GpuAssignment(
                'n1', address, role, 'MI300X',
                vf_count=8 if role is Role.NOVA_VF else None)
            for address, role in zip(self.gpus, roles, strict=True)]),
            self.where)

    def registered(self) -> list[str]:
        node = self.kube.api.read_node('n1')
        value = (node.metadata.annotations or {}).get(hami.NODE_REGISTER)
        if value is None:
            return []
        return [i.custominfo[hami.CUSTOMINFO_PCI_BDF]
                for i in hami.decode_node_register(value)]

    def test_a_gpu_moved_to_nova_vf_leaves_the_registration(self) -> None:
        # no ConfigMap yet: nothing is offered (fail closed)
        self.agent.sync_once()
        self.assertEqual([], self.registered())
        self.write_ledger(Role.K8S_SHARED, Role.K8S_DEDICATED)
        self.assertTrue(self.agent.sync_once())
        self.assertEqual([str(a) for a in self.gpus], self.registered())
        self.write_ledger(Role.K8S_SHARED, Role.NOVA_VF)
        self.assertTrue(self.agent.sync_once())
        self.assertEqual([str(self.gpus[0])], self.registered())
        # the ConfigMap is damaged: the last good ledger stays in force
        self.kube.api.patch_namespaced_config_map(
            self.where.name, self.where.namespace,
            {'data': {ledgermap.DATA_KEY: 'hosts: {n1: {gpus: [{}]}}'}})
        logger = self.useFixture(fixtures.FakeLogger())
        self.assertFalse(self.agent.sync_once())
        self.assertIn('configmap kube-system/amdgpu-virt-ledger',
                      logger.output)
        self.assertIn('keeps the last good ledger', logger.output)
        self.assertEqual([str(self.gpus[0])], self.registered())
        # and so it does when the ConfigMap is deleted
        self.kube.api.delete_namespaced_config_map(self.where.name,
                                                   self.where.namespace)
        self.assertFalse(self.agent.sync_once())
        self.assertEqual([str(self.gpus[0])], self.registered())
        self.write_ledger(Role.K8S_SHARED, Role.K8S_SHARED)
        self.assertTrue(self.agent.sync_once())
        self.assertEqual(2, len(self.registered()))


class NodeLabelsTest(testtools.TestCase):
    """The agent keeps AMD node-labeller compatible labels."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(
                name='n1', labels={'kubernetes.io/hostname': 'n1',
                                   'amd.com/gpu.stale': 'x'})))
        inventory = simulate.design_host(
            simulate.HostSpec(hostname='n1', gpus=2, mode='cpx', nps='nps4'))
        self.units = devices.units_from_inventory(inventory)
        self.agent = agent.NodeAgent(
            agent.KubernetesNodeStore('n1', self.kube.api), self.units, 10,
            gpus={str(g.address): g for g in inventory.gpus})

    def _labels(self) -> dict[str, str]:
        return dict(self.kube.api.read_node('n1').metadata.labels or {})

    def test_labels_written_once_and_stale_ones_removed(self) -> None:
        self.agent.sync_once()
        labels = self._labels()
        self.assertEqual('38', labels['amd.com/gpu.cu-count'])
        self.assertEqual('16', labels['beta.amd.com/gpu.cu-count.38'])
        self.assertEqual('cpx_nps4',
                         labels['amd.com/gpu.compute-memory-partition'])
        self.assertEqual('AMD_Instinct_MI300X',
                         labels['amd.com/gpu.product-name'])
        self.assertEqual('74a1', labels['amd.com/gpu.device-id'])
        self.assertEqual('24G', labels['amd.com/gpu.vram'])
        self.assertNotIn('amd.com/gpu.stale', labels)
        self.assertEqual('n1', labels['kubernetes.io/hostname'])
        writes = self.agent.writes
        self.assertFalse(self.agent.sync_once())
        self.assertEqual(writes, self.agent.writes)

    def test_withdrawn_gpus_leave_the_counts(self) -> None:
        self.agent.sync_once()
        first_gpu = self.units[0].gpu_address
        self.agent.units = tuple(u for u in self.units
                                 if u.gpu_address == first_gpu)
        self.assertTrue(self.agent.sync_once())
        self.assertEqual('8', self._labels()['beta.amd.com/gpu.cu-count.38'])
