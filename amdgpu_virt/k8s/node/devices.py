"""What the device plugin offers kubelet, and what a container gets.

Pure functions over a :class:`~amdgpu_virt.model.HostInventory`: no gRPC,
no file access, so that the choices are unit-tested directly.

A *unit* is what ROCr sees as one GPU: a bare-metal GPU in SPX mode, or
one compute partition (KFD node) of a partitioned GPU. Each unit offers
``share_count`` device plugin slots, with deterministic IDs
``<16 hex of the KFD unique_id>-<slot>``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterable
from collections.abc import Sequence

from amdgpu_virt import exception
from amdgpu_virt import model
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

HEALTHY = 'Healthy'
UNHEALTHY = 'Unhealthy'
KFD_PATH = '/dev/kfd'


@dataclasses.dataclass(frozen=True)
class GpuUnit:
    """One ROCr-visible GPU of the node."""

    #: position among the node's units (stable: PCI order, partition order)
    index: int
    #: 16 hex digits of the KFD unique_id
    uuid: str
    gpu_address: str
    partition: int
    card_minor: int
    render_minor: int
    compute_units: int
    vram_mib: int
    numa_node: int | None = None
    product_name: str = ''
    #: CUs a mask must enable together (2 on RDNA, 1 on CDNA)
    cu_unit: int = 1

    @property
    def rocr_id(self) -> str:
        """The id ROCR_VISIBLE_DEVICES accepts (not the AMD SMI UUID)."""
        return 'GPU-%s' % self.uuid

    @property
    def card_path(self) -> str:
        return '/dev/dri/card%d' % self.card_minor

    @property
    def render_path(self) -> str:
        return '/dev/dri/renderD%d' % self.render_minor

    def device_id(self, slot: int) -> str:
        return '%s-%d' % (self.uuid, slot)

    @property
    def device_type(self) -> str:
        """The ``type`` the unit registers (HAMi's scheduler only takes
        devices with "amd" in it)."""
        product = self.product_name or 'AMD Instinct GPU'
        if hami.AMD_TYPE_WORD not in product.lower():
            product = 'AMD %s' % product
        return product


@dataclasses.dataclass(frozen=True)
class Device:
    """One device plugin device (a slot of a unit)."""

    id: str
    health: str
    numa_node: int | None


@dataclasses.dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = 'rw'


@dataclasses.dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclasses.dataclass(frozen=True)
class ContainerAllocation:
    """What one container gets from Allocate."""

    envs: tuple[tuple[str, str], ...]
    devices: tuple[DeviceNode, ...]
    mounts: tuple[MountSpec, ...] = ()


def units_from_inventory(inventory: model.HostInventory,
                         gpus: Iterable[str] | None = None
                         ) -> tuple[GpuUnit, ...]:
    """The units of the node's amdgpu-driven GPUs, in PCI order.

    :param gpus: PCI addresses of the GPUs Kubernetes may use (their ledger
        role is k8s-*); None for all amdgpu-driven GPUs.
    """
    wanted = None if gpus is None else {
        str(model.PciAddress.parse(g)) for g in gpus}
    units: list[GpuUnit] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        if gpu.driver is not model.Driver.AMDGPU:
            continue
        if wanted is not None and gpu.id not in wanted:
            continue
        for part in gpu.partitions:
            if part.unique_id is None or part.card_minor is None or \
                    part.render_minor is None:
                LOG.warning('GPU %s partition %d has no unique_id or DRM '
                            'minor; not offered to kubelet', gpu.id,
                            part.index)
                continue
            units.append(GpuUnit(
                index=len(units), uuid=part.unique_id.lower(),
                gpu_address=gpu.id, partition=part.index,
                card_minor=part.card_minor, render_minor=part.render_minor,
                compute_units=part.compute_units, vram_mib=part.vram_mib,
                numa_node=gpu.numa_node,
                product_name=gpu.product_name or gpu.model.product_name,
                cu_unit=gpu.model.cu_alloc_unit))
    return tuple(units)


def list_devices(units: Sequence[GpuUnit], share_count: int,
                 healthy: dict[str, bool]) -> list[Device]:
    """ListAndWatch's device list: ``share_count`` slots per unit.

    :param healthy: unit uuid -> health; a missing uuid counts as healthy.
    """
    return [Device(unit.device_id(slot),
                   HEALTHY if healthy.get(unit.uuid, True) else UNHEALTHY,
                   unit.numa_node)
            for unit in units for slot in range(share_count)]


class DeviceIndex:
    """Resolves device IDs back to units."""

    def __init__(self, units: Sequence[GpuUnit], share_count: int,
                 resource: str) -> None:
        self.units = tuple(units)
        self.share_count = share_count
        self.resource = resource
        self._by_uuid = {unit.uuid: unit for unit in units}

    def resolve(self, device_id: str, request: str) -> tuple[GpuUnit, int]:
        """(unit, slot) of ``device_id``.

        :raises UnknownDevice: naming the ID and the request.
        """
        uuid, _sep, slot = device_id.rpartition('-')
        unit = self._by_uuid.get(uuid)
        if unit is None or not slot.isdigit() or \
                int(slot) >= self.share_count:
            raise exception.UnknownDevice(device=device_id, request=request,
                                          resource=self.resource)
        return unit, int(slot)

    def preferred(self, available: Sequence[str],
                  must_include: Sequence[str], size: int) -> list[str]:
        """GetPreferredAllocation for one container.

        Keeps ``must_include``, then adds slots of GPUs not chosen yet,
        preferring untouched GPUs (all their slots free), then the NUMA
        node of the first chosen GPU, then PCI order: a request for N
        devices gets N distinct, whole GPUs when there are N free ones.
        Unknown IDs are ignored (kubelet only offers ours).
        """
        chosen = list(must_include)[:size]
        slots: dict[str, tuple[GpuUnit, int]] = {}
        free_per_unit: dict[str, int] = {}
        for device_id in available:
            try:
                unit, slot = self.resolve(device_id, 'available_deviceIDs')
            except exception.UnknownDevice:
                continue
            slots[device_id] = (unit, slot)
            free_per_unit[unit.uuid] = free_per_unit.get(unit.uuid, 0) + 1
        used = {slots[d][0].uuid for d in chosen if d in slots}
        numa = next((slots[d][0].numa_node for d in chosen if d in slots),
                    None)
        while len(chosen) < size:
            candidates = [d for d in slots if d not in chosen]
            if not candidates:
                break
            best = min(candidates, key=functools.partial(
                _rank, slots=slots, used=used, free=free_per_unit,
                numa=numa))
            chosen.append(best)
            unit = slots[best][0]
            used.add(unit.uuid)
            if numa is None:
                numa = unit.numa_node
        return chosen

    def whole_gpus(self, device_ids: Sequence[str],
                   request: str) -> ContainerAllocation:
        """Allocate for a whole-GPU request: one GPU per device ID.

        :raises UnknownDevice: an ID the plugin never offered.
        :raises DevicePluginError: two IDs name the same GPU.
        """
        units: list[GpuUnit] = []
        for device_id in device_ids:
            unit, _slot = self.resolve(device_id, request)
            if unit in units:
                raise exception.DevicePluginError(
                    resource=self.resource,
                    reason='%s: device IDs %s name GPU %s more than once; a '
                    'whole-GPU request needs distinct GPUs' % (
                        request, ','.join(device_ids), unit.rocr_id))
            units.append(unit)
        return allocation_for(units)


def _rank(device_id: str, slots: dict[str, tuple[GpuUnit, int]],
          used: set[str], free: dict[str, int],
          numa: int | None) -> tuple[bool, int, bool, int, int]:
    unit, slot = slots[device_id]
    return (unit.uuid in used, -free[unit.uuid],
            numa is not None and unit.numa_node != numa, unit.index, slot)


def allocation_for(units: Sequence[GpuUnit]) -> ContainerAllocation:
    """Device nodes and ROCr environment for ``units``, in this order."""
    nodes = [DeviceNode(KFD_PATH, KFD_PATH)]
    for unit in units:
        nodes.append(DeviceNode(unit.card_path, unit.card_path))
        nodes.append(DeviceNode(unit.render_path, unit.render_path))
    envs = (
        ('ROCR_VISIBLE_DEVICES', ','.join(u.rocr_id for u in units)),
        ('HIP_VISIBLE_DEVICES', ','.join(str(n) for n in range(len(units)))),
    )
    return ContainerAllocation(envs=envs, devices=tuple(nodes))
