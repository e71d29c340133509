"""The role ledger gate of the node agent and the device plugin."""

from __future__ import annotations

import os
from typing import Any

import fixtures
import testtools

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import roles as noderoles
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import hami

INVENTORY = simulate.design_host(simulate.HostSpec(hostname='n1', gpus=2))
GPU0, GPU1 = (g.address for g in INVENTORY.gpus)


def ledger_of(**roles: Role) -> av_ledger.Ledger:
    """``gpu0=Role.X, gpu1=...`` -> the ledger of host n1."""
    addresses = {'gpu0': GPU0, 'gpu1': GPU1}
    return av_ledger.build([
        av_ledger.GpuAssignment('n1', addresses[k], role, 'MI300X',
                                vf_count=8 if role is Role.NOVA_VF else None)
        for k, role in roles.items()])


class _Scripted(noderoles.LedgerSource):
    """Returns (or raises) the next scripted result on each read."""

    def __init__(self, *results: Any) -> None:
        self.results = list(results)
        self.reads = 0

    def read(self) -> av_ledger.Ledger | None:
        self.reads += 1
        result = self.results.pop(0) if len(self.results) > 1 \
            else self.results[0]
        if isinstance(result, Exception):
            raise result
        return result

    def __str__(self) -> str:
        return 'configmap kube-system/test-ledger'


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class NodeRolesTest(testtools.TestCase):

    def test_only_k8s_roles_of_this_node(self) -> None:
        ledger = av_ledger.build([
            av_ledger.GpuAssignment('n1', GPU0, Role.K8S_SHARED, 'MI300X'),
            av_ledger.GpuAssignment('n1', GPU1, Role.NOVA_VF, 'MI300X',
                                    vf_count=8),
            av_ledger.GpuAssignment('n2', GPU1, Role.K8S_DEDICATED,
                                    'MI300X')])
        roles = noderoles.NodeRoles(_Scripted(ledger), 'n1')
        self.assertEqual(frozenset({GPU0}), roles.refresh())
        self.assertTrue(roles.offers(str(GPU0)))
        self.assertFalse(roles.offers(str(GPU1)))
        self.assertFalse(roles.offers('not-an-address'))

    def test_fail_closed_before_a_first_good_ledger(self) -> None:
        logger = self.useFixture(fixtures.FakeLogger())
        source = _Scripted(None, exception.PlanError(
            source='configmap kube-system/test-ledger ledger.yaml',
            reason='hosts.n1.gpus[0].role: bad'))
        roles = noderoles.NodeRoles(source, 'n1')
        self.assertEqual(frozenset(), roles.refresh())
        self.assertIn('configmap kube-system/test-ledger does not exist',
                      logger.output)
        self.assertEqual(frozenset(), roles.refresh())
        self.assertIn('hosts.n1.gpus[0].role', logger.output)
        self.assertIn('no ledger read yet, so node n1 offers no GPU',
                      logger.output)
        self.assertEqual(2, roles.failures)

    def test_a_bad_read_keeps_the_last_good_ledger(self) -> None:
        logger = self.useFixture(fixtures.FakeLogger())
        good = ledger_of(gpu0=Role.K8S_SHARED, gpu1=Role.K8S_DEDICATED)
        source = _Scripted(good, None, ValueError('boom'),
                           ledger_of(gpu0=Role.K8S_SHARED,
                                     gpu1=Role.NOVA_VF))
        roles = noderoles.NodeRoles(source, 'n1')
        both = frozenset({GPU0, GPU1})
        self.assertEqual(both, roles.refresh())
        self.assertEqual(both, roles.refresh())  # missing
        self.assertEqual(both, roles.refresh())  # any error
        self.assertIn('keeps the last good ledger', logger.output)
        self.assertIn('boom', logger.output)
        self.assertEqual(frozenset({GPU0}), roles.refresh())
        self.assertEqual(0, roles.failures)

    def test_current_reads_again_only_when_stale(self) -> None:
        clock = _Clock()
        source = _Scripted(ledger_of(gpu0=Role.K8S_SHARED))
        roles = noderoles.NodeRoles(source, 'n1', max_age=30, clock=clock)
        self.assertEqual(frozenset({GPU0}), roles.current())
        clock.now = 29
        roles.current()
        self.assertEqual(1, source.reads)
        clock.now = 30
        roles.current()
        self.assertEqual(2, source.reads)

    def test_file_source(self) -> None:
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'ledger.yaml')
        source = noderoles.FileSource(path)
        self.assertIsNone(source.read())
        av_ledger.save(ledger_of(gpu1=Role.K8S_SHARED), path)
        roles = noderoles.NodeRoles(source, 'n1')
        self.assertEqual(frozenset({GPU1}), roles.refresh())
        with open(path, 'w') as handle:
            handle.write('hosts: [not, a, mapping')
        logger = self.useFixture(fixtures.FakeLogger())
        self.assertEqual(frozenset({GPU1}), roles.refresh())
        self.assertIn(path, logger.output)


class FromConfTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.conf = conf_pkg.new_conf()

    def test_none_is_the_default(self) -> None:
        self.assertIsNone(noderoles.from_conf(self.conf, 'n1'))

    def test_file_needs_a_path(self) -> None:
        self.conf.set_override('ledger_source', 'file', 'kubernetes')
        err = self.assertRaises(exception.ConfigError, noderoles.from_conf,
                                self.conf, 'n1')
        self.assertIn('[kubernetes] ledger_file', str(err))
        self.conf.set_override('ledger_file', '/x/ledger.yaml', 'kubernetes')
        self.conf.set_override('registration_interval', 5, 'kubernetes')
        roles = noderoles.from_conf(self.conf, 'n1')
        assert roles is not None
        self.assertEqual(('ledger file /x/ledger.yaml', 'n1', 5.0),
                         (str(roles.source), roles.host, roles.max_age))

    def test_configmap_location_from_pool(self) -> None:
        self.conf.set_override('ledger_source', 'configmap', 'kubernetes')
        self.conf.set_override('configmap_namespace', 'gpu', 'pool')
        self.conf.set_override('node_name', 'conf-n', 'kubernetes')
        roles = noderoles.from_conf(self.conf, core_api=object())
        assert roles is not None
        self.assertEqual(('configmap gpu/amdgpu-virt-ledger', 'conf-n'),
                         (str(roles.source), roles.host))

    def test_unknown_source_is_refused_by_the_option(self) -> None:
        self.assertRaises(ValueError, self.conf.set_override,
                          'ledger_source', 'etcd', 'kubernetes')


class _Store(agent.NodeStore):

    def __init__(self) -> None:
        self.node: dict[str, Any] = {'metadata': {'name': 'n1'}}

    def read(self) -> dict[str, Any]:
        return self.node

    def annotate(self, node: Any, annotations: Any) -> None:
        self.node = {'metadata': {'name': 'n1', 'annotations': dict(
            annotations)}}


class AgentWithLedgerTest(testtools.TestCase):

    def registered(self, store: _Store) -> list[str]:
        value = store.node['metadata']['annotations'][hami.NODE_REGISTER]
        return [i.custominfo[hami.CUSTOMINFO_PCI_BDF]
                for i in hami.decode_node_register(value)]

    def test_registers_only_the_ledgers_gpus_each_time(self) -> None:
        source = _Scripted(ledger_of(gpu0=Role.K8S_SHARED,
                                     gpu1=Role.K8S_SHARED),
                           ledger_of(gpu0=Role.K8S_SHARED,
                                     gpu1=Role.NOVA_VF),
                           exception.PlanError(source='cm', reason='bad'),
                           ledger_of(gpu0=Role.K8S_SHARED))
        store = _Store()
        node_agent = agent.NodeAgent(
            store, devices.units_from_inventory(INVENTORY), 10,
            roles=noderoles.NodeRoles(source, 'n1'))
        self.assertTrue(node_agent.sync_once())
        self.assertEqual([str(GPU0), str(GPU1)], self.registered(store))
        self.assertTrue(node_agent.sync_once())
        self.assertEqual([str(GPU0)], self.registered(store))
        self.assertFalse(node_agent.sync_once())  # bad: kept, no write
        self.assertFalse(node_agent.sync_once())  # gpu1 absent: withdrawn
        self.assertEqual(4, source.reads)

    def test_no_ledger_yet_registers_nothing(self) -> None:
        store = _Store()
        node_agent = agent.NodeAgent(
            store, devices.units_from_inventory(INVENTORY), 10,
            roles=noderoles.NodeRoles(_Scripted(None), 'n1'))
        node_agent.sync_once()
        self.assertEqual([], self.registered(store))

    def test_without_roles_every_gpu(self) -> None:
        store = _Store()
        agent.NodeAgent(store, devices.units_from_inventory(INVENTORY),
                        10).sync_once()
        self.assertEqual([str(GPU0), str(GPU1)], self.registered(store))


class DevicePluginWithLedgerTest(testtools.TestCase):

    def plugin(self, source: noderoles.LedgerSource,
               clock: _Clock) -> deviceplugin.DevicePlugin:
        roles = noderoles.NodeRoles(source, 'n1', max_age=30, clock=clock)
        return deviceplugin.DevicePlugin(INVENTORY, share_count=1,
                                         roles=roles)

    def health_by_gpu(self, plugin: deviceplugin.DevicePlugin
                      ) -> dict[str, bool]:
        return {u.gpu_address: plugin.healthy[u.uuid] for u in plugin.units}

    def test_withdrawn_gpu_is_unhealthy_and_refused(self) -> None:
        clock = _Clock()
        source = _Scripted(ledger_of(gpu0=Role.K8S_SHARED,
                                     gpu1=Role.K8S_DEDICATED),
                           ledger_of(gpu0=Role.K8S_SHARED,
                                     gpu1=Role.NOVA_VF),
                           RuntimeError('API server unreachable'))
        plugin = self.plugin(source, clock)
        plugin.pod_source = None
        self.assertTrue(plugin.check_health())
        self.assertEqual({str(GPU0): True, str(GPU1): True},
                         self.health_by_gpu(plugin))
        clock.now = 30
        self.assertTrue(plugin.check_health())
        self.assertEqual({str(GPU0): True, str(GPU1): False},
                         self.health_by_gpu(plugin))
        gpu1 = next(u for u in plugin.units if u.gpu_address == str(GPU1))
        err = self.assertRaises(exception.DevicePluginError, plugin.allocate,
                                [gpu1.uuid + '-0'], 'container_requests[0]')
        self.assertIn('device %s-0 is on GPU %s' % (gpu1.uuid, GPU1),
                      str(err))
        self.assertIn('configmap kube-system/test-ledger', str(err))
        gpu0 = next(u for u in plugin.units if u.gpu_address == str(GPU0))
        allocation = plugin.allocate([gpu0.uuid + '-0'], 'req')
        self.assertIn('ROCR_VISIBLE_DEVICES', dict(allocation.envs))
        # a failing read changes nothing and does not raise
        clock.now = 60
        self.assertFalse(plugin.check_health())

    def test_fail_closed(self) -> None:
        plugin = self.plugin(_Scripted(None), _Clock())
        plugin.check_health()
        self.assertEqual({str(GPU0): False, str(GPU1): False},
                         self.health_by_gpu(plugin))

    def test_from_conf_with_a_ledger_file(self) -> None:
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'ledger.yaml')
        av_ledger.save(ledger_of(gpu1=Role.K8S_SHARED), path)
        conf = conf_pkg.new_conf()
        conf.set_override('allocation_mode', 'whole', 'kubernetes')
        conf.set_override('ledger_source', 'file', 'kubernetes')
        conf.set_override('ledger_file', path, 'kubernetes')
        conf.set_override('node_name', 'n1', 'kubernetes')
        conf.set_override('device_root', tmp, 'kubernetes')
        plugin = deviceplugin.from_conf(conf, INVENTORY)
        plugin.health_check = lambda unit: True
        plugin.check_health()
        self.assertEqual({str(GPU0): False, str(GPU1): True},
                         self.health_by_gpu(plugin))
