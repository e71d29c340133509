"""Which DRA devices a node offers: pure, from inventory + role ledger.

A GPU is offered only when the role ledger gives it to Kubernetes
(``k8s-dedicated`` or ``k8s-shared``); a GPU given to Nova, an idle GPU and
a GPU not driven by amdgpu are never published. Without a ledger every
amdgpu-driven GPU is ``k8s-dedicated``.

Three kinds of device (the ``type`` attribute):

* ``gpu``: a ``k8s-dedicated`` GPU, whole. On a partitioned GPU (DPX, QPX,
  CPX) the whole GPU is every partition together, and it consumes all of
  the GPU's counters;
* ``partition``: one compute partition of a partitioned ``k8s-dedicated``
  GPU, consuming its share of the GPU's counters (``xcds``, ``memory``), so
  that the whole GPU and its partitions exclude each other;
* ``share``: a ``k8s-shared`` GPU (or one partition of it) with
  ``allowMultipleAllocations`` and the consumable capacities
  ``computeUnits`` and ``memory``; each claim gets a share of both.

What the API server keeps (:class:`~amdgpu_virt.k8s.dra.served.Served`)
decides what is offered, so that nothing means less there than it says:

* whole GPUs, always;
* partitions beside their whole GPU only where counters are kept. Where
  they are not, nothing could keep a whole GPU and its partitions apart,
  so a partitioned GPU is offered in one form (``without_counters``):
  ``whole`` (the default: partitions are not offered) or ``partitions``
  (its partitions, each an exclusive device, and no whole device: a claim
  takes the whole GPU as all of its partitions);
* shares only where consumable capacity is kept (a share without it would
  be one exclusive device with no granted capacity); a ``k8s-shared`` GPU
  is not offered elsewhere.

What is held back is listed in :attr:`DevicePlan.withheld`. Device order
is the packing policy (the allocator takes the first fit in published
order, see :func:`plan`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence

from amdgpu_virt import exception
from amdgpu_virt import model
from amdgpu_virt.k8s.dra import served as dra_served
from amdgpu_virt.ledger import GpuAssignment
from amdgpu_virt.model import Role
from amdgpu_virt.sharing.enforcement import Level
from amdgpu_virt.sharing.enforcement import Requirement

#: reported VRAM at most this fraction below the catalog's nominal size is
#: published as the nominal size (the VBIOS keeps a few MiB)
NOMINAL_VRAM_SLACK = 0.01
#: how a partitioned GPU is offered where counters are not kept
WHOLE = 'whole'
PARTITIONS = 'partitions'
WITHOUT_COUNTERS = (WHOLE, PARTITIONS)


class DeviceType(str, enum.Enum):  # noqa: UP042 (str() stays Enum-style)
    GPU = 'gpu'
    PARTITION = 'partition'
    SHARE = 'share'


@dataclasses.dataclass(frozen=True)
class DraDevice:
    """One published device.

    :ivar name: DNS label, unique in the pool, derived from the PCI address.
    :ivar partitions: indexes of the GPU's partitions the device stands for.
    :ivar counter_set: name of the GPU's counter set, when it consumes one.
    :ivar counters: counter name -> amount consumed.
    :ivar pcie_root: the GPU's PCIe root complex (``pci0000:80``), when
        known: the standard attribute ``resource.kubernetes.io/pcieRoot``.
    """

    name: str
    type: DeviceType
    gpu: model.Gpu
    role: Role
    partitions: tuple[int, ...]
    compute_units: int
    memory_mib: int
    cu_unit: int = 1
    partition: int | None = None
    counter_set: str | None = None
    counters: tuple[tuple[str, int], ...] = ()
    pcie_root: str | None = None
    #: the GPU's memory enforcement level (the ``memoryEnforcement``
    #: attribute), when known
    memory_enforcement: str | None = None

    @property
    def shared(self) -> bool:
        return self.type is DeviceType.SHARE


@dataclasses.dataclass(frozen=True)
class CounterSet:
    """The shared counters of one partitioned GPU."""

    name: str
    counters: tuple[tuple[str, int], ...]


@dataclasses.dataclass(frozen=True)
class Withheld:
    """What a GPU does not offer on this API server, and why.

    :ivar gpu: the GPU's PCI address.
    :ivar what: ``partitions``, ``whole GPU`` or ``shares``.
    :ivar gate: the feature gate whose fields the server does not keep.
    """

    gpu: str
    what: str
    gate: str

    def __str__(self) -> str:
        return 'GPU %s offers no %s: the API server does not keep the ' \
            'fields of %s' % (self.gpu, self.what, self.gate)


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """Every device of a node, in publishing order, its counter sets, and
    what its GPUs hold back on this API server."""

    node: str
    devices: tuple[DraDevice, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()
    withheld: tuple[Withheld, ...] = ()

    def device(self, name: str) -> DraDevice | None:
        for device in self.devices:
            if device.name == name:
                return device
        return None


def gpu_label(address: model.PciAddress) -> str:
    """``gpu-0000-05-00-0``: a DNS label naming the GPU."""
    return 'gpu-%04x-%02x-%02x-%x' % (address.domain, address.bus,
                                      address.device, address.function)


def offered_roles(inventory: model.HostInventory,
                  assignments: Iterable[GpuAssignment] | None
                  ) -> tuple[tuple[model.Gpu, Role], ...]:
    """The GPUs Kubernetes may use through DRA, with their role, PCI order.

    :param assignments: the ledger entries of this host; None without a
        ledger (then every amdgpu-driven GPU is ``k8s-dedicated``).
    """
    roles: Mapping[model.PciAddress, Role] | None = None
    if assignments is not None:
        roles = {a.address: a.role for a in assignments}
    result = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        if gpu.driver is not model.Driver.AMDGPU or not gpu.partitions:
            continue
        role = Role.K8S_DEDICATED if roles is None else roles.get(
            gpu.address, Role.IDLE)
        if role in (Role.K8S_DEDICATED, Role.K8S_SHARED):
            result.append((gpu, role))
    return tuple(result)


def _memory_mib(reported: int, nominal: int | None) -> int:
    if nominal and nominal * (1 - NOMINAL_VRAM_SLACK) <= reported <= nominal:
        return nominal
    return reported


def _gpu_devices(gpu: model.Gpu, role: Role, partition_devices: bool,
                 served: dra_served.Served, without_counters: str
                 ) -> tuple[list[DraDevice], list[DraDevice],
                            CounterSet | None, list[Withheld]]:
    """(partition or share devices, whole devices, counter set, withheld)
    of a GPU."""
    parts, wholes, counters = _all_devices(gpu, role, partition_devices)
    address = str(gpu.address)
    if role is Role.K8S_SHARED and not served.consumable:
        return [], [], None, [Withheld(address, 'shares',
                                       dra_served.CONSUMABLE)]
    if counters is None or served.counters:
        return parts, wholes, counters, []
    parts = [dataclasses.replace(d, counter_set=None, counters=())
             for d in parts]
    wholes = [dataclasses.replace(d, counter_set=None, counters=())
              for d in wholes]
    if without_counters == PARTITIONS:
        return parts, [], None, [Withheld(address, 'whole GPU',
                                          dra_served.PARTITIONABLE)]
    return [], wholes, None, [Withheld(address, 'partitions',
                                       dra_served.PARTITIONABLE)]


def _all_devices(gpu: model.Gpu, role: Role, partition_devices: bool
                 ) -> tuple[list[DraDevice], list[DraDevice],
                            CounterSet | None]:
    """(partition or share devices, whole devices, counter set) of a GPU
    on an API server that keeps everything."""
    label = gpu_label(gpu.address)
    parts = tuple(sorted(gpu.partitions, key=lambda p: p.index))
    count = len(parts)
    nominal = gpu.model.vram_mib if gpu.model.known else None
    memory = [_memory_mib(p.vram_mib, nominal // count if nominal else None)
              for p in parts]
    unit = gpu.model.cu_alloc_unit
    if role is Role.K8S_SHARED:
        shares = [DraDevice(
            name='%s-share' % label if count == 1 else '%s-p%d-share' % (
                label, part.index),
            type=DeviceType.SHARE, gpu=gpu, role=role,
            partitions=(part.index,), compute_units=part.compute_units,
            memory_mib=mib, cu_unit=unit,
            partition=None if count == 1 else part.index)
            for part, mib in zip(parts, memory, strict=True)]
        return shares, [], None
    total_cus = sum(p.compute_units for p in parts)
    whole = DraDevice(name=label, type=DeviceType.GPU, gpu=gpu, role=role,
                      partitions=tuple(p.index for p in parts),
                      compute_units=total_cus, memory_mib=sum(memory),
                      cu_unit=unit)
    if count == 1 or not partition_devices:
        return [], [whole], None
    xcds = gpu.model.xcds if gpu.model.xcds and \
        gpu.model.xcds % count == 0 else count
    counter_set = CounterSet(label, (('xcds', xcds),
                                     ('memory', sum(memory))))
    whole = dataclasses.replace(whole, counter_set=label,
                                counters=counter_set.counters)
    partitions = [DraDevice(
        name='%s-p%d' % (label, part.index), type=DeviceType.PARTITION,
        gpu=gpu, role=role, partitions=(part.index,),
        compute_units=part.compute_units, memory_mib=mib, cu_unit=unit,
        partition=part.index, counter_set=label,
        counters=(('xcds', xcds // count), ('memory', mib)))
        for part, mib in zip(parts, memory, strict=True)]
    return partitions, [whole], counter_set


def plan(node: str, inventory: model.HostInventory,
         assignments: Iterable[GpuAssignment] | None = None,
         partition_devices: bool = True,
         pcie_roots: Mapping[model.PciAddress, str] | None = None,
         served: dra_served.Served = dra_served.FULL,
         without_counters: str = WHOLE) -> DevicePlan:
    """The devices ``node`` publishes, in the order that packs best.

    The allocator tries devices in published order and keeps the first
    fit, so the order is the packing policy:

    1. partitions, GPU by GPU in PCI order: partition claims fill one GPU
       before they open the next;
    2. whole GPUs in *reverse* PCI order: whole-GPU claims take GPUs from
       the other end, so they meet partition claims last and a partially
       used GPU is never the one a whole-GPU claim breaks into;
    3. shares, GPU by GPU in PCI order: first fit packs shares onto the
       fewest GPUs and leaves the rest free for large shares.

    :param pcie_roots: PCI address -> PCIe root complex of the GPUs
        (:func:`amdgpu_virt.inventory.sysfs.pcie_roots`); a GPU without
        one publishes no ``pcieRoot``.
    :param served: what the API server keeps.
    :param without_counters: how a partitioned GPU is offered where
        counters are not kept, one of :data:`WITHOUT_COUNTERS`.
    :raises InventoryError: two devices would get the same name.
    """
    partitions: list[DraDevice] = []
    wholes: list[DraDevice] = []
    shares: list[DraDevice] = []
    counter_sets: list[CounterSet] = []
    withheld: list[Withheld] = []
    for gpu, role in offered_roles(inventory, assignments):
        parts, whole, counters, held = _gpu_devices(
            gpu, role, partition_devices, served, without_counters)
        withheld.extend(held)
        root = (pcie_roots or {}).get(gpu.address)
        if root is not None:
            parts = [dataclasses.replace(d, pcie_root=root) for d in parts]
            whole = [dataclasses.replace(d, pcie_root=root) for d in whole]
        if role is Role.K8S_SHARED:
            shares.extend(parts)
        else:
            partitions.extend(parts)
        wholes.extend(whole)
        if counters is not None:
            counter_sets.append(counters)
    devices = tuple(partitions + wholes[::-1] + shares)
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise exception.InventoryError(
            source=inventory.hostname,
            reason='two DRA devices would be named alike: %s' % names)
    return DevicePlan(node=node, devices=devices,
                      counter_sets=tuple(counter_sets),
                      withheld=tuple(withheld))


def with_enforcement(plan: DevicePlan, levels: Mapping[str, Level],
                     requirement: Requirement
                     ) -> tuple[DevicePlan, tuple[str, ...]]:
    """``plan`` with each device's memory enforcement level, without the
    shares of GPUs whose level does not meet ``requirement``.

    :param levels: PCI address -> level (a GPU without one keeps no
        attribute and counts as ``none``).
    :returns: (the plan, the names of the shares left out).
    """
    kept = []
    dropped = []
    for device in plan.devices:
        level = levels.get(str(device.gpu.address))
        if device.shared and not requirement.met_by(level):
            dropped.append(device.name)
            continue
        kept.append(device if level is None else dataclasses.replace(
            device, memory_enforcement=level.value))
    return (dataclasses.replace(plan, devices=tuple(kept)),
            tuple(dropped))


def units_of(device: DraDevice, units: Sequence[object]) -> list[object]:
    """The entries of ``units`` (GpuUnit) that ``device`` stands for."""
    address = str(device.gpu.address)
    return [u for u in units
            if getattr(u, 'gpu_address', None) == address
            and getattr(u, 'partition', None) in device.partitions]


def without(plan: DevicePlan, names: Iterable[str]) -> DevicePlan:
    """``plan`` without the devices ``names`` (unhealthy ones), and
    without the counter sets no remaining device consumes."""
    gone = set(names)
    if not gone:
        return plan
    devices = tuple(d for d in plan.devices if d.name not in gone)
    used = {d.counter_set for d in devices if d.counter_set}
    return DevicePlan(node=plan.node, devices=devices,
                      counter_sets=tuple(c for c in plan.counter_sets
                                         if c.name in used))
