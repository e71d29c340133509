"""The kubelet stand-in follows kubelet's device manager.

A recording device plugin on a unix socket (what it is asked, and when,
is what these tests check) stands on the other side; the rules are those
of ``pkg/kubelet/cm/devicemanager/manager.go`` (see
``doc/source/contributor/kubelet-device-manager.rst``).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import grpc
import testtools

from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc
from tests.functional.fixtures import devicemanager
from tests.functional.fixtures import kubelet as kubelet_fixture

RESOURCE = 'example.com/dev'
Container = kubelet_fixture.ContainerSpec
Pod = kubelet_fixture.PodSpec


class _Recorder(api_pb2_grpc.DevicePluginServicer):
    """A plugin that records every call; Allocate answers the IDs it got
    in ``IDS``; ``fail`` makes the next Allocate fail."""

    def __init__(self, ids: list[str], options: api_pb2.DevicePluginOptions,
                 prefer: list[str] | None = None) -> None:
        self.ids = ids
        self.options = options
        self.prefer = prefer
        self.calls: list[tuple[str, object]] = []
        self.fail = False
        self.lock = threading.Lock()

    def GetDevicePluginOptions(self, request: api_pb2.Empty,
                               context: grpc.ServicerContext
                               ) -> api_pb2.DevicePluginOptions:
        return self.options

    def ListAndWatch(self, request: api_pb2.Empty,
                     context: grpc.ServicerContext
                     ) -> Iterator[api_pb2.ListAndWatchResponse]:
        yield api_pb2.ListAndWatchResponse(devices=[
            api_pb2.Device(ID=i, health='Healthy', topology=api_pb2.
                           TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)]))
            for i in self.ids])
        while context.is_active():
            time.sleep(0.05)

    def GetPreferredAllocation(self,
                               request: api_pb2.PreferredAllocationRequest,
                               context: grpc.ServicerContext
                               ) -> api_pb2.PreferredAllocationResponse:
        (req,) = request.container_requests
        with self.lock:
            self.calls.append(('preferred', (
                tuple(req.available_deviceIDs),
                tuple(req.must_include_deviceIDs), req.allocation_size)))
        chosen = list(req.must_include_deviceIDs)
        for device in self.prefer or sorted(req.available_deviceIDs):
            if len(chosen) < req.allocation_size and device not in chosen \
                    and device in req.available_deviceIDs:
                chosen.append(device)
        return api_pb2.PreferredAllocationResponse(container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen)])

    def Allocate(self, request: api_pb2.AllocateRequest,
                 context: grpc.ServicerContext) -> api_pb2.AllocateResponse:
        with self.lock:
            self.calls.append(('allocate', tuple(
                tuple(r.devices_ids) for r in request.container_requests)))
            if self.fail:
                self.fail = False
                context.abort(grpc.StatusCode.UNAVAILABLE, 'lost')
        return api_pb2.AllocateResponse(container_responses=[
            api_pb2.ContainerAllocateResponse(envs={
                'IDS': ','.join(sorted(r.devices_ids))})
            for r in request.container_requests])

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest,
                          context: grpc.ServicerContext
                          ) -> api_pb2.PreStartContainerResponse:
        with self.lock:
            self.calls.append(('prestart', tuple(request.devices_ids)))
        return api_pb2.PreStartContainerResponse()

    def of(self, kind: str) -> list[object]:
        with self.lock:
            return [args for name, args in self.calls if name == kind]


class KubeletStandInTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix='ks')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.kubelet = kubelet_fixture.KubeletStandIn(self.dir).start()
        self.addCleanup(self.kubelet.stop)

    def _serve(self, count: int = 4, prestart: bool = False,
               preferred: bool = True, prefer: list[str] | None = None
               ) -> _Recorder:
        """Serve a recording plugin of ``count`` devices and register it
        (again after a kubelet restart, as a plugin does)."""
        recorder = _Recorder(['d%d' % n for n in range(count)],
                             api_pb2.DevicePluginOptions(
                                 pre_start_required=prestart,
                                 get_preferred_allocation_available=preferred
                             ), prefer)
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(recorder, server)
        server.add_insecure_port('unix:' + os.path.join(self.dir, 'p.sock'))
        server.start()
        self.addCleanup(server.stop, None)
        self._register()
        self.kubelet.wait_for_devices(RESOURCE, count=count)
        self.assertTrue(self.kubelet.wait_for(
            lambda: len(self.kubelet.manager.healthy.get(RESOURCE, ()))
            == count))
        return recorder

    def _register(self) -> None:
        with grpc.insecure_channel('unix:' + self.kubelet.socket_path) as ch:
            api_pb2_grpc.RegistrationStub(ch).Register(
                api_pb2.RegisterRequest(version='v1beta1', endpoint='p.sock',
                                        resource_name=RESOURCE), timeout=5)

    def _pod(self, uid: str, containers: list[int],
             init: tuple[tuple[int, bool], ...] = ()) -> Pod:
        return Pod(uid, uid, 'ns', tuple(
            Container('i%d' % n, {RESOURCE: count} if count else {}, side)
            for n, (count, side) in enumerate(init)), tuple(
            Container('c%d' % n, {RESOURCE: count} if count else {})
            for n, count in enumerate(containers)))

    def test_registration_is_checked(self) -> None:
        with grpc.insecure_channel('unix:' + self.kubelet.socket_path) as ch:
            stub = api_pb2_grpc.RegistrationStub(ch)
            for request in (api_pb2.RegisterRequest(
                    version='v1alpha', endpoint='p.sock',
                    resource_name=RESOURCE), api_pb2.RegisterRequest(
                    version='v1beta1', endpoint='p.sock',
                    resource_name='nodomain')):
                err = self.assertRaises(grpc.RpcError, stub.Register,
                                        request, timeout=5)
                self.assertEqual(grpc.StatusCode.INVALID_ARGUMENT,
                                 err.code())

    def test_one_allocate_per_container_in_pod_order(self) -> None:
        plugin = self._serve(count=6)
        pod = self._pod('p', [1, 0, 2], init=((1, True), (0, False)))
        held = self.kubelet.admit_pod(pod)
        self.assertEqual(['i0', 'c0', 'c2'], list(held))
        # one ContainerRequest per call, init containers first
        calls = plugin.of('allocate')
        self.assertEqual([1, 1, 1], [len(c) for c in calls])
        self.assertEqual([held[n][RESOURCE][0] for n in ('i0', 'c0', 'c2')],
                         [tuple(sorted(c[0])) for c in calls])
        self.assertEqual(4, len({i for h in held.values()
                                 for i in h[RESOURCE][0]}))
        self.assertEqual(','.join(held['c2'][RESOURCE][0]),
                         held['c2'][RESOURCE][1].envs['IDS'])

    def test_init_devices_go_to_the_next_container(self) -> None:
        plugin = self._serve(count=4)
        held = self.kubelet.admit_pod(self._pod(
            'p', [1, 2], init=((1, False),)))
        init, first, second = (held[n][RESOURCE][0]
                               for n in ('i0', 'c0', 'c1'))
        self.assertEqual(init, first)
        self.assertFalse(set(first) & set(second))
        # the second container took nothing from the pool: the first
        # container took the init container's device out of it; kubelet
        # asked GetPreferredAllocation for the whole of each request
        preferred = plugin.of('preferred')
        self.assertEqual(2, len(preferred))   # i0 and c1, not c0
        self.assertEqual(((), 1), preferred[0][1:])
        self.assertEqual(((), 2), preferred[1][1:])
        self.assertNotIn(init[0], preferred[1][0])

    def test_reuse_is_mustinclude_for_a_larger_request(self) -> None:
        plugin = self._serve(count=4)
        held = self.kubelet.admit_pod(self._pod('p', [3],
                                                init=((1, False),)))
        init = held['i0'][RESOURCE][0]
        self.assertIn(init[0], held['c0'][RESOURCE][0])
        available, must, size = plugin.of('preferred')[-1]  # type: ignore
        self.assertEqual((init, 3), (must, size))
        self.assertIn(init[0], available)
        self.assertEqual(4, len(available))

    def test_sidecar_devices_are_not_reused(self) -> None:
        self._serve(count=4)
        held = self.kubelet.admit_pod(self._pod('p', [1],
                                                init=((1, True),)))
        self.assertNotEqual(held['i0'][RESOURCE][0],
                            held['c0'][RESOURCE][0])

    def test_the_reuse_pool_is_the_pods_own(self) -> None:
        self._serve(count=2)
        held = self.kubelet.admit_pod(self._pod('a', [0],
                                                init=((1, False),)))
        # the init container's device stays held by its pod
        other = self.kubelet.admit_pod(self._pod('b', [1]))
        self.assertNotEqual(held['i0'][RESOURCE][0],
                            other['c0'][RESOURCE][0])
        err = self.assertRaises(kubelet_fixture.AdmissionError,
                                self.kubelet.admit_pod, self._pod('c', [1]))
        self.assertIn('requested number of devices unavailable for '
                      '%s. Requested: 1, Available: 0' % RESOURCE, str(err))

    def test_devices_of_a_pod_that_left_are_free_again(self) -> None:
        self._serve(count=1)
        first = self.kubelet.admit_pod(self._pod('a', [1]))
        self.assertRaises(kubelet_fixture.AdmissionError,
                          self.kubelet.admit_pod, self._pod('b', [1]))
        self.kubelet.remove_pod('a')
        second = self.kubelet.admit_pod(self._pod('c', [1]))
        self.assertEqual(first['c0'][RESOURCE][0],
                         second['c0'][RESOURCE][0])

    def test_a_failed_allocate_rejects_the_pod(self) -> None:
        plugin = self._serve(count=2, preferred=False)
        plugin.fail = True
        err = self.assertRaises(kubelet_fixture.AdmissionError,
                                self.kubelet.admit_pod,
                                self._pod('a', [1, 1]))
        self.assertEqual('UnexpectedAdmissionError', err.reason)
        self.assertEqual('Allocate failed due to rpc error: code = '
                         'Unavailable desc = lost, which is unexpected',
                         str(err))
        self.assertNotIn('a', self.kubelet.manager.active)
        # nothing of it is held: both devices go to the next pod
        held = self.kubelet.admit_pod(self._pod('b', [2]))
        self.assertEqual(('d0', 'd1'), held['c0'][RESOURCE][0])
        # without the option kubelet never asks for a preference
        self.assertEqual([], plugin.of('preferred'))

    def test_preferred_allocation_is_asked_and_kept(self) -> None:
        plugin = self._serve(count=4, prefer=['d3', 'd1'])
        held = self.kubelet.admit_pod(self._pod('a', [2]))
        self.assertEqual(('d1', 'd3'), held['c0'][RESOURCE][0])
        self.assertEqual([(('d0', 'd1', 'd2', 'd3'), (), 2)],
                         plugin.of('preferred'))
        self.assertEqual([(('d3', 'd1'),)], plugin.of('allocate'))

    def test_prestart_before_each_container_start(self) -> None:
        plugin = self._serve(count=3, prestart=True)
        pod = self._pod('a', [1, 0], init=((1, True), (1, False)))
        held = self.kubelet.admit_pod(pod)
        self.assertEqual([], plugin.of('prestart'))
        started = self.kubelet.start_pod('a')
        self.assertEqual([held[n][RESOURCE][0] for n in ('i0', 'i1', 'c0')],
                         plugin.of('prestart'))
        self.assertEqual(held['c0'][RESOURCE][1].envs['IDS'],
                         started['c0'].envs['IDS'])
        self.assertEqual({}, started['c1'].envs)
        # a container restart: PreStartContainer again, no Allocate
        allocations = len(plugin.of('allocate'))
        self.kubelet.restart_container('a', 'c0')
        self.assertEqual(held['c0'][RESOURCE][0], plugin.of('prestart')[-1])
        self.assertEqual(allocations, len(plugin.of('allocate')))

    def test_each_container_starts_after_its_prestart(self) -> None:
        plugin = self._serve(count=3, prestart=True)
        self.kubelet.admit_pod(self._pod('a', [1, 1]))
        order: list[tuple[str, int]] = []
        self.kubelet.start_pod('a', lambda name: order.append(
            (name, len(plugin.of('prestart')))))
        # the runtime starts a container once its PreStartContainer is
        # answered, and only then
        self.assertEqual([('c0', 1), ('c1', 2)], order)
        self.kubelet.restart_container('a', 'c1', lambda name: order.append(
            (name, len(plugin.of('prestart')))))
        self.assertEqual(('c1', 3), order[-1])

    def test_no_prestart_unless_asked(self) -> None:
        plugin = self._serve(count=2)
        self.kubelet.admit_pod(self._pod('a', [1]))
        self.kubelet.start_pod('a')
        self.assertEqual([], plugin.of('prestart'))

    def test_plugin_gone_and_back(self) -> None:
        plugin = self._serve(count=2)
        self.kubelet.admit_pod(self._pod('a', [1]))
        self.kubelet.start_pod('a')
        endpoint = self.kubelet.plugins[RESOURCE]
        endpoint.channel.close()   # the stream ends: the plugin went away
        self.assertTrue(self.kubelet.wait_for(lambda: endpoint.stream_ended))
        self.assertEqual(set(), self.kubelet.manager.healthy[RESOURCE])
        self.assertEqual({'d0', 'd1'},
                         self.kubelet.manager.unhealthy[RESOURCE])
        # it registers again: healthy again, the running pod untouched
        self._register()
        self.assertTrue(self.kubelet.wait_for(
            lambda: len(self.kubelet.manager.healthy[RESOURCE]) == 2))
        self.assertEqual(1, len(plugin.of('allocate')))
        self.kubelet.restart_container('a', 'c0')
        self.assertEqual(1, len(plugin.of('allocate')))

    def test_kubelet_restart_keeps_its_checkpoint(self) -> None:
        plugin = self._serve(count=2)
        held = self.kubelet.admit_pod(self._pod('a', [1],
                                                init=((1, False),)))
        self.kubelet.start_pod('a')
        other = os.path.join(self.dir, 'p.sock.served.json')
        open(other, 'w').close()
        self.kubelet.restart()
        # sockets removed, other files kept
        self.assertFalse(os.path.exists(os.path.join(self.dir, 'p.sock')))
        self.assertTrue(os.path.exists(other))
        self.assertTrue(os.path.exists(os.path.join(
            self.dir, devicemanager.CHECKPOINT)))
        self.assertEqual({}, self.kubelet.plugins)
        plugin = self._serve(count=2)
        self.assertEqual({}, self.kubelet.readmit())
        self.assertEqual([], plugin.of('allocate'))
        self.assertEqual(held['c0'][RESOURCE][1].envs['IDS'],
                         self.kubelet.restart_container('a', 'c0').envs[
                             'IDS'])
        # what the checkpoint holds stays held
        self.assertRaises(kubelet_fixture.AdmissionError,
                          self.kubelet.admit_pod, self._pod('b', [2]))

    def test_readmission_before_the_plugin_registers_fails(self) -> None:
        # kubelet#118559: a pod whose containers are not running is
        # rejected when its plugin has not registered again yet
        self._serve(count=2)
        self.kubelet.admit_pod(self._pod('a', [1]))
        self.kubelet.restart()
        rejected = self.kubelet.readmit()
        self.assertEqual(['a'], list(rejected))
        self.assertIn('no healthy devices present', str(rejected['a']))

    def test_a_lost_checkpoint_allocates_again_at_start(self) -> None:
        plugin = self._serve(count=2)
        self.kubelet.admit_pod(self._pod('a', [1]))
        os.unlink(os.path.join(self.dir, devicemanager.CHECKPOINT))
        self.kubelet.restart()
        plugin = self._serve(count=2)
        self.kubelet.start_pod('a')   # GetDeviceRunContainerOptions
        self.assertEqual(1, len(plugin.of('allocate')))

    def test_the_checkpoint_is_checked(self) -> None:
        self._serve(count=2)
        self.kubelet.admit_pod(self._pod('a', [1]))
        path = os.path.join(self.dir, devicemanager.CHECKPOINT)
        with open(path) as handle:
            text = handle.read()
        with open(path, 'w') as handle:
            handle.write(text.replace('"c0"', '"cX"'))
        manager = devicemanager.DeviceManager(path)
        self.assertRaisesRegex(devicemanager.DeviceError, 'corrupted',
                               manager.read_checkpoint)
