"""The kubelet stand-in calls PreStartContainer where kubelet does.

A minimal plugin (this test's own servicer) registers with or without
``pre_start_required``; the stand-in must call PreStartContainer before
each start only in the first case, and must not start a container whose
PreStartContainer failed (kubelet's ``callPreStartContainerIfNeeded``).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import grpc
import testtools

from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc
from tests.functional.fixtures import kubelet as kubelet_fixture


class _Plugin(api_pb2_grpc.DevicePluginServicer):

    def __init__(self, required: bool, fail: bool = False) -> None:
        self.required = required
        self.fail = fail
        self.calls: list[list[str]] = []

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(pre_start_required=self.required)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        yield api_pb2.ListAndWatchResponse(devices=[
            api_pb2.Device(ID='d%d' % n, health='Healthy')
            for n in range(2)])
        while context.is_active():   # the stream stays open, as a plugin's
            time.sleep(0.05)

    def Allocate(self, request: Any, context: Any) -> Any:
        return api_pb2.AllocateResponse(container_responses=[
            api_pb2.ContainerAllocateResponse()
            for _r in request.container_requests])

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        self.calls.append(list(request.devices_ids))
        if self.fail:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, 'no cap')
        return api_pb2.PreStartContainerResponse()


class PreStartTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix='ps')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.kubelet = kubelet_fixture.KubeletStandIn(self.dir).start()
        self.addCleanup(self.kubelet.stop)

    def register(self, servicer: _Plugin) -> kubelet_fixture.PluginEndpoint:
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)
        server.add_insecure_port('unix:' + os.path.join(self.dir, 'p.sock'))
        server.start()
        self.addCleanup(lambda: server.stop(None).wait(5))
        with grpc.insecure_channel('unix:' + self.kubelet.socket_path) as ch:
            api_pb2_grpc.RegistrationStub(ch).Register(
                api_pb2.RegisterRequest(version='v1beta1',
                                        endpoint='p.sock',
                                        resource_name='x.io/gpu'),
                timeout=5)
        return self.kubelet.wait_for_devices('x.io/gpu', count=2)

    def test_called_before_each_start_when_required(self) -> None:
        plugin = _Plugin(required=True)
        self.register(plugin)
        order: list[str] = []
        chosen, _response = self.kubelet.admit('x.io/gpu', 1)
        self.kubelet.start_container(
            'x.io/gpu', chosen, lambda: order.append(str(plugin.calls)))
        self.kubelet.start_container('x.io/gpu', chosen)   # a restart
        self.assertEqual([str([chosen])], order)
        self.assertEqual([chosen, chosen], plugin.calls)

    def test_never_called_when_not_required(self) -> None:
        plugin = _Plugin(required=False)
        self.register(plugin)
        chosen, _response = self.kubelet.admit('x.io/gpu', 1)
        started: list[bool] = []
        self.kubelet.start_container('x.io/gpu', chosen,
                                     lambda: started.append(True))
        self.assertEqual([True], started)
        self.assertEqual([], plugin.calls)

    def test_a_failed_prestart_starts_nothing(self) -> None:
        plugin = _Plugin(required=True, fail=True)
        self.register(plugin)
        chosen, _response = self.kubelet.admit('x.io/gpu', 1)
        started: list[bool] = []
        err = self.assertRaises(grpc.RpcError, self.kubelet.start_container,
                                'x.io/gpu', chosen,
                                lambda: started.append(True))
        self.assertEqual('no cap', err.details())
        self.assertEqual([], started)
