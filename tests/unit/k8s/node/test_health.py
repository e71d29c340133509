"""GPU health on a simulated node: RAS thresholds, the correctable rate,
device nodes, AMD's exporter, and what the node publishes."""

from __future__ import annotations

import os
import socket

import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import simnode
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import dme
from amdgpu_virt.k8s.node import health
from amdgpu_virt.k8s.node import healthpublish
from tests.unit.inventory import fixtures as inv_fixtures

EXPORTER = '''# HELP gpu_health Health of the GPU (0 = Unhealthy | 1 = Healthy)
# TYPE gpu_health gauge
gpu_health{gpu_id="0",serial_number="x",hostname="n1"} 1
gpu_health{gpu_id="1",serial_number="y",hostname="n1"} 0
gpu_health{gpu_id="1",gpu_partition_id="3",hostname="n1"} 1
gpu_health{gpu_id="99999",hostname="n1"} 0
gpu_edge_temperature{gpu_id="0"} 40
'''


class Clock:

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NodeFixture(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec(hostname='n1', gpus=2)))
        self.sysfs = host.root
        self.units = devices.units_from_inventory(host.expected)
        self.gpu0 = self.units[0].gpu_address
        self.dev = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec(hostname='d', gpus=1))).root
        os.makedirs(os.path.join(self.dev, 'dev', 'dri'))
        open(os.path.join(self.dev, 'dev', 'kfd'), 'w').close()
        for unit in self.units:
            for path in (unit.card_path, unit.render_path):
                open(os.path.join(self.dev, path.lstrip('/')), 'w').close()
        self.clock = Clock()

    def monitor(self, **policy: object) -> health.HealthMonitor:
        return health.HealthMonitor(
            self.units, self.sysfs, self.dev,
            health.HealthPolicy(**policy),  # type: ignore[arg-type]
            clock=self.clock)


class MonitorTest(NodeFixture):

    def test_uncorrectable_errors_over_the_threshold(self) -> None:
        monitor = self.monitor(max_uncorrectable=1, interval=10)
        self.assertTrue(monitor(self.units[0]))
        simnode.set_ras(self.sysfs, self.gpu0, 'umc', uncorrectable=2)
        # the verdict is kept for the interval
        self.assertTrue(monitor(self.units[0]))
        self.clock.now += 10
        self.assertFalse(monitor(self.units[0]))
        self.assertIn('2 uncorrectable RAS errors (umc 2), more than 1',
                      monitor.reason(self.units[0]))
        self.assertTrue(monitor(self.units[1]))
        ras = monitor.ras(self.gpu0)
        assert ras is not None
        self.assertEqual(2, ras.uncorrectable)
        self.assertTrue(ras.unhealthy.startswith('ras: '))

    def test_correctable_rate_over_the_window(self) -> None:
        monitor = self.monitor(max_correctable_per_hour=100,
                               correctable_window=3600.0, interval=0.0)
        self.assertTrue(monitor(self.units[0]))
        # 90 in ten minutes: 90 per hour over the window, not 540
        self.clock.now += 600
        simnode.set_ras(self.sysfs, self.gpu0, 'umc', correctable=90)
        self.assertTrue(monitor(self.units[0]))
        self.clock.now += 600
        simnode.set_ras(self.sysfs, self.gpu0, 'umc', correctable=150)
        self.assertFalse(monitor(self.units[0]))
        self.assertIn('150 correctable errors per hour, more than 100',
                      monitor.reason(self.units[0]))
        # the driver reloaded: counts start again, and so does the window
        self.clock.now += 60
        simnode.set_ras(self.sysfs, self.gpu0, 'umc', correctable=3)
        self.assertTrue(monitor(self.units[0]))

    def test_unreadable_ras_files_judge_nothing_and_are_counted(self) -> None:
        monitor = self.monitor(interval=0.0)
        simnode.set_ras(self.sysfs, self.gpu0, 'umc', uncorrectable=1)
        simnode.plant(simnode.ras_path(self.sysfs, self.gpu0, 'gfx'),
                      'inaccessible')
        self.assertFalse(monitor(self.units[0]))
        self.assertEqual({'ras': 1}, monitor.errors.snapshot())
        simnode.plant(simnode.ras_path(self.sysfs, self.gpu0, 'umc'), 'fifo')
        self.assertTrue(monitor(self.units[0]))

    def test_device_nodes(self) -> None:
        monitor = self.monitor()
        unit = self.units[1]
        render = os.path.join(self.dev, unit.render_path.lstrip('/'))
        os.unlink(render)
        self.assertFalse(monitor(unit))
        self.assertEqual('device: %s is missing' % unit.render_path,
                         monitor.reason(unit))
        # a node whose driver is gone answers ENXIO when opened (a unix
        # socket in its place does the same)
        listener = socket.socket(socket.AF_UNIX)
        self.addCleanup(listener.close)
        listener.bind(render)
        self.assertFalse(monitor(unit))
        self.assertIn('does not answer (ENXIO)', monitor.reason(unit))
        self.assertTrue(health.HealthMonitor(
            self.units, self.sysfs, self.dev, health.HealthPolicy(
                open_render_nodes=False))(unit))
        self.assertTrue(health.device_node_health(self.dev)(unit))

    def test_exporter_gpu_health(self) -> None:
        answers = [EXPORTER.encode()]

        def fetch(url: str, timeout: float) -> bytes:
            if not answers:
                raise OSError('connection refused')
            return answers.pop()

        monitor = health.HealthMonitor(
            self.units, self.sysfs, self.dev, health.HealthPolicy(
                interval=10.0), dme.ExporterHealth('http://x:5000/metrics',
                                                   fetch=fetch),
            clock=self.clock)
        # gpu_id 1 is the second GPU in PCI order; one read serves both
        self.assertTrue(monitor(self.units[0]))
        self.assertFalse(monitor(self.units[1]))
        self.assertEqual('exporter: gpu_health 0',
                         monitor.reason(self.units[1]))
        # an exporter that does not answer makes no GPU unhealthy
        self.clock.now += 10
        self.assertTrue(monitor(self.units[1]))
        self.assertEqual(1, monitor.errors.snapshot()['exporter'])

    def test_exporter_answers_are_input(self) -> None:
        self.assertEqual({0: True, 1: False}, dme.parse_health(EXPORTER))
        self.assertEqual({}, dme.parse_health('up 1\n' * 1000))
        self.assertRaises(exception.TelemetryError, dme.parse_health,
                          'gpu_health{gpu_id="0" 1\n')
        body = b'gpu_health{gpu_id="0"} 1\n' + b'#' * (dme.MAX_BYTES + 10)
        err = self.assertRaises(
            exception.TelemetryError, dme.ExporterHealth(
                'file:///etc/passwd').read)
        self.assertIn('only http', str(err))
        self.assertRaises(exception.TelemetryError, dme.ExporterHealth(
            'http://x', fetch=lambda u, t: b'\xff\xfe').read)
        self.assertEqual({0: True}, dme.ExporterHealth(
            'http://x', fetch=lambda u, t: body[:30]).read())


class PublishTest(testtools.TestCase):

    def test_condition_moves_only_on_a_flip(self) -> None:
        sick = healthpublish.NodeHealth(('a', 'b'), (('a', 'ras: x'),))
        well = healthpublish.NodeHealth(('a', 'b'))
        first = healthpublish.condition(sick, None, 't1')
        assert first is not None
        self.assertEqual(('True', 't1'), (first['status'],
                                          first['lastTransitionTime']))
        self.assertIsNone(healthpublish.condition(sick, first, 't2'))
        other = healthpublish.NodeHealth(('a', 'b'), (('a', 'ras: y'),))
        moved = healthpublish.condition(other, first, 't3')
        assert moved is not None
        self.assertEqual('t1', moved['lastTransitionTime'])
        back = healthpublish.condition(well, moved, 't4')
        assert back is not None
        self.assertEqual(('False', 't4'), (back['status'],
                                           back['lastTransitionTime']))

    def test_event_names_are_deterministic(self) -> None:
        node = {'metadata': {'name': 'n1', 'uid': 'u'}}
        one = healthpublish.event_body(node, 'a', 'ras: x', True, 't')
        self.assertEqual(one, healthpublish.event_body(node, 'a', 'ras: x',
                                                       True, 't'))
        self.assertNotEqual(one['metadata']['name'], healthpublish.event_body(
            node, 'a', 'ras: y', True, 't')['metadata']['name'])
        self.assertEqual(('Warning', 'GpuUnhealthy'), (one['type'],
                                                       one['reason']))
