"""Node telemetry and GPU health on a simulated node, end to end.

A simulated MI300X node (its sysfs tree with telemetry, RAS counters and
hwmon sensors, a cgroup v2 tree with the dmem controller and kubelet's
container cgroups, device nodes under a device root) runs the real node
agent (``agent.from_conf``, metrics on a free port) and the real device
plugin (``deviceplugin.from_conf``) against the API server stand-in and
the kubelet stand-in. Prometheus is played by an HTTP GET of the agent's
``/metrics``. Then a GPU gets an uncorrectable RAS error: kubelet hears
its units Unhealthy, the registration marks it ``health: false`` with a
``healthReason``, the node gets the label, the condition and an Event,
the Kubernetes side of ``audit`` reports it, and ``plan`` with live state
keeps new work off it. The DRA plugin's side is
:class:`DraHealthTest`. Only the GPUs themselves are simulated.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
import time
import urllib.request

import testtools
from kubernetes import client
from prometheus_client import parser as prom_parser

from amdgpu_virt import conf as av_conf
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import podcgroups
from amdgpu_virt.inventory import simnode
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import healthpublish
from amdgpu_virt.k8s.pool import running as k8s_running
from amdgpu_virt.k8s.pool import side as k8s_side
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import Role
from amdgpu_virt.policy import running
from amdgpu_virt.pool import crossaudit
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s.dra import test_dra_plugin as dra_node

NODE = 'n1'
RESOURCE = 'amd.com/gpu'
CID = 'c0ffee' + '0' * 58
STRANGER = '7f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f'


def scrape(address: tuple[str, int]) -> dict[str, list[tuple[dict, float]]]:
    """metric name -> [(labels, value)] of one GET /metrics."""
    url = 'http://127.0.0.1:%d/metrics' % address[1]
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, list[tuple[dict, float]]] = {}
    for family in prom_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(
                (dict(sample.labels), sample.value))
    return found


def value(metrics: dict, name: str, **labels: str) -> float:
    hits = [v for got, v in metrics.get(name, ())
            if all(got.get(k) == x for k, x in labels.items())]
    if len(hits) != 1:
        raise AssertionError('%s%r: %d series' % (name, labels, len(hits)))
    return hits[0]


class NodeTelemetryHealthTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        api = self.api = self.kube.api
        api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name=NODE)))
        api.create_namespace({'metadata': {'name': 'team'}})
        api.create_namespace({'metadata': {'name': 'default'}})
        self.root = tempfile.mkdtemp(prefix='tel')
        self.addCleanup(shutil.rmtree, self.root, True)
        self.sysfs = os.path.join(self.root, 'sys')
        self.inventory = simulate.simulate_host(simulate.HostSpec(
            hostname=NODE, gpus=2), self.sysfs)
        self.units = devices.units_from_inventory(self.inventory)
        self.gpu0, self.gpu1 = (u.gpu_address for u in self.units)
        self.dev = os.path.join(self.root, 'dev-root')
        os.makedirs(os.path.join(self.dev, 'dev', 'dri'))
        open(os.path.join(self.dev, 'dev', 'kfd'), 'w').close()
        for unit in self.units:
            for path in (unit.card_path, unit.render_path):
                open(os.path.join(self.dev, path.lstrip('/')), 'w').close()
        conf = self.conf = av_conf.new_conf()
        for group, values in {
                # kubelet with --cgroup-root=/kubelet (kind nodes): the
                # container cgroups are below kubelet.slice
                'kubernetes': {'node_name': NODE, 'device_root': self.dev,
                               'allocation_mode': 'whole',
                               'share_count': 1,
                               'cgroup_root': os.path.join(
                                   self.sysfs, 'fs', 'cgroup'),
                               'kubelet_cgroup_root': '/kubelet'},
                'inventory': {'sysfs_root': self.sysfs},
                'health': {'interval': 1},
                'telemetry': {'metrics_host': '127.0.0.1',
                              'metrics_port': 0, 'min_read_interval': 0,
                              'max_containers': 8}}.items():
            for name, setting in values.items():
                conf.set_override(name, setting, group)
        # a pod on GPU 1 with 5 GiB in use under an 8 GiB dmem cap
        simnode.enable_dmem(self.sysfs, {self.gpu0: 192 << 30,
                                         self.gpu1: 192 << 30})
        pod = api.create_namespaced_pod('team', client.V1Pod(
            metadata=client.V1ObjectMeta(name='job', namespace='team'),
            spec=client.V1PodSpec(node_name=NODE, containers=[
                client.V1Container(name='main', image='rocm')])))
        add = functools.partial(simnode.add_container, self.sysfs,
                                kubelet_root=('kubelet',))
        add(pod.metadata.uid, CID, current={self.gpu1: 5 << 30},
            limit={self.gpu1: 8 << 30})
        # the pod sandbox's cgroup: not a container the status lists
        add(pod.metadata.uid, 'a' * 64, current={})
        # a container cgroup of a pod this node does not run (any cgroup
        # writer could name any UID)
        add(STRANGER, 'b' * 64, qos=podcgroups.QosClass.BEST_EFFORT,
            current={self.gpu1: 1 << 30})
        api.patch_namespaced_pod_status('job', 'team', {'status': {
            'phase': 'Running', 'containerStatuses': [{
                'name': 'main', 'containerID': 'containerd://' + CID,
                'image': 'rocm', 'imageID': '', 'ready': True,
                'restartCount': 0}]}})
        self.node_agent = agent.from_conf(
            conf, self.inventory,
            store=agent.KubernetesNodeStore(NODE, api),
            levels=lambda address: 'kernel' if address == self.gpu1
            else 'none')
        self.node_agent.start()
        self.addCleanup(self.node_agent.stop)
        self.plugin_dir = os.path.join(self.root, 'plugins')
        os.makedirs(self.plugin_dir)
        self.kubelet = kubelet_fixture.KubeletStandIn(self.plugin_dir).start()
        self.addCleanup(self.kubelet.stop)
        conf.set_override('device_plugin_dir', self.plugin_dir, 'kubernetes')
        conf.set_override('kubelet_poll_interval', 0.05, 'kubernetes')
        self.plugin = deviceplugin.from_conf(conf, self.inventory).start()
        self.addCleanup(self.plugin.stop)

    def test_metrics_of_gpus_and_containers(self) -> None:
        simnode.set_gpu(self.sysfs, self.gpu1, vram_used=7 << 30, busy=63,
                        memory_busy=21, temperatures={'junction': 71.5,
                                                      'mem': 64.0},
                        power_watts=612.5)
        metrics = scrape(self.node_agent.metrics_address)
        uuid1 = self.units[1].uuid
        host = {'node': NODE, 'device_uuid': uuid1}
        self.assertEqual(7 << 30, value(
            metrics, 'hami_host_gpu_memory_used_bytes', **host))
        self.assertEqual(63, value(
            metrics, 'hami_host_gpu_utilization_ratio', **host))
        self.assertEqual(21, value(
            metrics, 'hami_host_gpu_memory_controller_utilization_ratio',
            device_uuid=uuid1))
        self.assertEqual(71.5, value(
            metrics, 'amdgpu_virt_gpu_temperature_celsius', gpu=self.gpu1,
            sensor='junction'))
        self.assertEqual(612.5, value(metrics, 'amdgpu_virt_gpu_power_watts',
                                      gpu=self.gpu1))
        self.assertEqual('kernel', [
            labels['level'] for labels, _v in metrics[
                'amdgpu_virt_gpu_memory_enforcement']
            if labels['gpu'] == self.gpu1][0])
        container = {'namespace': 'team', 'pod': 'job', 'container': 'main',
                     'vdevice_index': '0', 'device_uuid': uuid1}
        self.assertEqual(5 << 30, value(
            metrics, 'hami_vgpu_memory_used_bytes', **container))
        self.assertEqual(8 << 30, value(
            metrics, 'hami_vgpu_memory_limit_bytes', **container))
        # neither the stranger's cgroup nor the sandbox's is exported
        self.assertEqual(1, len(metrics['hami_vgpu_memory_used_bytes']))
        self.assertEqual(1, value(
            metrics, 'amdgpu_virt_node_telemetry_dropped_series_total',
            reason='unattributed'))
        self.assertEqual(1, value(metrics, 'amdgpu_virt_gpu_healthy',
                                  gpu=self.gpu0))

    def test_a_broken_file_drops_its_series_only(self) -> None:
        simnode.plant(os.path.join(simnode.device_dir(
            self.sysfs, self.gpu0), 'gpu_busy_percent'), 'fifo')
        simnode.plant(simnode.ras_path(self.sysfs, self.gpu0, 'gfx'),
                      'garbage')
        metrics = scrape(self.node_agent.metrics_address)
        self.assertEqual([self.units[1].uuid], [
            labels['device_uuid'] for labels, _v in metrics[
                'hami_host_gpu_utilization_ratio']])
        self.assertGreaterEqual(value(
            metrics, 'amdgpu_virt_node_telemetry_errors_total',
            source='busy'), 1)
        self.assertGreaterEqual(value(
            metrics, 'amdgpu_virt_node_telemetry_errors_total',
            source='ras'), 1)
        # the other blocks of the GPU are still there
        self.assertEqual(0, value(
            metrics, 'amdgpu_virt_gpu_ras_errors_total', gpu=self.gpu0,
            block='umc', type='uncorrectable'))

    def _registration(self) -> list[hami.DeviceInfo]:
        node = self.api.read_node(NODE)
        return list(hami.decode_node_register(
            node.metadata.annotations[hami.NODE_REGISTER]))

    def test_an_uncorrectable_error_makes_the_gpu_unhealthy(self) -> None:
        # the agent's own verdicts are not kept between its syncs
        monitor = self.node_agent.health
        monitor.policy = dataclasses.replace(monitor.policy, interval=0.0)
        self.node_agent.sync_once()
        endpoint = self.kubelet.wait_for_devices(RESOURCE, count=2)
        self.assertEqual({'Healthy'}, {d.health for d in endpoint.devices})
        node = self.api.read_node(NODE)
        self.assertEqual(healthpublish.HEALTHY,
                         node.metadata.labels[healthpublish.LABEL])

        simnode.set_ras(self.sysfs, self.gpu0, 'umc', uncorrectable=1,
                        correctable=4)
        sick = self.units[0].device_id(0)
        self.assertTrue(self.kubelet.wait_for(lambda: {
            d.ID: d.health for d in self.kubelet.plugins[
                RESOURCE].devices}.get(sick) == 'Unhealthy', timeout=10))
        self.assertEqual(1, self.kubelet.plugins[RESOURCE].capacity)

        self.assertTrue(self.node_agent.sync_once())
        entries = {i.custominfo[hami.CUSTOMINFO_PCI_BDF]: i
                   for i in self._registration()}
        self.assertFalse(entries[self.gpu0].health)
        self.assertIn('umc 1', entries[self.gpu0].custominfo[
            hami.CUSTOMINFO_HEALTH_REASON])
        self.assertTrue(entries[self.gpu1].health)
        self.assertNotIn(hami.CUSTOMINFO_HEALTH_REASON,
                         entries[self.gpu1].custominfo)
        node = self.api.read_node(NODE)
        self.assertEqual(healthpublish.UNHEALTHY,
                         node.metadata.labels[healthpublish.LABEL])
        (condition,) = [c for c in node.status.conditions
                        if c.type == healthpublish.CONDITION]
        self.assertEqual(('True', healthpublish.REASON_SICK),
                         (condition.status, condition.reason))
        self.assertIn(self.gpu0, condition.message)
        events = [e for e in self.api.list_namespaced_event(
            'default').items if e.reason == healthpublish.EVENT_SICK]
        self.assertEqual(1, len(events))
        self.assertEqual(NODE, events[0].involved_object.name)
        # nothing new: no second Event, no condition write
        version = node.metadata.resource_version
        self.assertFalse(self.node_agent.sync_once())
        self.assertEqual(version, self.api.read_node(
            NODE).metadata.resource_version)
        self.assertEqual(1, len([e for e in self.api.list_namespaced_event(
            'default').items if e.reason == healthpublish.EVENT_SICK]))
        metrics = scrape(self.node_agent.metrics_address)
        self.assertEqual(0, value(metrics, 'amdgpu_virt_gpu_healthy',
                                  gpu=self.gpu0))

        # audit: the Kubernetes side reports it, a pod on it is a conflict
        observations, _warnings = k8s_side.KubernetesPool(
            self.api, ledgermap.Location('kube-system', 'ledger')
        ).observations([NODE])
        ledger = av_ledger.build([
            av_ledger.GpuAssignment(NODE, g.address, Role.K8S_DEDICATED,
                                    g.model.name)
            for g in self.inventory.gpus])
        report = crossaudit.audit(ledger, [self.inventory], observations,
                                  ('k8s',))
        kinds = {(str(f.address), f.kind) for f in report.findings}
        self.assertIn((self.gpu0, crossaudit.FindingKind.UNHEALTHY), kinds)
        self.assertNotIn((self.gpu0, crossaudit.FindingKind.NOT_OFFERED),
                         kinds)

        # plan with live state: the GPU is held, nothing new goes there
        live = k8s_running.LiveKubernetes(self.api, 'amdgpu-virt',
                                          'gpu.amd.com')
        unhealthy = live.unhealthy()
        self.assertEqual([(NODE, self.gpu0)], list(unhealthy))
        result = running.placements(self.conf, [self.inventory], ledger,
                                    live.holdings([self.inventory]),
                                    unhealthy)
        held = [d.workload for d in result.placements]
        self.assertEqual(['held/%s/%s' % (NODE, self.gpu0)], held)

        # repaired (driver reloaded: counts back to 0): healthy again
        simnode.set_ras(self.sysfs, self.gpu0, 'umc')
        self.assertTrue(self.kubelet.wait_for(lambda: self.kubelet.plugins[
            RESOURCE].capacity == 2, timeout=10))
        self.assertTrue(self.node_agent.sync_once())
        node = self.api.read_node(NODE)
        self.assertEqual(healthpublish.HEALTHY,
                         node.metadata.labels[healthpublish.LABEL])
        self.assertEqual(1, len([e for e in self.api.list_namespaced_event(
            'default').items if e.reason == healthpublish.EVENT_WELL]))


class DraHealthTest(testtools.TestCase):
    """The DRA plugin: an unhealthy GPU leaves the slices and is reported
    on kubelet's health stream with why."""

    def test_unhealthy_gpu_leaves_the_slices(self) -> None:
        node = self.useFixture(dra_node.DraNode())
        plugin = node.kubelet.wait_for(dra_node.DRIVER)
        monitor = node.plugin.health_check
        monitor.policy = dataclasses.replace(monitor.policy, interval=0.0)
        gpu = node.inventory.gpus[0]
        address = str(gpu.address)
        label = dra_devices.gpu_label(gpu.address)

        def published() -> set[str]:
            return {d['name'] for s in node.slices()
                    for d in s['spec'].get('devices', [])}

        self.assertIn(label, published())
        simnode.set_ras(node.sysfs, address, 'gfx', uncorrectable=2)
        node.plugin.refresh()
        self.assertFalse({n for n in published() if n.startswith(label)})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
                n == label and h == 'UNHEALTHY'
                for n, h, _m in plugin.health[-1]):
            time.sleep(0.02)
        (entry,) = [e for e in plugin.health[-1] if e[0] == label]
        self.assertEqual('UNHEALTHY', entry[1])
        self.assertIn('uncorrectable', entry[2])

