"""Device health for kubelet (DRA resource health, v1alpha1 and v1).

kubelet opens ``NodeWatchResources`` once and keeps the stream; every
message must list every device of the driver (a device left out becomes
Unknown after its timeout). A device is healthy when every ROCr unit it
stands for passes the node's health check (the device plugin's:
:class:`amdgpu_virt.k8s.node.health.HealthMonitor`); the message of an
unhealthy one says why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.node import devices as unit_devices
from amdgpu_virt.k8s.node import health as node_health
from amdgpu_virt.k8s.proto.drahealth.v1 import api_pb2 as v1_pb2
from amdgpu_virt.k8s.proto.drahealth.v1 import api_pb2_grpc as v1_grpc
from amdgpu_virt.k8s.proto.drahealth.v1alpha1 import api_pb2 as v1a1_pb2
from amdgpu_virt.k8s.proto.drahealth.v1alpha1 import (
    api_pb2_grpc as v1a1_grpc)

LOG = logging.getLogger(__name__)

HealthCheck = Callable[[unit_devices.GpuUnit], bool]


def device_health(plan: dra_devices.DevicePlan,
                  units: Sequence[unit_devices.GpuUnit],
                  check: HealthCheck) -> tuple[tuple[str, bool, str], ...]:
    """(device name, healthy, message) of every published device; the
    message says why (the check's reason) when it is unhealthy."""
    by_key = {(u.gpu_address, u.partition): u for u in units}
    out = []
    for device in plan.devices:
        bad = []
        why = ''
        for part in device.partitions:
            unit = by_key.get((str(device.gpu.address), part))
            try:
                healthy = unit is not None and bool(check(unit))
            except Exception:  # a failing check is not a healthy GPU
                LOG.exception('Health check of %s failed', device.name)
                healthy = False
            if not healthy:
                bad.append(part)
                if not why and unit is not None:
                    why = node_health.reason_of(check, unit)
        message = '' if not bad else (
            'GPU %s partition(s) %s: %s' % (
                device.gpu.address, ', '.join(str(p) for p in bad),
                why or 'device nodes missing or check failed'))
        out.append((device.name, not bad, message[:1024]))
    return tuple(out)


class HealthBoard:
    """The latest health of every device, and a condition to wait on."""

    def __init__(self, timeout_seconds: int = 90) -> None:
        self.timeout_seconds = timeout_seconds
        self.cond = threading.Condition()
        self.version = 0
        self.pool = ''
        self.entries: tuple[tuple[str, bool, str], ...] = ()
        self.updated = 0
        self.stopping = threading.Event()

    def update(self, pool: str,
               entries: tuple[tuple[str, bool, str], ...]) -> bool:
        with self.cond:
            self.updated = int(time.time())
            if (pool, entries) == (self.pool, self.entries):
                return False
            self.pool, self.entries = pool, entries
            self.version += 1
            self.cond.notify_all()
            return True

    def stop(self) -> None:
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()

    def stream(self, pb2: Any, context: grpc.ServicerContext,
               resend: float) -> Iterator[Any]:
        """Responses: now, on every change, and every ``resend`` s."""
        sent = -1
        last = 0.0
        while context.is_active() and not self.stopping.is_set():
            with self.cond:
                if self.version == sent and time.monotonic() - last < resend:
                    self.cond.wait(min(resend, 0.5))
                    continue
                sent = self.version
                last = time.monotonic()
                pool, entries, stamp = self.pool, self.entries, self.updated
            yield pb2.NodeWatchResourcesResponse(devices=[
                pb2.DeviceHealth(
                    device=pb2.DeviceIdentifier(pool_name=pool,
                                                device_name=name),
                    health=pb2.HEALTHY if healthy else pb2.UNHEALTHY,
                    last_updated_time=stamp,
                    health_check_timeout_seconds=self.timeout_seconds,
                    message=message)
                for name, healthy, message in entries])


class HealthV1Alpha1(v1a1_grpc.DRAResourceHealthServicer):

    def __init__(self, board: HealthBoard, resend: float) -> None:
        self.board, self.resend = board, resend

    def NodeWatchResources(self, request: Any, context: Any
                           ) -> Iterator[Any]:
        return self.board.stream(v1a1_pb2, context, self.resend)


class HealthV1(v1_grpc.DRAResourceHealthServicer):

    def __init__(self, board: HealthBoard, resend: float) -> None:
        self.board, self.resend = board, resend

    def NodeWatchResources(self, request: Any, context: Any
                           ) -> Iterator[Any]:
        return self.board.stream(v1_pb2, context, self.resend)


def add_to_server(server: grpc.Server, board: HealthBoard,
                  resend: float) -> None:
    v1a1_grpc.add_DRAResourceHealthServicer_to_server(
        HealthV1Alpha1(board, resend), server)
    v1_grpc.add_DRAResourceHealthServicer_to_server(
        HealthV1(board, resend), server)
