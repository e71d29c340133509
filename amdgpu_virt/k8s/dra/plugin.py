"""The DRA kubelet plugin: registration, DRA service, health, slices.

Start-up order matters (kubelet's GetInfo has a 1 s timeout and is not
retried soon): the state file is read (a bad one stops the plugin), the
DRA socket is served (``DRAPlugin`` v1 and v1beta1 plus
``DRAResourceHealth`` v1alpha1 and v1 on one socket in ``plugin_dir``),
and only then is the registration socket created in kubelet's
``plugins_registry``. ``GetInfo`` answers type ``DRAPlugin``, the driver
name, the DRA socket's absolute path and the services served.

NodePrepareResources reads each claim from the API, keeps the results of
this driver, chooses CUs for shares, records the claim in the state file
(atomically) and writes its CDI spec; a claim already prepared is
answered from the state file and its CDI spec written again (kubelet
calls prepare again after its own restart or a reboot, which empties
``/var/run/cdi``). NodeUnprepareResources forgets the claim and removes
its spec; an unknown claim unprepares successfully. Both are serialised
(a thread lock and a file lock beside the state file).

A background loop re-reads the role ledger and the health of the GPUs
every ``[dra] publish_interval`` seconds, republishes the node's
ResourceSlices when what it offers changed (what it offers depends on
what the API server keeps, see :mod:`.publish`, and an unhealthy device
is not offered: it leaves the slices, and a claim not prepared yet that
names it is refused; claims are prepared against what was published),
sends health to kubelet (every device, the unhealthy ones included, with
why), and serves the sockets again when one was removed. One refresh runs
at a time
(a lock of its own), so a refresh called while the loop's runs waits for
it and the two never publish at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import model
from amdgpu_virt.k8s.dra import cdi
from amdgpu_virt.k8s.dra import claims as dra_claims
from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.dra import health as dra_health
from amdgpu_virt.k8s.dra import prepare as dra_prepare
from amdgpu_virt.k8s.dra import publish as dra_publish
from amdgpu_virt.k8s.dra import served as dra_served
from amdgpu_virt.k8s.dra import state as dra_state
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import devices as unit_devices
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.k8s.node import enforcement as node_enforcement
from amdgpu_virt.k8s.node import health as node_health
from amdgpu_virt.k8s.node import memhook
from amdgpu_virt.k8s.node import roles as noderoles
from amdgpu_virt.k8s.proto.dra.v1 import api_pb2 as v1_pb2
from amdgpu_virt.k8s.proto.dra.v1 import api_pb2_grpc as v1_grpc
from amdgpu_virt.k8s.proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from amdgpu_virt.k8s.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from amdgpu_virt.k8s.proto.pluginregistration.v1 import api_pb2 as reg_pb2
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.k8s.proto.pluginregistration.v1 import (
    api_pb2_grpc as reg_grpc)
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

PLUGIN_TYPE = 'DRAPlugin'
SUPPORTED_VERSIONS = ('v1.DRAPlugin', 'v1beta1.DRAPlugin',
                      'v1alpha1.DRAResourceHealth', 'v1.DRAResourceHealth')
DEFAULT_REGISTRATION_DIR = '/var/lib/kubelet/plugins_registry'
DEFAULT_PLUGINS_DIR = '/var/lib/kubelet/plugins'

#: (namespace, name) -> the ResourceClaim as the API serves it
ClaimReader = Callable[[str, str], Mapping[str, Any]]


def socket_names(driver: str, pod_uid: str = '') -> tuple[str, str]:
    """(DRA socket file name, registration socket file name)."""
    if pod_uid:
        return 'dra-%s.sock' % pod_uid, '%s-%s-reg.sock' % (driver, pod_uid)
    return 'dra.sock', '%s-reg.sock' % driver


class _Registration(reg_grpc.RegistrationServicer):

    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=self.plugin.driver,
            endpoint=self.plugin.dra_socket,
            supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        plugin = self.plugin
        plugin.registered = bool(request.plugin_registered)
        plugin.registration_error = request.error
        if request.plugin_registered:
            LOG.info('kubelet registered DRA driver %s', plugin.driver)
        else:
            LOG.error('kubelet refused DRA driver %s: %s', plugin.driver,
                      request.error)
        return reg_pb2.RegistrationStatusResponse()


def _dra_servicer(pb2: Any, base: type, with_share_id: bool) -> Any:

    class Servicer(base):

        def __init__(self, plugin: DraPlugin) -> None:
            self.plugin = plugin

        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            response = pb2.NodePrepareResourcesResponse()
            for claim in request.claims:
                entry = response.claims[claim.uid]
                try:
                    prepared = self.plugin.prepare(claim.namespace,
                                                   claim.name, claim.uid)
                except Exception as err:  # each claim fails on its own
                    LOG.warning('Prepare of claim %s/%s (%s) failed: %s',
                                claim.namespace, claim.name, claim.uid, err)
                    entry.error = str(err)
                    continue
                ids = cdi.device_ids(self.plugin.driver, claim.uid,
                                     prepared)
                for device, cdi_ids in zip(prepared.devices, ids,
                                           strict=True):
                    fields = dict(
                        request_names=[device.request.split('/', 1)[0]],
                        pool_name=device.pool, device_name=device.device,
                        cdi_device_ids=cdi_ids)
                    if with_share_id and device.share_id:
                        fields['share_id'] = device.share_id
                    entry.devices.append(pb2.Device(**fields))
            return response

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            response = pb2.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                entry = response.claims[claim.uid]
                try:
                    self.plugin.unprepare(claim.uid)
                except Exception as err:  # each claim fails on its own
                    LOG.warning('Unprepare of claim %s failed: %s',
                                claim.uid, err)
                    entry.error = str(err)
            return response

    return Servicer


_V1 = _dra_servicer(v1_pb2, v1_grpc.DRAPluginServicer, True)
_V1BETA1 = _dra_servicer(v1beta1_pb2, v1beta1_grpc.DRAPluginServicer, False)


class _Reading:
    """One reading of every unit's health: a health check (which may keep
    rates and read files) is asked once per unit and refresh, whatever
    layouts are planned from it."""

    def __init__(self, check: node_health.HealthCheck,
                 units: Sequence[unit_devices.GpuUnit]) -> None:
        self.verdicts: dict[tuple[str, int], tuple[bool, str]] = {}
        for unit in units:
            try:
                healthy = bool(check(unit))
            except Exception:  # a failing check is not a healthy GPU
                LOG.exception('Health check of GPU %s failed', unit.rocr_id)
                healthy = False
            self.verdicts[(unit.gpu_address, unit.partition)] = (
                healthy, '' if healthy else node_health.reason_of(check,
                                                                  unit))

    def __call__(self, unit: unit_devices.GpuUnit) -> bool:
        return self.verdicts.get((unit.gpu_address, unit.partition),
                                 (False, ''))[0]

    def reason(self, unit: unit_devices.GpuUnit) -> str:
        return self.verdicts.get((unit.gpu_address, unit.partition),
                                 (False, ''))[1]


def _healthy(whole: dra_devices.DevicePlan,
             units: Sequence[unit_devices.GpuUnit], health: _Reading
             ) -> tuple[dra_devices.DevicePlan,
                        tuple[tuple[str, bool, str], ...]]:
    """``whole`` less its unhealthy devices, and every device's health
    (name, healthy, why) for kubelet."""
    entries = dra_health.device_health(whole, units, health)
    return dra_devices.without(whole, (name for name, healthy, _why in
                                       entries if not healthy)), entries


class DraPlugin:
    """The DRA plugin of one node.

    :param inventory: the node's GPUs.
    :param node: the node name (also the pool name).
    :param claim_reader: reads a ResourceClaim from the API.
    :param publisher: writes the node's ResourceSlices; None: do not
        publish (slices are published by someone else).
    :param ledger_source: where the role ledger is read; None: no ledger,
        every amdgpu-driven GPU is offered whole.
    :param health: health check per ROCr unit; default: all healthy.
    :param pcie_roots: PCI address -> PCIe root complex of the GPUs (the
        ``resource.kubernetes.io/pcieRoot`` attribute).
    :param enforcement: each GPU's memory enforcement level (published as
        the ``memoryEnforcement`` attribute) and the requirement a GPU
        must meet to publish shares; None: neither.
    :param dmem_hook: the CDI ``createRuntime`` hook that caps shares of
        the GPUs at a kernel level; None: no kernel caps.
    """

    def __init__(self, inventory: model.HostInventory, node: str,
                 claim_reader: ClaimReader, *,
                 driver: str = 'gpu.amd.com',
                 registration_dir: str = DEFAULT_REGISTRATION_DIR,
                 plugin_dir: str = '', pod_uid: str = '',
                 cdi_dir: str = '/var/run/cdi', state_file: str = '',
                 numbers: cdi.DeviceNumbers | None = None,
                 publisher: dra_publish.Publisher | None = None,
                 ledger_source: noderoles.LedgerSource | None = None,
                 partition_devices: bool = True,
                 without_counters: str = dra_devices.WHOLE,
                 memory_step_mib: int = 256,
                 strategy: allocator.CuStrategy | None = None,
                 library: str = hami.LD_AUDIT_LIBRARY,
                 health: dra_health.HealthCheck | None = None,
                 health_timeout: int = 90,
                 interval: float = 30.0,
                 pcie_roots: Mapping[model.PciAddress, str] | None = None,
                 enforcement: node_enforcement.NodeEnforcement | None = None,
                 dmem_hook: cdi.DmemHook | None = None) -> None:
        self.inventory = inventory
        self.node = node
        self.claim_reader = claim_reader
        self.driver = driver
        plugin_dir = plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, driver)
        self.plugin_dir = os.path.abspath(plugin_dir)
        self.registration_dir = os.path.abspath(registration_dir)
        dra_name, reg_name = socket_names(driver, pod_uid)
        self.dra_socket = os.path.join(self.plugin_dir, dra_name)
        self.registration_socket = os.path.join(self.registration_dir,
                                                reg_name)
        self.cdi_dir = cdi_dir
        self.state = dra_state.StateFile(
            state_file or os.path.join(self.plugin_dir, 'state.json'))
        self.numbers = numbers or cdi.sysfs_numbers('/sys')
        self.publisher = publisher
        self.ledger_source = ledger_source
        self.partition_devices = partition_devices
        self.without_counters = without_counters
        self.pcie_roots = dict(pcie_roots or {})
        self.memory_step_mib = memory_step_mib
        self.strategy = strategy
        self.library = library
        self.health_check = health or (lambda unit: True)
        self.board = dra_health.HealthBoard(health_timeout)
        self.interval = interval
        self.units = unit_devices.units_from_inventory(inventory)
        self.enforcement = enforcement
        self.dmem_hook = dmem_hook
        #: GPUs whose shares get the kernel cap (a hook and a kernel level)
        self.kernel_gpus = frozenset(
            address for address, level in enforcement.levels.items()
            if level.kernel) if enforcement is not None and \
            dmem_hook is not None else frozenset()
        self.assignments: tuple[av_ledger.GpuAssignment, ...] | None = (
            None if ledger_source is None else ())
        self.plan = self._plan()
        self.registered = False
        self.registration_error = ''
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        #: held by :meth:`refresh`
        self._refreshing = threading.Lock()
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None
        self._loop: threading.Thread | None = None

    # what the node offers ---------------------------------------------------
    def _plan(self, served: dra_served.Served | None = None
              ) -> dra_devices.DevicePlan:
        """The devices offered on an API server that keeps ``served``
        (None: what the publisher learnt last, or everything), with their
        memory enforcement, without shares below its requirement."""
        if served is None:
            served = (self.publisher.served if self.publisher is not None
                      else None) or dra_served.FULL
        plan = dra_devices.plan(self.node, self.inventory, self.assignments,
                                partition_devices=self.partition_devices,
                                pcie_roots=self.pcie_roots, served=served,
                                without_counters=self.without_counters)
        judged = self.enforcement
        if judged is None:
            return plan
        plan, dropped = dra_devices.with_enforcement(
            plan, judged.levels, judged.requirement)
        if dropped:
            LOG.warning('Not publishing shares %s: %s', ', '.join(dropped),
                        judged.refusal())
        return plan

    def _use(self, whole: dra_devices.DevicePlan, health: _Reading,
             published: dra_devices.DevicePlan | None = None) -> None:
        """Prepare against ``published`` (else ``whole`` less its unhealthy
        devices) and tell kubelet the health of every device of
        ``whole``, the unhealthy ones included."""
        plan, entries = _healthy(whole, self.units, health)
        with self._lock:
            self.plan = published if published is not None else plan
        self.board.update(self.node, entries)

    def read_ledger(self) -> None:
        """Read the role ledger; keep the last good one when it fails."""
        if self.ledger_source is None:
            return
        try:
            ledger = self.ledger_source.read()
        except Exception as err:  # keep the last good ledger
            LOG.warning('%s is unusable: %s; node %s keeps the last good '
                        'ledger', self.ledger_source, err, self.node)
            return
        if ledger is None:
            LOG.warning('%s does not exist; node %s keeps the last good '
                        'ledger', self.ledger_source, self.node)
            return
        self.assignments = ledgermap.host_roles(ledger, self.node)

    def refresh(self) -> bool:
        """Ledger, slices and health, once; one refresh at a time (a call
        while the plugin's loop refreshes waits for it, so that two never
        publish at once: the publisher rewrites the node's slices from
        what it read).

        :returns: True if the slices were rewritten.
        :raises KubernetesError, DraPluginError: publishing failed.
        """
        with self._refreshing:
            self.read_ledger()
            # the units' health is read once a refresh, for every layout
            health = _Reading(self.health_check, self.units)
            # a ledger change reaches prepare even when publishing fails
            self._use(self._plan(), health)
            if self.publisher is None:
                return False
            changed = self.publisher.publish(
                lambda served: _healthy(self._plan(served), self.units,
                                        health)[0],
                self.memory_step_mib)
            if self.publisher.plan is not None:
                # the layout the API server keeps, as just learnt
                self._use(self._plan(), health, self.publisher.plan)
            return changed

    # prepare / unprepare ----------------------------------------------------
    def prepare(self, namespace: str, name: str,
                uid: str) -> dra_state.PreparedClaim:
        """Prepare one claim (idempotent).

        :raises AmdgpuVirtError: naming the claim and the culprit.
        """
        dra_claims.check_uid(uid)
        with self._lock, self.state.locked():
            claims = self.state.load()
            prepared = claims.get(uid)
            if prepared is None:
                obj = self.claim_reader(namespace, name)
                results = dra_claims.results(obj, uid, self.driver,
                                             self.plan)
                prepared = dra_prepare.prepare(
                    uid, namespace, name, results, self.units, claims,
                    self.strategy)
                claims = dict(claims)
                claims[uid] = prepared
                self.state.save(claims)
                LOG.info('Prepared claim %s/%s (%s): %s', namespace, name,
                         uid, ', '.join(d.device for d in prepared.devices))
            edits = dra_prepare.container_edits(prepared, self.units,
                                                self.library,
                                                self.kernel_gpus)
            cdi.write(self.cdi_dir, self.driver, uid,
                      cdi.spec(self.driver, uid, prepared, edits,
                               self.numbers, self.dmem_hook))
            return prepared

    def unprepare(self, uid: str) -> None:
        """Release one claim; an unknown claim is already released.

        :raises DraClaimError: a UID that cannot name a file.
        """
        dra_claims.check_uid(uid)
        with self._lock, self.state.locked():
            claims = self.state.load()
            if uid in claims:
                claims = dict(claims)
                del claims[uid]
                self.state.save(claims)
                LOG.info('Unprepared claim %s', uid)
            cdi.remove(self.cdi_dir, self.driver, uid)

    # lifecycle ---------------------------------------------------------------
    def start(self) -> DraPlugin:
        """Check the state, serve, register, publish, start the loop.

        :raises DraStateError: the state file is unusable.
        """
        self.stopping.clear()
        self.state.load()
        try:
            self.refresh()
        except exception.AmdgpuVirtError as err:
            LOG.error('Publishing the ResourceSlices of %s failed: %s',
                      self.node, err)
        self._serve()
        self._loop = threading.Thread(target=self._run, daemon=True,
                                      name='dra-plugin')
        self._loop.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove both sockets."""
        self.stopping.set()
        self.board.stop()
        if self._loop is not None:
            self._loop.join(timeout=10)
            self._loop = None
        self._shutdown()
        LOG.info('DRA plugin %s stopped', self.driver)

    def _serve(self) -> None:
        self._shutdown()
        os.makedirs(self.plugin_dir, exist_ok=True)
        os.makedirs(self.registration_dir, exist_ok=True)
        for path in (self.dra_socket, self.registration_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        dra = grpc.server(concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix='dra'))
        v1_grpc.add_DRAPluginServicer_to_server(_V1(self), dra)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_V1BETA1(self), dra)
        dra_health.add_to_server(dra, self.board, self.interval)
        self._listen(dra, self.dra_socket)
        self._dra_server = dra
        # only now may kubelet find us
        reg = grpc.server(concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix='dra-reg'))
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), reg)
        self._listen(reg, self.registration_socket)
        self._reg_server = reg
        LOG.info('DRA driver %s serving on %s, registering at %s',
                 self.driver, self.dra_socket, self.registration_socket)

    def _listen(self, server: grpc.Server, path: str) -> None:
        if not server.add_insecure_port('unix:' + path):
            raise exception.DraPluginError(driver=self.driver,
                                           reason='cannot listen on %s'
                                           % path)
        server.start()

    def _shutdown(self) -> None:
        for server, path in ((self._reg_server, self.registration_socket),
                             (self._dra_server, self.dra_socket)):
            if server is not None:
                server.stop(grace=1).wait(5)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._reg_server = self._dra_server = None

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.watch_once()
            except Exception:  # keep going whatever happened
                LOG.exception('DRA plugin loop failed')

    def watch_once(self) -> None:
        if not (os.path.exists(self.dra_socket)
                and os.path.exists(self.registration_socket)):
            LOG.warning('A socket of DRA driver %s was removed; serving '
                        'again', self.driver)
            self._serve()
        self.refresh()


def from_conf(conf: Any, inventory: model.HostInventory) -> DraPlugin:
    """The plugin configured by ``[dra]``, ``[kubernetes]``, ``[pool]``,
    ``[inventory]`` and ``[sharing]`` (the ``kubelet`` plugin of the
    ``amdgpu_virt.k8s.dra`` namespace).

    :raises ConfigError: naming the option at fault.
    """
    from kubernetes import client as k8s

    from amdgpu_virt.inventory import sysfs
    from amdgpu_virt.k8s.api import client as k8s_client

    group = conf.dra
    node = k8s_client.node_name(conf)
    api_client = k8s_client.api_client(conf.kubernetes.kubeconfig)
    resource_api = k8s.ResourceV1Api(api_client)

    def read_claim(namespace: str, name: str) -> Mapping[str, Any]:
        what = 'get resourceclaim %s/%s' % (namespace, name)
        data: Mapping[str, Any] = k8s_client.json_body(what, k8s_client.call(
            what, resource_api.read_namespaced_resource_claim, name,
            namespace, _preload_content=False, _request_timeout=30))
        return data

    roles = noderoles.from_conf(conf, node, k8s.CoreV1Api(api_client))
    hook = None
    if group.dmem_hook:
        hook = cdi.DmemHook(group.dmem_hook, group.dmem_hook_root)
        kernel = dmem.probe(cgroups.CgroupFs(conf.kubernetes.cgroup_root))
    else:
        kernel = dmem.NodeDmem(False, '[dra] dmem_hook is not set, so no '
                               'createRuntime hook caps the shares')
    judged = node_enforcement.assess(
        node_enforcement.Requirement(conf.kubernetes.memory_enforcement),
        (str(g.address) for g in inventory.gpus), kernel,
        memhook.check(conf.kubernetes.vgpu_library))
    return DraPlugin(
        inventory, node, read_claim, driver=group.driver_name,
        registration_dir=group.registration_dir,
        plugin_dir=group.plugin_dir, pod_uid=group.pod_uid,
        cdi_dir=group.cdi_dir, state_file=group.state_file,
        numbers=cdi.sysfs_numbers(conf.inventory.sysfs_root),
        publisher=dra_publish.Publisher(
            resource_api, node, group.driver_name, group.slice_layout,
            dra_publish.version_reader(api_client),
            probe_interval=group.probe_interval),
        ledger_source=roles.source if roles is not None else None,
        partition_devices=group.partition_devices,
        without_counters=group.partitions_without_counters,
        memory_step_mib=group.memory_step_mib,
        strategy=allocator.load_strategy(conf.sharing.cu_strategy),
        library=conf.kubernetes.vgpu_library,
        health=node_health.monitor_from_conf(
            conf, unit_devices.units_from_inventory(inventory)),
        health_timeout=group.health_timeout,
        interval=group.publish_interval,
        pcie_roots=sysfs.pcie_roots(conf.inventory.sysfs_root,
                                    (g.address for g in inventory.gpus)),
        enforcement=judged, dmem_hook=hook)
