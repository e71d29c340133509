"""Kernel VRAM caps in place before kubelet starts a slice's container.

The device plugin, the API server stand-in and the kubelet stand-in run
together on a simulated cgroup v2 node (no kernel with the dmem
controller and no kubelet run here): the test books pods as the extender
does, kubelet admits them (Allocate), creates their pod cgroup (as its
``SyncPod`` does before any container) and starts each container through
``start_pod``, which calls PreStartContainer when the plugin
requires it. The container "starts" only if that call succeeded; at that
moment the test reads the pod cgroup's ``dmem.max``.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from typing import Any

import grpc
import testtools
from kubernetes import client

from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.k8s.node import podcaps
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import cgroupfs
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster

RESOURCE = 'amd.com/gpu'
MIB = 1 << 20


class KernelCapsTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.api = self.kube.api
        self.api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name='n1')))
        self.dir = tempfile.mkdtemp(prefix='kc')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.kubelet = kubelet_fixture.KubeletStandIn(
            os.path.join(self.dir, 'dp'))
        os.mkdir(self.kubelet.plugin_dir)
        self.kubelet.start()
        self.addCleanup(self.kubelet.stop)
        self.inventory = simulate.design_host(simulate.HostSpec(
            hostname='n1', gpus=2))
        self.units = devices.units_from_inventory(self.inventory)
        self.registered = tuple(hami.DeviceInfo(
            id=u.uuid, index=u.index, count=10, devmem=u.vram_mib,
            devcore=u.compute_units, type='AMD MI300X', health=True)
            for u in self.units)

    def plugin(self, node: cgroupfs.SimNode | None
               ) -> deviceplugin.DevicePlugin:
        caps = None
        if node is not None and dmem.probe(node.fs).available:
            caps = podcaps.PodCaps(node.fs, dmem.probe(node.fs), self.units)
        plugin = deviceplugin.DevicePlugin(
            self.inventory, plugin_dir=self.kubelet.plugin_dir,
            socket_name='amdgpu.sock', share_count=10, poll_interval=0.05,
            pod_source=podsource.KubernetesPodSource('n1', self.api),
            caps=caps).start()
        self.addCleanup(plugin.stop)
        self.kubelet.wait_for_devices(RESOURCE, count=20)
        return plugin

    def sim(self, driver: cgroups.Driver, **kwargs: Any) -> cgroupfs.SimNode:
        return cgroupfs.SimNode(
            os.path.join(self.dir, 'cg-%s' % driver.value), driver=driver,
            gpus={u.gpu_address: u.vram_mib * MIB for u in self.units},
            **kwargs)

    def schedule(self, name: str, containers: list[tuple[str, int, int]],
                 init: list[tuple[str, int, int]] = ()) -> Any:
        """Create, book (GPU 1), lock and bind a pod, as the extender
        does; containers are (name, percent, MiB) with percent 100 and
        MiB 0 for a whole GPU."""
        def spec(items: Any) -> list[client.V1Container]:
            result = []
            for cname, percent, mib in items:
                limits = {'amd.com/gpu': '1'}
                if percent < 100 or mib:
                    limits.update({'amd.com/gpucores': str(percent),
                                   'amd.com/gpumem': str(mib)})
                result.append(client.V1Container(
                    name=cname, image='rocm',
                    resources=client.V1ResourceRequirements(limits=limits)))
            return result

        pod = self.api.create_namespaced_pod('team', client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, namespace='team'),
            spec=client.V1PodSpec(init_containers=spec(init) or None,
                                  containers=spec(containers))))
        device = self.registered[1]
        booked = tuple((hami.ContainerDevice(
            device.id, device.type, mib or device.devmem,
            hami.percent_to_cus(percent, device.devcore)),)
            for _n, percent, mib in [*init, *containers])
        cluster.book(self.api, 'n1', pod, booked,
                     allocrecord.capacity_of(self.registered))
        now = datetime.datetime.now(datetime.UTC)
        value = hami.encode_pod_devices(booked)
        self.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: hami.encode_node_lock(hami.NodeLock(
                now, 'team', name))}}},
            _content_type='application/merge-patch+json')
        self.api.patch_namespaced_pod(name, 'team', {'metadata': {
            'labels': {hami.VGPU_NODE: 'n1'}, 'annotations': {
                hami.DEVICES_TO_ALLOCATE: value,
                hami.DEVICES_ALLOCATED: value, hami.VGPU_NODE: 'n1',
                hami.VGPU_TIME: hami.encode_unix_time(now.timestamp()),
                hami.BIND_PHASE: 'allocating',
                hami.BIND_TIME: hami.encode_unix_time(now.timestamp())}}})
        self.api.create_namespaced_pod_binding(
            name, 'team', client.V1Binding(
                metadata=client.V1ObjectMeta(name=name),
                target=client.V1ObjectReference(kind='Node', name='n1')),
            _preload_content=False)
        return pod

    def run_pod(self, node: cgroupfs.SimNode, pod: Any,
                qos: cgroups.QosClass) -> list[dict[str, int | None]]:
        """kubelet: admit the pod (Allocate for each container, with its
        device reuse), create its pod cgroup (as ``SyncPod`` does before
        any container) and start its containers in order; :returns: the
        pod cgroup's caps as each container started."""
        spec = kubelet_fixture.PodSpec.from_api(
            self.api.api_client.sanitize_for_serialization(pod))
        self.kubelet.admit_pod(spec)
        parts = node.pod(spec.uid, qos)
        seen: list[dict[str, int | None]] = []

        def start(name: str) -> None:
            seen.append(node.caps(parts))
            node.container(parts, name)

        self.kubelet.start_pod(spec.uid, start)
        return seen

    def check_capped(self, driver: cgroups.Driver,
                     qos: cgroups.QosClass) -> None:
        region = dmem.region(self.units[1].gpu_address)
        node = self.sim(driver, enabled=False)
        self.plugin(node)
        endpoint = self.kubelet.plugins[RESOURCE]
        self.assertTrue(endpoint.options.pre_start_required)
        pod = self.schedule('job', [('main', 50, 16384)],
                            init=[('prep', 25, 8192)])
        seen = self.run_pod(node, pod, qos)
        # capped at the pod's booking before either container started
        cap = {region: (8192 + 16384) * MIB,
               dmem.region(self.units[0].gpu_address): None}
        self.assertEqual([cap, cap], seen)
        self.assertEqual(2, len(self.kubelet.calls.prestart))
        # a restart of the container: PreStart again, nothing written
        writes = len(node.fs.writes)
        started: list[str] = []
        self.kubelet.restart_container(pod.metadata.uid, 'main',
                                       started.append)
        self.assertEqual(['main'], started)
        self.assertEqual(3, len(self.kubelet.calls.prestart))
        self.assertEqual(writes, len(node.fs.writes))

    def test_systemd_burstable_slices_start_capped(self) -> None:
        self.check_capped(cgroups.Driver.SYSTEMD, cgroups.QosClass.BURSTABLE)

    def test_cgroupfs_guaranteed_slices_start_capped(self) -> None:
        self.check_capped(cgroups.Driver.CGROUPFS,
                          cgroups.QosClass.GUARANTEED)

    def test_a_whole_gpu_pod_gets_no_cap(self) -> None:
        node = self.sim(cgroups.Driver.SYSTEMD)
        self.plugin(node)
        pod = self.schedule('whole', [('main', 100, 0)])
        seen = self.run_pod(node, pod, cgroups.QosClass.BEST_EFFORT)
        self.assertEqual([{dmem.region(u.gpu_address): None
                           for u in self.units}], seen)

    def test_no_pod_cgroup_no_start(self) -> None:
        node = self.sim(cgroups.Driver.SYSTEMD)
        self.plugin(node)
        pod = self.schedule('early', [('main', 50, 4096)])
        spec = kubelet_fixture.PodSpec.from_api(
            self.api.api_client.sanitize_for_serialization(pod))
        self.kubelet.admit_pod(spec)
        started: list[str] = []
        err = self.assertRaises(grpc.RpcError, self.kubelet.start_pod,
                                spec.uid, started.append)
        self.assertEqual(grpc.StatusCode.FAILED_PRECONDITION, err.code())
        self.assertIn('kubepods-burstable-pod', err.details())
        self.assertEqual([], started)

    def test_without_dmem_no_prestart(self) -> None:
        node = self.sim(cgroups.Driver.SYSTEMD, dmem_controller=False)
        self.plugin(node)
        endpoint = self.kubelet.plugins[RESOURCE]
        self.assertFalse(endpoint.options.pre_start_required)
        pod = self.schedule('hooked', [('main', 50, 4096)])
        self.assertEqual(1, len(self.run_pod(
            node, pod, cgroups.QosClass.BURSTABLE)))
        self.assertEqual([], self.kubelet.calls.prestart)
