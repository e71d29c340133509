"""Telemetry and RAS files of a simulated running node: parsers, the
sysfs and cgroup readers, hostile files, and RAS counts in snapshots."""

from __future__ import annotations

import dataclasses
import os
import threading

import hypothesis
import testtools
from hypothesis import strategies as hyp_st

from amdgpu_virt import exception
from amdgpu_virt.inventory import podcgroups
from amdgpu_virt.inventory import readings
from amdgpu_virt.inventory import simnode
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.inventory.sysfs import cgroup
from amdgpu_virt.inventory.sysfs import telemetry
from amdgpu_virt.model import GpuHealth
from amdgpu_virt.model import RasCount
from tests.unit.inventory import fixtures as inv_fixtures

UID = '0b6f0c55-6a1e-4b2c-9d7a-1f2e3d4c5b6a'


def _read_into(root: str, address: str, result: list,
               done: threading.Event) -> None:
    result.append(telemetry.read_gpu(root, address))
    done.set()


class ParserTest(testtools.TestCase):

    def test_ras_counts_as_the_kernel_prints_them(self) -> None:
        self.assertEqual(RasCount('umc', 1, 20, 0), readings.parse_ras_count(
            b'ue: 1\nce: 20\n', 'p', 'umc'))
        self.assertEqual(RasCount('umc', 0, 2, 5), readings.parse_ras_count(
            'ue: 0\nce: 2\nde: 5\n', 'p', 'umc'))
        for bad in (b'Query currently inaccessible\n', b'ue: 1\n',
                    b'ue: 1\nue: 2\nce: 0', b'ue: -1\nce: 0',
                    b'ue: 1\nce: 99999999999999999999', b'\xff\xfe',
                    b'ue: 1\nce: 0\n' * 10, b'x' * 1000):
            err = self.assertRaises(exception.SysfsValueError,
                                    readings.parse_ras_count, bad, 'the/path',
                                    'umc')
            self.assertIn('the/path', str(err))

    def test_dmem_lines(self) -> None:
        self.assertEqual(
            {'drm/0000:05:00.0/vram': 1024, 'drm/0000:25:00.0/vram': None},
            readings.parse_dmem('drm/0000:05:00.0/vram 1024\n'
                                'drm/0000:25:00.0/vram max\n', 'p'))
        for bad in ('drm/x 1 2', 'drm/x -1', 'drm/x 1\ndrm/x 2', 'a b' * 0 +
                    'drm/x lots', 'drm/x 1\n' * 300):
            self.assertRaises(exception.SysfsValueError, readings.parse_dmem,
                              bad, 'p')
        self.assertEqual('0000:05:00.0', readings.region_address(
            readings.vram_region('0000:05:00.0')))
        self.assertIsNone(readings.region_address('drm/0000:05:00.0/stolen'))

    def test_cgroup_names_of_both_drivers(self) -> None:
        for driver in podcgroups.Driver:
            for qos in podcgroups.QosClass:
                for root in ((), ('kubelet',), ('a', 'b')):
                    name = podcgroups.pod_cgroup(driver, qos, UID, root)[-1]
                    self.assertEqual(UID, podcgroups.pod_uid_in(
                        name, driver, qos, root))
        systemd = podcgroups.Driver.SYSTEMD
        # kubelet --cgroup-root=/kubelet (kind): every name has the prefix
        self.assertEqual(
            ('kubelet.slice', 'kubelet-kubepods.slice',
             'kubelet-kubepods-burstable.slice',
             'kubelet-kubepods-burstable-pod%s.slice'
             % UID.replace('-', '_')),
            podcgroups.pod_cgroup(systemd, podcgroups.QosClass.BURSTABLE,
                                  UID, ('kubelet',)))
        burstable = podcgroups.QosClass.BURSTABLE
        guaranteed = podcgroups.QosClass.GUARANTEED
        # a QoS cgroup below kubepods is no Guaranteed pod
        self.assertIsNone(podcgroups.pod_uid_in(
            'kubepods-burstable.slice', systemd, guaranteed))
        self.assertIsNone(podcgroups.pod_uid_in(
            'burstable', podcgroups.Driver.CGROUPFS, guaranteed))
        # a pod of the default root is not one of kubelet's other root
        self.assertIsNone(podcgroups.pod_uid_in(
            podcgroups.pod_cgroup(systemd, burstable, UID)[-1], systemd,
            burstable, ('kubelet',)))
        self.assertIsNone(podcgroups.pod_uid_in(
            'pod../../etc', podcgroups.Driver.CGROUPFS, burstable))
        cid = 'ab' * 32
        for name in ('cri-containerd-%s.scope' % cid, 'crio-%s.scope' % cid,
                     'docker-%s.scope' % cid, cid):
            self.assertEqual(cid, podcgroups.container_id_of(name))
        self.assertIsNone(podcgroups.container_id_of('crio-conmon-%s.scope'
                                                     % cid))

    @hypothesis.given(
        driver=hyp_st.sampled_from(list(podcgroups.Driver)),
        qos=hyp_st.sampled_from(list(podcgroups.QosClass)),
        uid=hyp_st.from_regex(r'[A-Za-z0-9-]{1,64}', fullmatch=True),
        root=hyp_st.lists(hyp_st.from_regex(r'[a-z][a-z0-9_-]{0,8}',
                                            fullmatch=True), max_size=2))
    def test_telemetry_reads_back_the_names_the_caps_use(
            self, driver: podcgroups.Driver, qos: podcgroups.QosClass,
            uid: str, root: list[str]) -> None:
        # the device plugin caps pod_cgroup(...); the telemetry walk must
        # find the same pod there, whatever the driver, class and root
        parts = podcgroups.pod_cgroup(driver, qos, uid, root)
        self.assertEqual(parts[:-1], podcgroups.qos_cgroup(driver, qos,
                                                           root))
        self.assertEqual(uid, podcgroups.pod_uid_in(parts[-1], driver, qos,
                                                    root))


class SysfsTelemetryTest(testtools.TestCase):

    def host(self, kind: str) -> tuple[str, str]:
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS[kind]))
        return host.root, str(host.expected.gpus[0].address)

    def test_mi300x_sensors_by_label_and_instantaneous_power(self) -> None:
        root, address = self.host('mi300x-spx')
        simnode.set_gpu(root, address, vram_used=5 << 30, busy=40,
                        temperatures={'junction': 80.25, 'mem': 70},
                        power_watts=700)
        read = telemetry.read_gpu(root, address)
        self.assertEqual((), read.problems)
        self.assertEqual((5 << 30, 40), (read.vram_used_bytes,
                                         read.busy_percent))
        # MI300 hides temp1 (edge): sensors come by label, not index
        self.assertEqual((('junction', 80.25), ('mem', 70.0)),
                         read.temperatures)
        self.assertEqual(700.0, read.power_watts)
        self.assertEqual(simulate.RAS_BLOCKS,
                         tuple(c.block for c in read.ras or ()))
        self.assertRaises(exception.SimulationError, simnode.set_gpu, root,
                          address, temperatures={'edge': 50})

    def test_mi210_has_edge_and_average_power(self) -> None:
        root, address = self.host('mi210-spx')
        simnode.set_gpu(root, address, temperatures={'edge': 41},
                        power_watts=90)
        read = telemetry.read_gpu(root, address)
        self.assertEqual(['edge', 'junction', 'mem'],
                         [t[0] for t in read.temperatures])
        self.assertEqual(90.0, read.power_watts)

    def test_hostile_files_drop_their_value_and_name_the_file(self) -> None:
        root, address = self.host('mi300x-spx')
        monitor = simnode.hwmon_dir(root, address)
        targets = {
            'busy': os.path.join(simnode.device_dir(root, address),
                                 'gpu_busy_percent'),
            'hwmon': os.path.join(monitor, 'temp2_input'),
            'ras': simnode.ras_path(root, address, 'gfx'),
        }
        for variant in simnode.HOSTILE:
            for source, path in targets.items():
                simnode.plant(path, variant)
                done = threading.Event()
                result: list[readings.GpuReadings] = []
                threading.Thread(target=_read_into, daemon=True, args=(
                    root, address, result, done)).start()
                # a FIFO or an endless file never blocks the reader
                self.assertTrue(done.wait(10), (variant, source))
                (read_once,) = result
                self.assertIn(source, [s for s, _m in read_once.problems],
                              (variant, source))
                if source == 'busy':
                    self.assertIsNone(read_once.busy_percent)
                elif source == 'hwmon':
                    self.assertNotIn('junction',
                                     [t[0] for t in read_once.temperatures])
                else:
                    self.assertNotIn('gfx', [c.block for c in
                                             read_once.ras or ()])
                    # the other blocks are still read
                    self.assertIn('umc', [c.block for c in
                                          read_once.ras or ()])
            # back to a healthy tree (the writer replaces a FIFO, never
            # blocks on it)
            for path in targets.values():
                if os.path.isdir(path) and not os.path.islink(path):
                    simnode.plant(path, 'empty')
            simulate.write_tree(simulate.design_host(
                simulate.KINDS['mi300x-spx']), root)

    def test_scan_carries_ras_counts_into_snapshots(self) -> None:
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi300x-mixed']))
        amdgpu = [g for g in host.expected.gpus if g.health is not None]
        address = str(amdgpu[0].address)
        simnode.set_ras(host.root, address, 'umc', 2, 7, 1)
        scanned = host.scan(host.expected.hostname)
        gpu = scanned.gpu(address)
        assert gpu.health is not None
        self.assertEqual((2, 7), (gpu.health.uncorrectable,
                                  gpu.health.correctable))
        self.assertIn('umc 2', gpu.health.problem(0) or '')
        self.assertIsNone(gpu.health.problem(2))
        self.assertIsNone(gpu.health.problem(None))
        # GPUs bound to gim or vfio-pci show no RAS files
        self.assertEqual(
            {None}, {g.health for g in scanned.gpus
                     if g.driver.value != 'amdgpu'})
        text = snapshot.dumps(scanned)
        self.assertEqual(scanned, snapshot.loads(text, 'snap'))

    def test_snapshots_without_health_still_load(self) -> None:
        inventory = simulate.design_host(simulate.KINDS['mi300x-spx'])
        document = snapshot.to_document(inventory)
        for gpu in document['gpus']:
            del gpu['health']
        loaded = snapshot.from_document(document, 'old')
        self.assertEqual({None}, {g.health for g in loaded.gpus})
        self.assertEqual(
            dataclasses.replace(inventory, gpus=tuple(
                dataclasses.replace(g, health=None) for g in inventory.gpus)),
            loaded)

    def test_a_node_verdict_comes_first(self) -> None:
        health = GpuHealth(ras=(RasCount('umc', 0, 1),),
                           unhealthy='exporter: gpu_health 0')
        self.assertEqual('exporter: gpu_health 0', health.problem(0))


class CgroupTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.root = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi300x-spx'])).root
        self.cgroups = os.path.join(self.root, 'fs', 'cgroup')

    def test_containers_of_both_drivers_and_every_qos(self) -> None:
        self.assertFalse(cgroup.has_dmem(self.cgroups))
        simnode.enable_dmem(self.root, {'0000:05:00.0': 1 << 30})
        self.assertTrue(cgroup.has_dmem(self.cgroups))
        made = []
        for n, (driver, qos) in enumerate(
                (d, q) for d in podcgroups.Driver
                for q in podcgroups.QosClass):
            uid = UID[:-1] + str(n)
            simnode.add_container(self.root, uid, '%x' % n * 64,
                                  qos=qos, driver=driver,
                                  current={'0000:05:00.0': n})
            made.append((uid, qos.value))
        found, problems = cgroup.containers(self.cgroups)
        self.assertEqual([], problems)
        self.assertEqual(sorted(made), sorted((c.pod_uid, c.qos)
                                              for c in found))
        for item in found:
            current, problem = cgroup.read_dmem(self.cgroups, item.path,
                                                'dmem.current')
            self.assertIsNone(problem)
            self.assertEqual(int(item.pod_uid[-1]),
                             (current or {})['drm/0000:05:00.0/vram'])

    def test_containers_below_kubelets_own_cgroup_root(self) -> None:
        # kubelet --cgroup-root=/kubelet (kind nodes): the walk finds the
        # containers there, and only with that root and driver
        simnode.enable_dmem(self.root, {'0000:05:00.0': 1 << 30})
        made = []
        for n, driver in enumerate(podcgroups.Driver):
            uid = UID[:-1] + str(n)
            simnode.add_container(self.root, uid, '%x' % n * 64,
                                  driver=driver, kubelet_root=('kubelet',))
            made.append(uid)
        self.assertEqual([], cgroup.containers(self.cgroups)[0])
        found, problems = cgroup.containers(self.cgroups,
                                            kubelet_root=('kubelet',))
        self.assertEqual([], problems)
        self.assertEqual(made, [c.pod_uid for c in sorted(
            found, key=lambda c: c.pod_uid)])
        only = cgroup.containers(self.cgroups, kubelet_root=('kubelet',),
                                 drivers=(podcgroups.Driver.CGROUPFS,))[0]
        self.assertEqual([made[1]], [c.pod_uid for c in only])
        # kubelet's root replaced by a link (anything below the cgroup
        # root may be written by a delegated container): nothing is
        # followed there
        real = os.path.join(self.cgroups, 'kubelet.slice')
        os.rename(real, real + '.moved')
        os.symlink(real + '.moved', real)
        found = cgroup.containers(self.cgroups, kubelet_root=('kubelet',),
                                  drivers=(podcgroups.Driver.SYSTEMD,))[0]
        self.assertEqual([], found)
        # so is a QoS cgroup replaced by a link
        os.unlink(real)
        os.rename(real + '.moved', real)
        qos = os.path.join(real, 'kubelet-kubepods.slice',
                           'kubelet-kubepods-burstable.slice')
        os.rename(qos, qos + '.moved')
        os.symlink(qos + '.moved', qos)
        found = cgroup.containers(self.cgroups, kubelet_root=('kubelet',),
                                  drivers=(podcgroups.Driver.SYSTEMD,))[0]
        self.assertEqual([], found)

    def test_the_walk_is_bounded_and_follows_no_link(self) -> None:
        simnode.enable_dmem(self.root, {})
        for n in range(5):
            simnode.add_container(self.root, UID[:-1] + str(n), '%x' % n * 64)
        outside = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi210-spx'])).root
        os.symlink(outside, os.path.join(
            self.cgroups, 'kubepods.slice', 'kubepods-burstable.slice',
            'kubepods-burstable-pod%s.slice' % UID[:-1].replace('-', '_')
            + '9'))
        found, problems = cgroup.containers(self.cgroups, max_containers=3)
        self.assertEqual(3, len(found))
        self.assertIn('more than 3 containers', problems[-1][1])

    def test_hostile_dmem_files(self) -> None:
        simnode.enable_dmem(self.root, {})
        path = simnode.add_container(self.root, UID, 'e' * 64,
                                     current={'0000:05:00.0': 1})
        rel = os.path.relpath(path, self.cgroups)
        for variant in simnode.HOSTILE:
            simnode.plant(os.path.join(path, 'dmem.current'), variant)
            current, problem = cgroup.read_dmem(self.cgroups, rel,
                                                'dmem.current')
            if variant == 'empty':
                self.assertEqual({}, current)
            elif variant in ('dangling',):
                self.assertEqual((None, None), (current, problem))
            else:
                self.assertIsNone(current, variant)
                self.assertIn('dmem.current', problem or '', variant)
