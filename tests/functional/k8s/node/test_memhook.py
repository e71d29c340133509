"""The memory-hook verdict and the memory enforcement of a node agent,
against the API server stand-in: registration, node labels and Events."""

from __future__ import annotations

import os
import shutil

import _ctypes
import fixtures
import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import enforcement
from amdgpu_virt.k8s.node import memhook
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import cgroupfs
from tests.functional.fixtures import kubeclient


class MemoryHookPublishTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.useFixture(fixtures.FakeLogger())
        self.inventory = simulate.design_host(
            simulate.HostSpec(hostname='n1', gpus=2))

    def agent_for(self, library: str, cgroup_root: str | None = None,
                  requirement: str = 'kernel-or-hook') -> agent.NodeAgent:
        conf = conf_pkg.new_conf()
        conf.set_override('node_name', 'n1', 'kubernetes')
        conf.set_override('vgpu_library', library, 'kubernetes')
        # no kernel caps unless the test gives a simulated cgroup tree
        conf.set_override('cgroup_root', cgroup_root or os.path.join(
            self.tmp, 'no-cgroup'), 'kubernetes')
        conf.set_override('memory_enforcement', requirement, 'kubernetes')
        node_agent = agent.from_conf(
            conf, self.inventory,
            store=agent.KubernetesNodeStore('n1', self.kube.api))
        node_agent.health = lambda unit: True
        return node_agent

    def counts(self) -> set[int]:
        node = self.kube.api.read_node('n1')
        return {d.count for d in hami.decode_node_register(
            node.metadata.annotations[hami.NODE_REGISTER])}

    def events(self) -> list[client.CoreV1Event]:
        return [e for e in self.kube.api.list_namespaced_event(
            'default').items if e.involved_object.name == 'n1']

    def label(self, key: str = memhook.LABEL) -> str | None:
        return (self.kube.api.read_node('n1').metadata.labels or {}).get(
            key)

    def levels(self) -> set[str]:
        node = self.kube.api.read_node('n1')
        return {d.custominfo[enforcement.CUSTOMINFO_KEY]
                for d in hami.decode_node_register(
                    node.metadata.annotations[hami.NODE_REGISTER])}

    def kernel_node(self) -> str:
        root = os.path.join(self.tmp, 'cgroup')
        cgroupfs.SimNode(root, gpus={str(g.address): 1 << 30
                                     for g in self.inventory.gpus})
        return root

    def publish(self, node_agent: agent.NodeAgent) -> None:
        memhook.publish(node_agent)
        enforcement.publish(node_agent)
        node_agent.sync_once()

    def test_kernel_caps_without_the_hook_keep_slices(self) -> None:
        missing = os.path.join(self.tmp, 'vgpu', 'libamvgpu.so')
        self.publish(self.agent_for(missing, self.kernel_node()))
        self.assertEqual({10}, self.counts())
        self.assertEqual({'kernel'}, self.levels())
        self.assertEqual('kernel', self.label(enforcement.NODE_LABEL))
        self.assertEqual(memhook.UNAVAILABLE, self.label())
        (event,) = self.events()
        self.assertEqual(memhook.EVENT_REASON, event.reason)
        self.assertIn('capped by the kernel only', event.message)

    def test_kernel_required_hook_only_says_why(self) -> None:
        library = os.path.join(self.tmp, 'libamvgpu.so')
        shutil.copy(_ctypes.__file__, library)
        self.publish(self.agent_for(library, requirement='kernel'))
        self.assertEqual({1}, self.counts())
        self.assertEqual({'hook'}, self.levels())
        self.assertEqual('hook', self.label(enforcement.NODE_LABEL))
        (event,) = self.events()
        self.assertEqual(('Warning', enforcement.EVENT_REASON),
                         (event.type, event.reason))
        self.assertIn('memory_enforcement = kernel needs the kernel',
                      event.message)
        self.assertIn('cannot open the cgroup root', event.message)
        self.assertIn('whole GPUs only', event.message)

    def test_both_say_kernel_hook(self) -> None:
        library = os.path.join(self.tmp, 'libamvgpu.so')
        shutil.copy(_ctypes.__file__, library)
        self.publish(self.agent_for(library, self.kernel_node(), 'kernel'))
        self.assertEqual({10}, self.counts())
        self.assertEqual({'kernel+hook'}, self.levels())
        self.assertEqual('kernel-hook', self.label(enforcement.NODE_LABEL))
        self.assertEqual([], self.events())

    def test_missing_hook_whole_gpus_label_and_event(self) -> None:
        missing = os.path.join(self.tmp, 'vgpu', 'libamvgpu.so')
        node_agent = self.agent_for(missing)
        memhook.publish(node_agent)
        memhook.publish(node_agent)  # a restart publishes the same
        node_agent.sync_once()
        self.assertEqual({1}, self.counts())
        self.assertEqual(memhook.UNAVAILABLE, self.label())
        (event,) = self.events()
        self.assertEqual(('Warning', memhook.EVENT_REASON),
                         (event.type, event.reason))
        self.assertIn(missing, event.message)
        self.assertIn('no such file', event.message)

    def test_usable_hook_shares_and_says_ready(self) -> None:
        library = os.path.join(self.tmp, 'libamvgpu.so')
        shutil.copy(_ctypes.__file__, library)
        # a node that had no hook before gets its label back to ready
        self.kube.api.patch_node('n1', {'metadata': {'labels': {
            memhook.LABEL: memhook.UNAVAILABLE}}})
        node_agent = self.agent_for(library)
        memhook.publish(node_agent)
        node_agent.sync_once()
        self.assertEqual({10}, self.counts())
        self.assertEqual(memhook.READY, self.label())
        self.assertEqual([], self.events())

    def test_an_api_failure_is_not_fatal(self) -> None:
        node_agent = self.agent_for(os.path.join(self.tmp, 'none.so'))
        self.kube.api.delete_node('n1')
        logger = self.useFixture(fixtures.FakeLogger())
        memhook.publish(node_agent)
        self.assertIn('memory-hook verdict not published', logger.output)
