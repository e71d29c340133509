"""Building the device plugin and the webhook from the options."""

from __future__ import annotations

from typing import Any

import fixtures
import testtools

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.admission import webhook
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import podsource


class _NoPods(podsource.PodSource):
    def node_lock(self) -> str | None:
        return None

    def pods_on_node(self) -> list[dict[str, Any]]:
        return []

    def annotate_pod(self, pod: Any, annotations: Any) -> None:
        raise AssertionError('not expected')

    def release_lock(self, namespace: str, name: str,
                     uid: str | None = None) -> None:
        raise AssertionError('not expected')

    def allocation_record(self) -> Any:
        from amdgpu_virt.k8s.record import allocation as allocrecord

        return allocrecord.Record(self.node_name)


class FromConfTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.conf = conf_pkg.new_conf()
        self.inventory = simulate.design_host(simulate.HostSpec(
            hostname='n1', gpus=2))

    def test_whole_mode(self) -> None:
        self.conf.set_override('allocation_mode', 'whole', 'kubernetes')
        self.conf.set_override('share_count', 1, 'kubernetes')
        self.conf.set_override('device_plugin_dir', '/tmp/dp', 'kubernetes')
        plugin = deviceplugin.from_conf(self.conf, self.inventory,
                                        pod_source=_NoPods('n1'))
        self.assertIsNone(plugin.pod_source)
        self.assertEqual(('/tmp/dp/amdgpu-virt.sock', 'amd.com/gpu', 1, 2),
                         (plugin.socket_path, plugin.resource_name,
                          plugin.share_count, len(plugin.units)))
        self.assertEqual('best-fit', plugin.cu_strategy.name)

    def test_hami_mode_keeps_the_pod_source(self) -> None:
        source = _NoPods('n1')
        plugin = deviceplugin.from_conf(self.conf, self.inventory,
                                        pod_source=source)
        self.assertIs(source, plugin.pod_source)
        err = self.assertRaises(exception.DevicePluginError,
                                plugin.allocate, ['x-0'], 'req[0]')
        self.assertIn('no live node lock', str(err))

    def test_unknown_strategy(self) -> None:
        self.conf.set_override('cu_strategy', 'nope', 'sharing')
        self.assertRaises(exception.DriverNotFound, deviceplugin.from_conf,
                          self.conf, self.inventory, _NoPods('n1'))

    def test_node_name(self) -> None:
        self.useFixture(fixtures.EnvironmentVariable('NODE_NAME', 'env-n'))
        self.assertEqual('env-n', k8s_client.node_name(self.conf))
        self.conf.set_override('node_name', 'conf-n', 'kubernetes')
        self.assertEqual('conf-n', k8s_client.node_name(self.conf))
        self.conf.clear_override('node_name', 'kubernetes')
        self.useFixture(fixtures.EnvironmentVariable('NODE_NAME'))
        err = self.assertRaises(exception.ConfigError,
                                k8s_client.node_name, self.conf)
        self.assertIn('[kubernetes] node_name', str(err))

    def test_missing_kubeconfig(self) -> None:
        self.conf.set_override('kubeconfig', '/nonexistent/kubeconfig',
                               'kubernetes')
        err = self.assertRaises(exception.ConfigError, k8s_client.core_api,
                                self.conf)
        self.assertIn('/nonexistent/kubeconfig', str(err))

    def test_webhook_needs_cert_and_key_together(self) -> None:
        self.conf.set_override('webhook_cert_file', '/x.crt', 'kubernetes')
        err = self.assertRaises(exception.ConfigError, webhook.from_conf,
                                self.conf, core_api=object())
        self.assertIn('webhook_key_file', str(err))

    def test_webhook_server(self) -> None:
        self.conf.set_override('webhook_host', '127.0.0.1', 'kubernetes')
        self.conf.set_override('webhook_port', 0, 'kubernetes')
        server = webhook.from_conf(self.conf, core_api=object())
        self.addCleanup(server.server_close)
        self.assertEqual('amdgpu-virt-scheduler',
                         server.policy.scheduler_name)


class ConfIsolationTest(testtools.TestCase):

    def test_overrides_do_not_leak_between_confs(self) -> None:
        first = conf_pkg.new_conf()
        second = conf_pkg.new_conf()
        first.set_override('share_count', 3, 'kubernetes')
        first.set_override('cu_strategy', 'first-fit', 'sharing')
        self.assertEqual(3, first.kubernetes.share_count)
        self.assertEqual(10, second.kubernetes.share_count)
        self.assertEqual('best-fit', second.sharing.cu_strategy)
        self.assertEqual(10, conf_pkg.new_conf().kubernetes.share_count)
