"""A namespace that requires kernel memory enforcement, through the
extender over HTTP: its slices land only on GPUs whose registration says
``kernel`` (or ``kernel+hook``), and a refusal names the label."""

from __future__ import annotations

import time
from typing import Any

import testtools
from kubernetes import client

from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import enforcement
from amdgpu_virt.k8s.node.enforcement import Level
from amdgpu_virt.sharing import enforcement as vocabulary
from amdgpu_virt.sharing import hami
from tests.functional.k8s import cluster

NODES = ('n1', 'n2')


class NamespaceRequirementTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(NODES, gpus=2))
        self.api = self.cluster.api
        for name, value in (('strict', 'kernel'), ('odd', 'strongest')):
            self.api.create_namespace(client.V1Namespace(
                metadata=client.V1ObjectMeta(name=name, labels={
                    enforcement.NAMESPACE_LABEL: value})))
        self.register('n1', Level.HOOK)
        self.register('n2', Level.KERNEL_HOOK)

    def register(self, node: str, level: Level) -> None:
        units = self.cluster.units[node]
        node_agent = agent.NodeAgent(agent.KubernetesNodeStore(
            node, self.api), units, 10)
        node_agent.enforcement = enforcement.NodeEnforcement(
            enforcement.Requirement.KERNEL_OR_HOOK,
            {u.gpu_address: level for u in units}, {})
        node_agent.sync_once()
        cache = self.cluster.service.cache
        deadline = time.monotonic() + 10
        while True:
            view = cache.view(node)
            devices = [] if view is None else [g.info for g in view.gpus]
            if devices and all(vocabulary.registered_level(d.custominfo)
                               is level for d in devices):
                return
            if time.monotonic() > deadline:
                raise AssertionError('the cache never saw %s' % level)
            time.sleep(0.02)

    def slice_pod(self, name: str, namespace: str,
                  **limits: str) -> dict[str, Any]:
        return self.cluster.create(cluster.gpu_pod(name, [
            limits or {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
                       'amd.com/gpumem': '1024'}], namespace=namespace))

    def test_slices_go_to_kernel_gpus_only(self) -> None:
        for n in range(3):
            result = self.cluster.filter(self.slice_pod('s%d' % n,
                                                        'strict'))
            self.assertEqual(['n2'], result['NodeNames'], result)
            self.assertIn('gpu.amd.com/memory-enforcement=kernel',
                          result['FailedNodes']['n1'])
            self.assertIn('memory enforcement hook',
                          result['FailedNodes']['n1'])

    def test_no_kernel_gpu_no_slice_and_why(self) -> None:
        self.register('n2', Level.HOOK)
        result = self.cluster.filter(self.slice_pod('s', 'strict'))
        self.assertEqual([], result['NodeNames'])
        for node in NODES:
            self.assertIn("namespace 'strict' (label "
                          "gpu.amd.com/memory-enforcement=kernel) requires "
                          "the kernel", result['FailedNodes'][node])

    def test_whole_gpus_and_other_namespaces_go_anywhere(self) -> None:
        whole = self.cluster.filter(self.slice_pod(
            'w', 'strict', **{'amd.com/gpu': '1'}))
        self.assertEqual(1, len(whole['NodeNames']), whole)
        free = self.cluster.filter(self.slice_pod('t', 'team'))
        self.assertEqual(1, len(free['NodeNames']), free)
        self.assertNotIn('memory enforcement', str(free['FailedNodes']))

    def test_an_unknown_requirement_fails_closed(self) -> None:
        result = self.cluster.filter(self.slice_pod('x', 'odd'))
        self.assertIn(enforcement.NAMESPACE_LABEL, result['Error'])
        self.assertIn("'strongest'", result['Error'])
        self.assertFalse(result['NodeNames'])

    def test_registration_round_trip(self) -> None:
        node = self.api.read_node('n2')
        infos = hami.decode_node_register(
            node.metadata.annotations[hami.NODE_REGISTER])
        self.assertEqual({'kernel+hook'}, {
            i.custominfo[enforcement.CUSTOMINFO_KEY] for i in infos})
