"""The kubelet device plugin for AMD GPUs (device plugin API v1beta1).

The plugin serves ``v1beta1.DevicePlugin`` on a unix socket in kubelet's
device plugin directory and registers its resource (``amd.com/gpu``) on
``kubelet.sock``. It offers ``share_count`` slots per GPU (see
:mod:`amdgpu_virt.k8s.node.devices`), with NUMA topology and health, and
sends a new list whenever health changes. A kubelet restart recreates
``kubelet.sock`` and removes plugin sockets: a watcher thread notices
either, serves a fresh socket and registers again.

Allocate works in one of two modes. Without a pod source, every device ID
names a distinct GPU, which the container gets whole, with ``/dev/kfd``,
its DRM nodes and the ROCr environment. With a pod source (pods scheduled
by the extender), the GPUs, CU ranges and memory come from the node's
allocation record, never from pod annotations (see
:mod:`amdgpu_virt.k8s.node.sharedserve`,
:mod:`amdgpu_virt.k8s.node.sharedpick` and
:mod:`amdgpu_virt.k8s.node.sharedalloc`). Kubelet calls Allocate per
container, in pod order, with device IDs that are not pods (an init
container's come again for the next container; a pod that ended on the
node frees its IDs for the next pod), so each call is decided by pod and
container: the live pod bound here that the record holds and the node
lock names by name and UID, and its next container not yet served, which
gets exactly its grants (``HSA_CU_MASK``, memory limits, the ``LD_AUDIT``
library). A record that over-commits a GPU is refused whole (fail
closed), and so is a late Allocate of a pod deleted or replaced
mid-allocation. What was served is checkpointed next to the plugin
socket before the answer leaves, so a kubelet retry of that container or
a plugin restart gets the same answer. The pod's HAMi annotations are
then written as a mirror, and the node lock is released after the pod's
last container with GPUs.

Where the node's kernel caps VRAM (the dmem cgroup controller, see
:mod:`amdgpu_virt.k8s.node.podcaps`), the plugin registers with
``PreStartRequired``: before kubelet starts a container, its
``PreStartContainer`` writes the VRAM caps of the container's pod on the
pod cgroup, and a failure fails the container's start.

With a role ledger (:mod:`amdgpu_virt.k8s.node.roles`, read again every
``[kubernetes] registration_interval`` seconds), the GPUs the ledger does
not give to Kubernetes on this node are listed unhealthy, so kubelet does
not hand them out, and Allocate refuses their device IDs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import grpc

from amdgpu_virt import exception
from amdgpu_virt import model
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import enforcement
from amdgpu_virt.k8s.node import health as node_health
from amdgpu_virt.k8s.node import podcaps
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.node import roles as noderoles
from amdgpu_virt.k8s.node import sharedserve
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2
from amdgpu_virt.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

API_VERSION = 'v1beta1'
KUBELET_SOCKET = 'kubelet.sock'
DEFAULT_PLUGIN_DIR = '/var/lib/kubelet/device-plugins/'

def _socket_identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


class _Servicer(api_pb2_grpc.DevicePluginServicer):

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: api_pb2.Empty,
                               context: grpc.ServicerContext
                               ) -> api_pb2.DevicePluginOptions:
        return self.plugin.options()

    def ListAndWatch(self, request: api_pb2.Empty,
                     context: grpc.ServicerContext
                     ) -> Iterator[api_pb2.ListAndWatchResponse]:
        plugin = self.plugin
        sent = -1
        while context.is_active() and not plugin.stopping.is_set():
            with plugin.cond:
                if plugin.version == sent:
                    plugin.cond.wait(0.5)
                    continue
                sent = plugin.version
                listed = plugin.device_list()
            yield api_pb2.ListAndWatchResponse(devices=[
                _to_proto(device) for device in listed])

    def GetPreferredAllocation(self,
                               request: api_pb2.PreferredAllocationRequest,
                               context: grpc.ServicerContext
                               ) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for req in request.container_requests:
            ids = self.plugin.index.preferred(
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs), req.allocation_size)
            responses.append(
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(
            container_responses=responses)

    def Allocate(self, request: api_pb2.AllocateRequest,
                 context: grpc.ServicerContext) -> api_pb2.AllocateResponse:
        responses = []
        for n, req in enumerate(request.container_requests):
            ids = list(req.devices_ids)
            try:
                allocation = self.plugin.allocate(
                    ids, 'container_requests[%d]' % n)
            except exception.AmdgpuVirtError as err:
                LOG.warning('Allocate %s refused: %s', ids, err)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            responses.append(_allocation_to_proto(allocation))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest,
                          context: grpc.ServicerContext
                          ) -> api_pb2.PreStartContainerResponse:
        ids = list(request.devices_ids)
        try:
            self.plugin.pre_start(ids)
        except exception.AmdgpuVirtError as err:
            LOG.warning('PreStartContainer %s refused: %s', ids, err)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return api_pb2.PreStartContainerResponse()


def _to_proto(device: devices.Device) -> api_pb2.Device:
    topology = None
    if device.numa_node is not None:
        topology = api_pb2.TopologyInfo(
            nodes=[api_pb2.NUMANode(ID=device.numa_node)])
    return api_pb2.Device(ID=device.id, health=device.health,
                          topology=topology)


def _allocation_to_proto(allocation: devices.ContainerAllocation
                         ) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        devices=[api_pb2.DeviceSpec(container_path=node.container_path,
                                    host_path=node.host_path,
                                    permissions=node.permissions)
                 for node in allocation.devices],
        mounts=[api_pb2.Mount(container_path=mount.container_path,
                              host_path=mount.host_path,
                              read_only=mount.read_only)
                for mount in allocation.mounts])


class DevicePlugin:
    """Serve, register, watch kubelet, report health.

    :param inventory: the node's GPUs.
    :param plugin_dir: kubelet's device plugin directory.
    :param socket_name: this plugin's socket file name in ``plugin_dir``.
    :param resource_name: the extended resource to register.
    :param share_count: slots per GPU.
    :param poll_interval: seconds between kubelet.sock and health checks.
    :param health: health check per unit; default: all healthy.
    :param gpus: PCI addresses of the GPUs to offer; None for all.
    :param pod_source: where HAMi pod annotations are read and written;
        None for whole-GPU allocation by device ID.
    :param cu_strategy: how free CUs are chosen for shared GPUs.
    :param library: the LD_AUDIT library given to shared containers.
    :param roles: the role ledger of the node; GPUs it does not give to
        Kubernetes are unhealthy. None: every GPU may be offered.
    :param caps: writes kernel VRAM caps in PreStartContainer (the plugin
        then registers with PreStartRequired); None: no kernel caps.
    """

    def __init__(self, inventory: model.HostInventory,
                 plugin_dir: str = DEFAULT_PLUGIN_DIR,
                 socket_name: str = 'amdgpu-virt.sock',
                 resource_name: str = hami.RESOURCE_GPU,
                 share_count: int = 10, poll_interval: float = 1.0,
                 health: node_health.HealthCheck | None = None,
                 gpus: Sequence[str] | None = None,
                 pod_source: podsource.PodSource | None = None,
                 cu_strategy: allocator.CuStrategy | None = None,
                 library: str = hami.LD_AUDIT_LIBRARY,
                 roles: noderoles.NodeRoles | None = None,
                 caps: podcaps.PodCaps | None = None) -> None:
        if share_count < 1:
            raise exception.ConfigError(
                option='[kubernetes] share_count',
                reason='must be at least 1, got %d' % share_count)
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name
        self.socket_path = os.path.join(plugin_dir, socket_name)
        self.kubelet_socket = os.path.join(plugin_dir, KUBELET_SOCKET)
        self.resource_name = resource_name
        self.share_count = share_count
        self.poll_interval = poll_interval
        self.health_check = health or (lambda unit: True)
        self.units = devices.units_from_inventory(inventory, gpus)
        self.index = devices.DeviceIndex(self.units, share_count,
                                         resource_name)
        self.pod_source = pod_source
        self.cu_strategy = cu_strategy
        self.library = library
        self.roles = roles
        self.caps = caps if pod_source is not None else None
        self._shared = None if pod_source is None else \
            sharedserve.SharedServer(
                pod_source, self.units, share_count, library,
                self.socket_path + '.served.json', resource_name)
        self.cond = threading.Condition()
        #: bumped whenever the device list changes
        self.version = 0
        self.healthy: dict[str, bool] = {}
        #: successful registrations with kubelet (for observability)
        self.registrations = 0
        self.stopping = threading.Event()
        self._server: grpc.Server | None = None
        self._kubelet_identity: tuple[int, int, int] | None = None
        self._registered = False
        self._watcher: threading.Thread | None = None

    def options(self) -> api_pb2.DevicePluginOptions:
        """PreStartRequired exactly when the plugin writes kernel caps."""
        return api_pb2.DevicePluginOptions(
            pre_start_required=self.caps is not None,
            get_preferred_allocation_available=True)

    def pre_start(self, device_ids: Sequence[str]) -> None:
        """Before a container of ``device_ids`` starts: its pod's kernel
        VRAM caps, in place (nothing to do without kernel caps).

        :raises DevicePluginError, CgroupError: naming the device IDs,
            the pod or the cgroup file at fault.
        """
        if self.caps is None or self._shared is None:
            return
        self.caps.apply(device_ids, self._shared)

    # device list
    def device_list(self) -> list[devices.Device]:
        return devices.list_devices(self.units, self.share_count,
                                    self.healthy)

    def check_health(self) -> bool:
        """Re-check every unit; :returns: True if anything changed.

        A unit of a GPU the role ledger withdrew is unhealthy.
        """
        allowed = self.roles.current() if self.roles is not None else None
        healthy = {}
        for unit in self.units:
            if self.roles is not None and not self.roles.offers(
                    unit.gpu_address, allowed):
                healthy[unit.uuid] = False
                continue
            try:
                healthy[unit.uuid] = bool(self.health_check(unit))
            except Exception:  # a failing check is not a healthy GPU
                LOG.exception('Health check of GPU %s failed', unit.rocr_id)
                healthy[unit.uuid] = False
        with self.cond:
            if healthy == self.healthy:
                return False
            for unit in self.units:
                if self.healthy and healthy[unit.uuid] != self.healthy.get(
                        unit.uuid):
                    LOG.warning('GPU %s (%s) is now %s', unit.rocr_id,
                                unit.gpu_address, 'healthy'
                                if healthy[unit.uuid] else 'unhealthy')
            self.healthy = healthy
            self.version += 1
            self.cond.notify_all()
            return True

    def allocate(self, device_ids: Sequence[str],
                 request: str) -> devices.ContainerAllocation:
        """The allocation for one container's device IDs.

        :raises UnknownDevice, DevicePluginError, AnnotationError,
            SharingError, KubernetesError: naming the request, pod or
            annotation at fault.
        """
        self._check_offered(device_ids, request)
        if self._shared is None:
            allocation = self.index.whole_gpus(device_ids, request)
        else:
            allocation = self._shared.allocate(device_ids, request)
        LOG.info('Allocated %s for %s: %s', self.resource_name, request,
                 dict(allocation.envs).get('ROCR_VISIBLE_DEVICES'))
        return allocation

    def _check_offered(self, device_ids: Sequence[str],
                       request: str) -> None:
        """Refuse devices of GPUs the role ledger withdrew.

        :raises DevicePluginError: naming the device and its GPU.
        """
        if self.roles is None:
            return
        for device_id in device_ids:
            unit, _slot = self.index.resolve(device_id, request)
            if not self.roles.offers(unit.gpu_address):
                raise exception.DevicePluginError(
                    resource=self.resource_name,
                    reason='%s: device %s is on GPU %s, which the role '
                    'ledger (%s) does not give to Kubernetes on %s' % (
                        request, device_id, unit.gpu_address,
                        self.roles.source, self.roles.host))

    # lifecycle
    def start(self) -> DevicePlugin:
        """Serve the socket, register, and start watching kubelet."""
        self.stopping.clear()
        self.check_health()
        if self.caps is not None:
            self.caps.prepare()
        self._serve()
        self._try_register()
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name='deviceplugin-watch')
        self._watcher.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket (clean shutdown)."""
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
            self._watcher = None
        self._shutdown_server()
        LOG.info('Device plugin for %s stopped', self.resource_name)

    def _serve(self) -> None:
        self._shutdown_server()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix='deviceplugin'))
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self),
                                                        server)
        if not server.add_insecure_port('unix:' + self.socket_path):
            raise exception.DevicePluginError(
                resource=self.resource_name,
                reason='cannot listen on %s' % self.socket_path)
        server.start()
        self._server = server
        self._registered = False
        LOG.info('Device plugin for %s serving on %s (%d GPUs, %d slots '
                 'each)', self.resource_name, self.socket_path,
                 len(self.units), self.share_count)

    def _shutdown_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)

    def _try_register(self) -> bool:
        identity = _socket_identity(self.kubelet_socket)
        if identity is None:
            LOG.debug('%s does not exist yet', self.kubelet_socket)
            return False
        request = api_pb2.RegisterRequest(
            version=API_VERSION, endpoint=self.socket_name,
            resource_name=self.resource_name,
            options=self.options())
        try:
            with grpc.insecure_channel('unix:' + self.kubelet_socket) as ch:
                api_pb2_grpc.RegistrationStub(ch).Register(request,
                                                           timeout=5)
        except grpc.RpcError as err:
            LOG.warning('Registering %s with kubelet at %s failed: %s',
                        self.resource_name, self.kubelet_socket, err)
            return False
        self._kubelet_identity = identity
        self._registered = True
        self.registrations += 1
        LOG.info('Registered %s with kubelet (%s)', self.resource_name,
                 self.socket_name)
        return True

    def _watch(self) -> None:
        while not self.stopping.wait(self.poll_interval):
            try:
                self._watch_once()
            except Exception:  # keep watching whatever happened
                LOG.exception('Device plugin watch loop failed')

    def _watch_once(self) -> None:
        self.check_health()
        identity = _socket_identity(self.kubelet_socket)
        own = os.path.exists(self.socket_path)
        if identity is None:
            if self._registered:
                LOG.warning('%s is gone: kubelet stopped; waiting for it',
                            self.kubelet_socket)
                self._registered = False
            if not own:
                self._serve()
            return
        if not own or identity != self._kubelet_identity:
            LOG.info('kubelet restarted (%s recreated); registering %s '
                     'again', self.kubelet_socket, self.resource_name)
            if not own or self._registered:
                self._serve()
        if not self._registered:
            self._try_register()


def from_conf(conf: Any, inventory: model.HostInventory,
              pod_source: podsource.PodSource | None = None
              ) -> DevicePlugin:
    """A device plugin configured by the ``[kubernetes]`` options.

    In ``hami`` allocation mode without ``pod_source``, pods are read
    through the API (``[kubernetes] kubeconfig``, ``node_name``). With
    ``[kubernetes] ledger_source``, only the GPUs of the role ledger are
    offered.

    :raises ConfigError: naming the option at fault.
    :raises DriverNotFound: an unknown ``[sharing] cu_strategy``.
    """
    group = conf.kubernetes
    if group.allocation_mode == 'hami' and pod_source is None:
        from amdgpu_virt.k8s.api import client as k8s_client
        pod_source = podsource.KubernetesPodSource(
            k8s_client.node_name(conf), k8s_client.core_api(conf),
            group.namespace)
    elif group.allocation_mode == 'whole':
        pod_source = None
    roles = noderoles.from_conf(
        conf, pod_source.node_name if pod_source is not None else None,
        getattr(pod_source, 'api', None))
    units = devices.units_from_inventory(inventory)
    share_count, judged = enforcement.share_count(
        conf, {u.gpu_address for u in units})
    caps = None
    if judged is not None and judged.kernel and share_count > 1 and \
            judged.dmem is not None:
        caps = podcaps.PodCaps(
            cgroups.CgroupFs(group.cgroup_root), judged.dmem, units,
            cgroups.driver_setting(group.cgroup_driver),
            cgroups.kubelet_root_parts(group.kubelet_cgroup_root))
    return DevicePlugin(
        inventory, plugin_dir=group.device_plugin_dir,
        socket_name=group.device_plugin_socket,
        resource_name=group.resource_name,
        share_count=share_count,
        poll_interval=group.kubelet_poll_interval,
        health=node_health.monitor_from_conf(
            conf, devices.units_from_inventory(inventory)),
        pod_source=pod_source,
        cu_strategy=allocator.load_strategy(conf.sharing.cu_strategy),
        library=group.vgpu_library, roles=roles, caps=caps)
