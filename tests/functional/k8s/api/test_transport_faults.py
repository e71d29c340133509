"""Transport faults of the API server, injected by the fault proxy.

A reset connection, a truncated answer or a 500 must become the project's
errors (:func:`amdgpu_virt.k8s.api.client.call`), and the daemon loops (the
node agent's registration thread, the scheduler's watchers) must outlive
them and catch up once the API server answers again.
"""

from __future__ import annotations

import testtools
from kubernetes import client

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import watching
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import faultproxy
from tests.functional.fixtures import kubeclient

Fault = faultproxy.Fault
Rule = faultproxy.Rule


class CallConvertsTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        self.fx = self.useFixture(faultproxy.FaultProxyFixture(self.kube))

    def _read(self) -> object:
        return k8s_client.call('GET node n1', self.fx.api.read_node, 'n1',
                               _preload_content=False)

    def test_each_fault_becomes_ours_naming_the_request(self) -> None:
        for fault in (Fault.RESET, Fault.RESET_AFTER, Fault.TRUNCATE):
            self.fx.proxy.add_rule(Rule(fault, 'GET'))
            err = self.assertRaises(exception.KubernetesUnavailable,
                                    self._read)
            self.assertIn('GET node n1', str(err))
        self.fx.proxy.add_rule(Rule(Fault.ERROR, 'GET'))
        err = self.assertRaises(exception.KubernetesError, self._read)
        self.assertNotIsInstance(err, exception.KubernetesUnavailable)
        self.assertIn('500', str(err))
        # and the client works again afterwards
        self.assertIn(b'"n1"', self._read().data)

    def test_missing_object_is_not_found(self) -> None:
        self.assertRaises(exception.KubernetesNotFound, k8s_client.call,
                          'GET node n9', self.fx.api.read_node, 'n9')

    def test_closed_port_is_unavailable(self) -> None:
        self.fx.proxy.stop()
        err = self.assertRaises(exception.KubernetesUnavailable, self._read)
        self.assertIn('GET node n1', str(err))


class AgentSurvivesTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        self.fx = self.useFixture(faultproxy.FaultProxyFixture(self.kube))
        units = devices.units_from_inventory(simulate.design_host(
            simulate.HostSpec(hostname='n1', gpus=2)))
        self.agent = agent.NodeAgent(
            agent.KubernetesNodeStore('n1', self.fx.api), units, 10,
            interval=0.05)
        self.addCleanup(self.agent.stop)

    def _registered(self) -> bool:
        node = self.kube.server.get_object('nodes', 'n1') or {}
        return hami.NODE_REGISTER in (node.get('metadata') or {}).get(
            'annotations', {})

    def test_registration_thread_outlives_resets_and_truncation(
            self) -> None:
        proxy = self.fx.proxy
        # every kind of fault, on reads and on the write, several times
        proxy.add_rule(Rule(Fault.RESET, 'GET', times=2))
        proxy.add_rule(Rule(Fault.TRUNCATE, 'GET', times=2))
        proxy.add_rule(Rule(Fault.ERROR, 'GET', times=1))
        proxy.add_rule(Rule(Fault.RESET, 'PATCH', times=2))
        proxy.add_rule(Rule(Fault.TRUNCATE, 'PATCH', times=1))
        self.agent.start()
        self.assertTrue(faultproxy.wait_for(self._registered, 20))
        self.assertGreaterEqual(proxy.faults(Fault.RESET), 4)
        self.assertGreaterEqual(proxy.faults(Fault.TRUNCATE), 3)
        # the node loses its registration (e.g. re-created): the same
        # thread, still alive after all those faults, registers it again
        self.kube.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_REGISTER: None}}})
        self.assertFalse(self._registered())
        proxy.add_rule(Rule(Fault.RESET_AFTER, 'GET', times=2))
        self.assertTrue(faultproxy.wait_for(self._registered, 20))
        self.assertTrue(self.agent._thread is not None and
                        self.agent._thread.is_alive())

    def test_api_server_away_for_a_while(self) -> None:
        self.fx.proxy.add_rule(Rule(Fault.RESET, times=None))
        self.agent.start()
        self.assertTrue(faultproxy.wait_for(
            lambda: self.agent.attempts >= 5, 20))
        self.assertFalse(self._registered())
        self.fx.proxy.clear()
        self.assertTrue(faultproxy.wait_for(self._registered, 20))


class WatcherSurvivesTest(testtools.TestCase):

    def test_watch_reset_and_truncated_list_are_retried(self) -> None:
        kube = self.useFixture(kubeclient.ApiServerFixture())
        fx = self.useFixture(faultproxy.FaultProxyFixture(kube))
        # the list (paged, so with a query), not the watch that follows
        fx.proxy.add_rule(Rule(Fault.TRUNCATE, 'GET',
                               r'/nodes(\?(?!.*watch=true).*)?$'))
        fx.proxy.add_rule(Rule(Fault.RESET, 'GET', 'watch=true', times=2))
        cache = schedcache.ClusterCache(allocator.load_strategy('first-fit'),
                                        'amd.com/gpu')
        watcher = watching.Watcher(
            'nodes', fx.api.list_node,
            lambda items, _rv: cache.replace_nodes(items),
            watching.node_event(cache), timeout=2, backoff=0.05)
        watcher.start()
        self.addCleanup(watcher.stop)
        self.assertTrue(faultproxy.wait_for(
            lambda: fx.proxy.faults(Fault.RESET) == 2 and
            fx.proxy.log[-1][2] is Fault.PASS, 20))
        self.assertEqual(1, fx.proxy.faults(Fault.TRUNCATE))
        # the node arrives through the watch that followed the faults
        kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        self.assertTrue(faultproxy.wait_for(
            lambda: cache.node_count() == 1, 20))
