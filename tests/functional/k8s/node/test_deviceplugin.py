"""The device plugin and the kubelet stand-in over real unix sockets."""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import tempfile
import threading

import grpc
import testtools
from kubernetes import client

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import health as node_health
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster

RESOURCE = 'amd.com/gpu'


class DevicePluginTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        # unix socket paths are limited to ~107 bytes: keep the dir short
        self.dir = tempfile.mkdtemp(prefix='dp')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.dev_root = os.path.join(self.dir, 'root')
        self.plugin_dir = os.path.join(self.dir, 'dp')
        os.makedirs(self.plugin_dir)
        self.inventory = simulate.design_host(
            simulate.HostSpec(hostname='n1', mode='spx'))
        self.units = devices.units_from_inventory(self.inventory)
        # AMD device nodes cannot exist here: fake them under a root dir
        os.makedirs(os.path.join(self.dev_root, 'dev', 'dri'))
        open(os.path.join(self.dev_root, 'dev', 'kfd'), 'w').close()
        for unit in self.units:
            for path in (unit.card_path, unit.render_path):
                open(os.path.join(self.dev_root, path.lstrip('/')),
                     'w').close()
        self.kubelet = kubelet_fixture.KubeletStandIn(self.plugin_dir)
        self.kubelet.start()
        self.addCleanup(self.kubelet.stop)

    def _plugin(self, share_count: int = 2) -> deviceplugin.DevicePlugin:
        plugin = deviceplugin.DevicePlugin(
            self.inventory, plugin_dir=self.plugin_dir,
            socket_name='amdgpu.sock', resource_name=RESOURCE,
            share_count=share_count, poll_interval=0.05,
            health=node_health.device_node_health(self.dev_root))
        plugin.start()
        self.addCleanup(plugin.stop)
        return plugin

    def test_registers_and_lists_devices(self) -> None:
        self._plugin(share_count=2)
        endpoint = self.kubelet.wait_for_devices(RESOURCE, count=16)
        request = self.kubelet.register_requests[0]
        self.assertEqual(('v1beta1', 'amdgpu.sock', RESOURCE, True),
                         (request.version, request.endpoint,
                          request.resource_name,
                          request.options.get_preferred_allocation_available))
        self.assertEqual(16, endpoint.capacity)
        first = endpoint.devices[0]
        self.assertEqual('%s-0' % self.units[0].uuid, first.ID)
        self.assertEqual([0], [n.ID for n in first.topology.nodes])
        self.assertEqual([1], [n.ID for n in
                               endpoint.devices[-1].topology.nodes])

    def test_whole_gpu_allocation(self) -> None:
        self._plugin(share_count=2)
        self.kubelet.wait_for_devices(RESOURCE, count=16)
        chosen, response = self.kubelet.admit(RESOURCE, 2)
        # GetPreferredAllocation spreads over two distinct GPUs
        self.assertEqual([self.units[0].device_id(0),
                          self.units[1].device_id(0)], chosen)
        self.assertEqual(
            'GPU-%s,GPU-%s' % (self.units[0].uuid, self.units[1].uuid),
            response.envs['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0,1', response.envs['HIP_VISIBLE_DEVICES'])
        self.assertEqual(
            ['/dev/kfd', '/dev/dri/card1', '/dev/dri/renderD128',
             '/dev/dri/card9', '/dev/dri/renderD136'],
            [d.host_path for d in response.devices])
        self.assertEqual({'rw'}, {d.permissions for d in response.devices})
        # the next whole-GPU container gets the next untouched GPUs
        chosen, _response = self.kubelet.admit(RESOURCE, 1)
        self.assertEqual([self.units[2].device_id(0)], chosen)

    def test_allocate_unknown_device_is_refused(self) -> None:
        self._plugin()
        endpoint = self.kubelet.wait_for_devices(RESOURCE)
        err = self.assertRaises(
            grpc.RpcError, endpoint.stub.Allocate, api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(
                    devices_ids=['feedfacefeedface-0'])]), timeout=10)
        self.assertEqual(grpc.StatusCode.INVALID_ARGUMENT, err.code())
        self.assertIn('feedfacefeedface-0', err.details())

    def test_health_change_sends_new_list(self) -> None:
        self._plugin(share_count=1)
        self.kubelet.wait_for_devices(RESOURCE, count=8)
        os.unlink(os.path.join(self.dev_root,
                               self.units[3].render_path.lstrip('/')))
        endpoint = self.kubelet.wait_for_devices(RESOURCE, updates=2)
        self.assertEqual(7, endpoint.capacity)
        sick = [d.ID for d in endpoint.devices if d.health == 'Unhealthy']
        self.assertEqual([self.units[3].device_id(0)], sick)

    def test_reregisters_after_kubelet_restart(self) -> None:
        plugin = self._plugin(share_count=1)
        self.kubelet.wait_for_devices(RESOURCE, count=8)
        self.kubelet.restart()
        self.assertEqual({}, self.kubelet.plugins)
        endpoint = self.kubelet.wait_for_devices(RESOURCE, count=8)
        self.assertEqual(2, len(self.kubelet.register_requests))
        self.assertEqual(2, plugin.registrations)
        self.assertTrue(os.path.exists(plugin.socket_path))
        chosen, response = self.kubelet.admit(RESOURCE, 1)
        self.assertEqual(1, len(chosen))
        self.assertTrue(response.envs['ROCR_VISIBLE_DEVICES'].startswith(
            'GPU-'))
        self.assertEqual(8, endpoint.capacity)

    def test_waits_for_kubelet_then_registers(self) -> None:
        self.kubelet.stop()
        plugin = self._plugin()
        self.assertEqual(0, plugin.registrations)
        self.kubelet.start()
        self.kubelet.wait_for_devices(RESOURCE, count=16)
        # The kubelet may list the devices before the plugin's Register
        # call has returned and been counted: wait for the count, then
        # check that it stays at exactly one.
        self.assertTrue(self.kubelet.wait_for(
            lambda: plugin.registrations >= 1))
        self.assertEqual(1, plugin.registrations)

    def test_clean_shutdown_removes_socket(self) -> None:
        plugin = self._plugin()
        self.kubelet.wait_for_devices(RESOURCE)
        plugin.stop()
        self.assertFalse(os.path.exists(plugin.socket_path))
        self.assertTrue(self.kubelet.wait_for(
            lambda: self.kubelet.plugins[RESOURCE].stream_ended))


class HamiAllocateTest(testtools.TestCase):
    """Allocate for pods the allocation record places on the node:
    kubelet stand-in + API stand-in, the plugin over its unix socket."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.dir = tempfile.mkdtemp(prefix='dp')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.kubelet = kubelet_fixture.KubeletStandIn(self.dir).start()
        self.addCleanup(self.kubelet.stop)
        self.inventory = simulate.design_host(
            simulate.HostSpec(hostname='n1'))
        self.units = devices.units_from_inventory(self.inventory)
        self.capacity = sharedalloc.capacity(self.units, 10)
        self.plugin = self._start_plugin()
        self.kubelet.wait_for_devices(RESOURCE, count=80)
        self.kube.api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name='n1')))

    def _start_plugin(self) -> deviceplugin.DevicePlugin:
        plugin = deviceplugin.DevicePlugin(
            self.inventory, plugin_dir=self.dir, socket_name='amdgpu.sock',
            share_count=10, poll_interval=0.05,
            pod_source=podsource.KubernetesPodSource('n1', self.kube.api))
        plugin.start()
        self.addCleanup(plugin.stop)
        return plugin

    def _lock(self, name: str, uid: str | None = None) -> None:
        """The lock as the extender's bind takes it (with the UID when
        given)."""
        value = '%s,team,%s' % (hami.format_rfc3339(
            datetime.datetime.now(datetime.UTC)), name)
        self.kube.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: value,
            nodelock.LOCK_UID: nodelock.encode_lock_uid(uid, value) if uid
            else None}}})

    def _lock_value(self) -> str | None:
        node = self.kube.server.get_object('nodes', 'n1')
        return (node['metadata'].get('annotations') or {}).get(
            hami.NODE_LOCK)

    def _pod(self, name: str, containers: hami.PodDevices,
             annotations: dict[str, str] | None = None,
             when: int = 100) -> dict[str, object]:
        """A pod bound to n1, booked in the record as the extender does,
        with the extender's mirror annotations."""
        value = hami.encode_pod_devices(containers)
        pod = self.kube.server.put_object('pods', {
            'metadata': {'name': name, 'namespace': 'team',
                         'annotations': dict(annotations or {
                             hami.BIND_PHASE: 'allocating',
                             hami.VGPU_NODE: 'n1', hami.BIND_TIME: '1',
                             hami.DEVICES_TO_ALLOCATE: value,
                             hami.DEVICES_ALLOCATED: value})},
            'spec': {'nodeName': 'n1', 'containers': [
                {'name': 'c%d' % n} for n in range(len(containers))]},
            'status': {'phase': 'Running'}})
        if containers:
            cluster.book(self.kube.api, 'n1', pod, containers, self.capacity,
                         when)
        return pod

    def _record(self) -> allocrecord.Record:
        return recordstore.RecordStore(self.kube.api).read('n1')[0]

    def _gpu(self, n: int, mib: int, cus: int) -> hami.ContainerDevice:
        return hami.ContainerDevice(self.units[n].uuid, 'AMD', mib, cus)

    def _allocate(self, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        stub = self.kubelet.plugins[RESOURCE].stub
        return stub.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=ids)]),
            timeout=30).container_responses[0]

    def _ids(self, count: int, start: int = 0) -> list[str]:
        return [d.ID for d in self.kubelet.plugins[RESOURCE].devices][
            start:start + count]

    def test_serves_the_recorded_cus_and_mirrors_them(self) -> None:
        uuid = self.units[0].uuid
        self._pod('neighbour', ((self._gpu(0, 1024, 152),),))
        self._pod('job', ((self._gpu(0, 49152, 76),),), when=200)
        self._lock('job')
        _chosen, response = self.kubelet.admit(RESOURCE, 1)
        self.assertEqual('GPU-%s' % uuid,
                         response.envs['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0:152-227', response.envs['HSA_CU_MASK'])
        self.assertEqual('49152m', response.envs['HIP_DEVICE_MEMORY_LIMIT_0'])
        self.assertEqual(hami.LD_AUDIT_LIBRARY, response.envs['LD_AUDIT'])
        self.assertEqual([hami.LD_AUDIT_LIBRARY],
                         [m.host_path for m in response.mounts])
        annotations = self.kube.api.read_namespaced_pod(
            'job', 'team').metadata.annotations
        self.assertEqual('{"%s":"152-227"}' % uuid,
                         annotations[hami.CU_ALLOCATED])
        self.assertEqual('success', annotations[hami.BIND_PHASE])
        self.assertEqual(';', annotations[hami.DEVICES_TO_ALLOCATE])
        self.assertIsNone(self._lock_value())

    def test_annotations_the_record_does_not_confirm_are_refused(self) -> None:
        # a pod that wrote itself HAMi annotations: not in the record
        value = '%s,AMD,1024,304:;' % self.units[0].uuid
        pod = self._pod('forged', (), annotations={
            hami.BIND_PHASE: 'allocating', hami.VGPU_NODE: 'n1',
            hami.BIND_TIME: '1', hami.DEVICES_TO_ALLOCATE: value,
            hami.DEVICES_ALLOCATED: value})
        err = self.assertRaises(grpc.RpcError, self.kubelet.admit,
                                RESOURCE, 1)
        self.assertEqual(grpc.StatusCode.INVALID_ARGUMENT, err.code())
        self.assertIn('no live node lock', err.details())
        self.assertEqual(pod, self.kube.server.get_object('pods', 'forged',
                                                          'team'))

    def test_lock_holder_deleted_mid_allocation(self) -> None:
        # the late Allocate of a deleted pod is not given the next pod's
        # allocation
        gone = self._pod('gone', ((self._gpu(0, 1024, 38),),))
        self._pod('next', ((self._gpu(0, 1024, 38),),), when=200)
        self._lock('gone')
        self.kube.api.delete_namespaced_pod('gone', 'team')
        recordstore.RecordStore(self.kube.api).update(
            'n1', lambda r: allocrecord.without(
                r, gone['metadata']['uid']))
        before = self.kube.server.get_object('pods', 'next', 'team')
        err = self.assertRaises(grpc.RpcError, self._allocate, self._ids(1))
        self.assertIn('held by pod team/gone', err.details())
        self.assertEqual(before, self.kube.server.get_object(
            'pods', 'next', 'team'))
        # the refused Allocate was the gone pod's: its lock is retired
        self.assertIsNone(self._lock_value())
        # once the lock is the next pod's, it gets its own allocation
        self._lock('next')
        response = self._allocate(self._ids(1, 1))
        self.assertEqual('0:38-75', response.envs['HSA_CU_MASK'])

    def test_deleted_and_created_again_with_the_same_name(self) -> None:
        # a StatefulSet pod deleted mid-allocation and created again: the
        # new pod has the name, is bound here and booked, but the lock was
        # taken for the old UID: the late Allocate is the old pod's
        old = self._pod('db-0', ((self._gpu(0, 1024, 38),),))
        old_uid = old['metadata']['uid']
        self._lock('db-0', old_uid)
        self.kube.api.delete_namespaced_pod('db-0', 'team')
        recordstore.RecordStore(self.kube.api).update(
            'n1', lambda r: allocrecord.without(r, old_uid))
        new = self._pod('db-0', ((self._gpu(1, 2048, 76),),), when=200)
        new_uid = new['metadata']['uid']
        self.assertNotEqual(old_uid, new_uid)
        before = self.kube.server.get_object('pods', 'db-0', 'team')
        err = self.assertRaises(grpc.RpcError, self._allocate, self._ids(1))
        self.assertEqual(grpc.StatusCode.INVALID_ARGUMENT, err.code())
        self.assertIn('held by pod team/db-0 (uid %s)' % old_uid,
                      err.details())
        self.assertIn('replaced by a pod of the same name', err.details())
        # nothing of the new pod was handed out or mirrored
        self.assertEqual(before, self.kube.server.get_object(
            'pods', 'db-0', 'team'))
        self.assertIsNone(self._lock_value())
        # a lock of another pod of that name is not released by the old
        # pod's refusal
        self._lock('db-0', new_uid)
        self.plugin.pod_source.release_lock(  # type: ignore[union-attr]
            'team', 'db-0', old_uid)
        self.assertIsNotNone(self._lock_value())
        # the new pod's own Allocate, under its own lock
        response = self._allocate(self._ids(1, 10))
        self.assertEqual('GPU-%s' % self.units[1].uuid,
                         response.envs['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0:0-75', response.envs['HSA_CU_MASK'])

    def test_late_retry_of_a_deleted_pod_is_refused(self) -> None:
        # a two-container pod: container 0 served, the pod force-deleted,
        # then kubelet's retry of container 0 and its late container 1,
        # long after; the next pod is booked and bound meanwhile
        pair = self._pod('pair', ((self._gpu(0, 1024, 38),),
                                  (self._gpu(0, 1024, 38),)))
        self._pod('next', ((self._gpu(0, 1024, 38),),), when=200)
        self._lock('pair', pair['metadata']['uid'])
        ids = self._ids(1)
        self.assertEqual('0:0-37', self._allocate(ids).envs['HSA_CU_MASK'])
        self.kube.api.delete_namespaced_pod('pair', 'team')
        before = self.kube.server.get_object('pods', 'next', 'team')
        # kubelet's retry of container 0 (its answer was lost)
        err = self.assertRaises(grpc.RpcError, self._allocate, ids)
        self.assertIn('held by pod team/pair (uid %s)'
                      % pair['metadata']['uid'], err.details())
        # the refusal retired the lock: container 1, later still, finds
        # none, and no other booked pod is served to it
        self.assertIsNone(self._lock_value())
        err = self.assertRaises(grpc.RpcError, self._allocate,
                                self._ids(1, 1))
        self.assertIn('no live node lock', err.details())
        self.assertEqual(before, self.kube.server.get_object(
            'pods', 'next', 'team'))
        # the next pod, once it holds the lock, gets its own CUs (the
        # record still holds the gone pod's until the sweep)
        self._lock('next')
        self.assertEqual('0:76-113', self._allocate(self._ids(1, 2)).envs[
            'HSA_CU_MASK'])

    def test_kubelet_retry_after_a_lost_answer(self) -> None:
        self._pod('job', ((self._gpu(1, 4096, 76),),))
        self._lock('job')
        record = self._record()
        ids = self._ids(1)
        first = self._allocate(ids)
        pod = self.kube.server.get_object('pods', 'job', 'team')
        self.assertIsNone(self._lock_value())
        # the answer was lost: kubelet asks again with the same devices
        again = self._allocate(ids)
        self.assertEqual(first, again)
        self.assertEqual(record, self._record())
        self.assertEqual(pod['metadata']['annotations'],
                         self.kube.server.get_object('pods', 'job', 'team')[
                             'metadata']['annotations'])
        # another container of no pod: refused
        self.assertRaises(grpc.RpcError, self._allocate, self._ids(1, 5))

    def test_two_containers_book_what_they_got(self) -> None:
        uuid = self.units[0].uuid
        self._pod('pair', ((self._gpu(0, 1024, 38),),
                           (self._gpu(0, 2048, 76),)))
        self._lock('pair')
        record = self._record()
        first = self._allocate(self._ids(1))
        self.assertIsNotNone(self._lock_value())
        second = self._allocate(self._ids(1, 1))
        self.assertEqual('0:0-37', first.envs['HSA_CU_MASK'])
        self.assertEqual('0:38-113', second.envs['HSA_CU_MASK'])
        self.assertEqual('2048m', second.envs['HIP_DEVICE_MEMORY_LIMIT_0'])
        annotations = self.kube.api.read_namespaced_pod(
            'pair', 'team').metadata.annotations
        self.assertEqual({uuid: (1 << 114) - 1}, hami.decode_cu_allocated(
            annotations[hami.CU_ALLOCATED]))
        self.assertEqual('success', annotations[hami.BIND_PHASE])
        self.assertEqual(record, self._record())
        self.assertIsNone(self._lock_value())
        err = self.assertRaises(grpc.RpcError, self._allocate,
                                self._ids(1, 2))
        self.assertIn('no live node lock', err.details())

    def test_restart_in_the_middle_of_allocate(self) -> None:
        self._pod('job', ((self._gpu(0, 1024, 38),),
                          (self._gpu(1, 1024, 38),)))
        self._lock('job')
        ids = self._ids(1)
        # the plugin dies after it served container 0 but before its
        # mirror reached the API (the write fails, kubelet gets an error)
        source = self.plugin.pod_source
        assert source is not None
        real = source.annotate_pod

        def broken(*args: object, **kwargs: object) -> None:
            raise exception.KubernetesError(request='PATCH pod team/job',
                                            reason='transport error')

        source.annotate_pod = broken  # type: ignore[method-assign]
        self.assertRaises(grpc.RpcError, self._allocate, ids)
        source.annotate_pod = real  # type: ignore[method-assign]
        self.plugin.stop()
        self.plugin = self._start_plugin()
        self.kubelet.wait_for(lambda: self.kubelet.plugins[
            RESOURCE].stub is not None and self.plugin.registrations > 0)
        self.kubelet.wait_for_devices(RESOURCE, count=80)
        # kubelet retries: the same container, the same CUs
        first = self._allocate(ids)
        self.assertEqual('0:0-37', first.envs['HSA_CU_MASK'])
        self.assertEqual(';%s,AMD,1024,38:;' % self.units[1].uuid, (
            self.kube.server.get_object('pods', 'job', 'team')['metadata'][
                'annotations'][hami.DEVICES_TO_ALLOCATE]))
        second = self._allocate(self._ids(1, 10))
        self.assertEqual('GPU-%s' % self.units[1].uuid,
                         second.envs['ROCR_VISIBLE_DEVICES'])
        self.assertIsNone(self._lock_value())

    def test_an_over_committed_record_is_refused(self) -> None:
        a = self._pod('a', ((self._gpu(0, 1024, 38),),))
        self._pod('b', ((self._gpu(0, 1024, 38),),), when=200)
        self._lock('a')
        # someone wrote the record by hand: b's CUs overlap a's
        store = recordstore.RecordStore(self.kube.api)
        record = store.read('n1')[0]
        pods_ = dict(record.pods)
        uid = a['metadata']['uid']
        grant = pods_[uid].containers[0][0]
        other = next(g for g in pods_ if g != uid)
        pods_[other] = dataclasses.replace(pods_[other], containers=(
            (dataclasses.replace(grant, cus=grant.cus | 1 << 40),),))
        store.update('n1', lambda r: allocrecord.Record('n1', pods_))
        err = self.assertRaises(grpc.RpcError, self._allocate, self._ids(1))
        self.assertIn('amdgpu-virt-alloc-n1', err.details())
        self.assertIn('also held by', err.details())

    def test_parallel_allocations_never_share_a_cu(self) -> None:
        # kubelet serialises Allocate, but nothing in the protocol forces
        # it: eight concurrent calls for the eight containers of the lock
        # holder sharing one GPU must still get disjoint CUs that add up
        # to the whole GPU
        uuid = self.units[0].uuid
        pod = self._pod('p', tuple((self._gpu(0, 1024, 38),)
                                   for _n in range(8)))
        self._lock('p', pod['metadata']['uid'])
        ids = self._ids(8)
        masks: list[str] = []
        errors: list[Exception] = []

        def allocate(n: int) -> None:
            try:
                masks.append(self._allocate([ids[n]]).envs['HSA_CU_MASK'])
            except Exception as err:
                errors.append(err)

        threads = [threading.Thread(target=allocate, args=(n,))
                   for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self.assertEqual([], errors)
        union = 0
        for mask in masks:
            cus = cumask.parse_hsa_cu_mask(mask).as_dict()[0]
            self.assertEqual(38, cus.bit_count())
            self.assertEqual(0, union & cus, mask)
            union |= cus
        self.assertEqual((1 << 304) - 1, union)
        annotations = self.kube.api.read_namespaced_pod(
            'p', 'team').metadata.annotations
        self.assertEqual('success', annotations[hami.BIND_PHASE])
        self.assertEqual({uuid: union}, hami.decode_cu_allocated(
            annotations[hami.CU_ALLOCATED]))
        self.assertIsNone(self._lock_value())
