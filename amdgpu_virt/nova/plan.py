"""Which GPUs of a host Nova may use, and how (pure).

A :class:`HostPlan` is built from a host inventory and, optionally, the
role ledger:

* without a ledger, roles follow the drivers the host has now: a PF bound to
  ``gim`` offers its VFs (``nova-vf``), a PF bound to ``vfio-pci`` is offered
  whole (``nova-dedicated``), a GPU bound to ``amdgpu`` is left to
  Kubernetes and never offered;
* with a ledger, only GPUs whose ledger role is ``nova-vf`` or
  ``nova-dedicated`` are offered, and only once the host is in the state the
  role needs (PF under GIM with VFs, or PF bound to vfio-pci). A GPU whose
  driver does not fit its role yet is *pending*: it is left out of Nova's
  configuration (so it is never offered while another driver still uses
  it) and the plan says what to do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.ledger import GpuAssignment
from amdgpu_virt.ledger import Ledger
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.nova.naming import Naming

TYPE_VF = 'type-VF'
TYPE_PF = 'type-PF'
TYPE_PCI = 'type-PCI'

#: Kept here for callers of this module; the rule lives in the catalog.
gim_memory_mode = catalog.gim_memory_mode


@dataclasses.dataclass(frozen=True)
class GpuOffer:
    """One GPU offered to Nova: its VFs or the whole device."""

    address: PciAddress
    role: Role
    model: GpuModel
    resource_class: str
    traits: tuple[str, ...]
    alias: str
    device_type: str
    vendor_id: int
    product_id: int
    compute_mode: str | None = None
    memory_mode: str | None = None
    vf_count: int = 0
    vf_addresses: tuple[PciAddress, ...] = ()
    numa_node: int | None = None
    #: rank of the GPU by PCI address among the host's AMD GPUs; its
    #: per-GPU trait is among :attr:`traits` (``[nova] per_gpu_traits``).
    gpu_index: int | None = None
    gpu_trait: str | None = None

    @property
    def total(self) -> int:
        """Inventory Nova reports for this GPU's provider."""
        return self.vf_count if self.role is Role.NOVA_VF else 1


@dataclasses.dataclass(frozen=True)
class Pending:
    """A GPU that is not offered (yet), and why."""

    address: PciAddress
    reason: str


@dataclasses.dataclass(frozen=True)
class HostPlan:
    hostname: str
    offers: tuple[GpuOffer, ...] = ()
    pending: tuple[Pending, ...] = ()

    def offer(self, address: PciAddress | str) -> GpuOffer | None:
        if isinstance(address, str):
            address = PciAddress.parse(address)
        for item in self.offers:
            if item.address == address:
                return item
        return None


def host_device_type(gpu: Gpu) -> str:
    """The device type nova-compute reports for the whole GPU.

    libvirt lists a ``virt_functions`` capability, which Nova turns into
    ``type-PF``, for a function whose ``sriov_totalvfs`` is above 0 (even
    with no VF enabled); every other function is ``type-PCI``. A missing
    or unreadable ``sriov_totalvfs`` means no SR-IOV capability.
    """
    return TYPE_PF if (gpu.sriov_totalvfs or 0) > 0 else TYPE_PCI


def dedicated_device_type(model: GpuModel, setting: str = 'auto') -> str:
    """Device type of a whole GPU when the host cannot be read.

    Only for rendering from the ledger alone (controllers): ``type-PF``
    for models with SR-IOV. Hosts that can be read use
    :func:`host_device_type`.
    """
    if setting != 'auto':
        return setting
    return TYPE_PF if model.vf_device_id is not None else TYPE_PCI


def _gpu_trait(naming: Naming, index: int | None) -> str | None:
    if index is None or not naming.per_gpu_traits:
        return None
    return naming.gpu_trait(index)


def _traits(naming: Naming, base: tuple[str, ...],
            index: int | None) -> tuple[str, ...]:
    trait = _gpu_trait(naming, index)
    return base if trait is None else tuple(sorted(base + (trait,)))


def gpu_indexes(addresses: Iterable[PciAddress]) -> dict[PciAddress, int]:
    """Rank of every GPU of a host by PCI address, from 0."""
    return {a: i for i, a in enumerate(sorted(set(addresses)))}


def vf_offer(gpu: Gpu, naming: Naming, memory_mode: str | None = None,
             index: int | None = None) -> GpuOffer:
    """The offer of the VFs ``gpu`` has now (``index``: its rank)."""
    count = len(gpu.vfs)
    model = gpu.model
    compute = catalog.VF_COUNT_MODES.get(count)
    if compute is None:
        raise exception.NovaConfigError(
            host=str(gpu.address), reason='GPU %s has %d VFs; GIM VF counts '
            'are %s' % (gpu.address, count,
                        ', '.join(map(str, catalog.VF_COUNT_MODES))))
    memory = (memory_mode or gpu.memory_partition
              or gim_memory_mode(model, count)).upper()
    product = gpu.vfs[0].device_id
    return GpuOffer(
        address=gpu.address, role=Role.NOVA_VF, model=model,
        resource_class=naming.vf_resource_class(model.name, compute, memory,
                                                count),
        traits=_traits(naming, naming.traits(model.name, compute, memory),
                       index),
        alias=naming.vf_alias(model.name, compute, memory, count),
        device_type=TYPE_VF, vendor_id=gpu.vendor_id, product_id=product,
        compute_mode=compute, memory_mode=memory, vf_count=count,
        vf_addresses=tuple(sorted(vf.address for vf in gpu.vfs)),
        numa_node=gpu.numa_node, gpu_index=index,
        gpu_trait=_gpu_trait(naming, index))


def dedicated_offer(gpu: Gpu, naming: Naming,
                    device_type: str = 'auto',
                    index: int | None = None) -> GpuOffer:
    model = gpu.model
    return GpuOffer(
        address=gpu.address, role=Role.NOVA_DEDICATED, model=model,
        resource_class=naming.dedicated_resource_class(model.name),
        traits=_traits(naming, naming.traits(model.name), index),
        alias=naming.dedicated_alias(model.name),
        device_type=(host_device_type(gpu) if device_type == 'auto'
                     else device_type),
        vendor_id=gpu.vendor_id, product_id=gpu.device_id,
        numa_node=gpu.numa_node, gpu_index=index,
        gpu_trait=_gpu_trait(naming, index))


def _by_driver(gpu: Gpu, naming: Naming, device_type: str,
               index: int | None) -> GpuOffer | Pending:
    if gpu.driver is Driver.GIM:
        if not gpu.vfs:
            return Pending(gpu.address, 'bound to gim but has no VFs')
        return vf_offer(gpu, naming, index=index)
    if gpu.driver is Driver.VFIO_PCI:
        if not gpu.model.known:
            return Pending(gpu.address, 'bound to vfio-pci but its model '
                           '(%04x) is not in the catalog' % gpu.device_id)
        return dedicated_offer(gpu, naming, device_type, index)
    return Pending(gpu.address, 'bound to %s: left to Kubernetes or idle, '
                   'not offered to Nova' % gpu.driver.value)


def _by_ledger(gpu: Gpu, item: GpuAssignment, naming: Naming,
               device_type: str, index: int | None) -> GpuOffer | Pending:
    if item.role is Role.NOVA_VF:
        if gpu.driver is not Driver.GIM or not gpu.vfs:
            return Pending(gpu.address, 'ledger role nova-vf but the GPU is '
                           'bound to %s with %d VFs: render "nova gim-config"'
                           ', install it and reboot first' % (
                               gpu.driver.value, len(gpu.vfs)))
        offer = vf_offer(gpu, naming, item.memory_mode, index)
        if item.vf_count is not None and item.vf_count != offer.vf_count:
            return Pending(gpu.address, 'ledger wants %d VFs, the GPU has '
                           '%d: drain it, change the GIM config and reboot'
                           % (item.vf_count, offer.vf_count))
        return offer
    if item.role is Role.NOVA_DEDICATED:
        if gpu.driver is not Driver.VFIO_PCI:
            return Pending(gpu.address, 'ledger role nova-dedicated but the '
                           'GPU is bound to %s: bind it to vfio-pci at boot '
                           '("nova gim-config") and reboot first'
                           % gpu.driver.value)
        return dedicated_offer(gpu, naming, device_type, index)
    return Pending(gpu.address, 'ledger role %s: not offered to Nova'
                   % item.role.value)


def plan_host(inventory: HostInventory, naming: Naming,
              ledger: Ledger | None = None, host: str | None = None,
              device_type: str = 'auto') -> HostPlan:
    """What Nova may use on one host.

    :param host: the host's name in the ledger (default: the inventory's).
    :raises NovaConfigError: an offer cannot be named or is inconsistent.
    """
    name = host or inventory.hostname
    offers: list[GpuOffer] = []
    pending: list[Pending] = []
    assigned: dict[PciAddress, GpuAssignment] = {}
    if ledger is not None:
        assigned = {a.address: a for a in ledger.for_host(name)}
        present = {gpu.address for gpu in inventory.gpus}
        for address in sorted(set(assigned) - present):
            pending.append(Pending(address, 'in the ledger (%s) but not '
                                   'found on the host' % (
                                       assigned[address].role.value)))
    indexes = gpu_indexes(gpu.address for gpu in inventory.gpus)
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        index = indexes[gpu.address]
        if ledger is None:
            result = _by_driver(gpu, naming, device_type, index)
        elif gpu.address not in assigned:
            result = Pending(gpu.address, 'not in the ledger for host %s: '
                             'not offered to Nova' % name)
        else:
            result = _by_ledger(gpu, assigned[gpu.address], naming,
                                device_type, index)
        if isinstance(result, Pending):
            pending.append(result)
        else:
            offers.append(result)
    return HostPlan(hostname=name, offers=tuple(offers),
                    pending=tuple(sorted(pending, key=lambda p: p.address)))


def fleet_offers(plans: Iterable[HostPlan]) -> tuple[GpuOffer, ...]:
    return tuple(o for plan in plans for o in plan.offers)


def plan_from_ledger(ledger: Ledger, naming: Naming,
                     device_type: str = 'auto') -> tuple[HostPlan, ...]:
    """The offers a ledger implies for every host, without inventories.

    What Placement must show once every host matches the ledger (used by
    the audit on a controller, which cannot read the compute hosts). The
    offers carry no VF addresses; a GPU's index is its rank among the
    host's GPUs in the ledger (the ledger lists every GPU of a host).
    """
    result = []
    for host in ledger.hosts:
        offers = []
        indexes = gpu_indexes(item.address for item in ledger.for_host(host))
        for item in ledger.for_host(host):
            index = indexes[item.address]
            model = catalog.by_name(item.model)
            if item.role is Role.NOVA_VF and item.vf_count:
                compute = catalog.VF_COUNT_MODES[item.vf_count]
                memory = (item.memory_mode
                          or gim_memory_mode(model, item.vf_count)).upper()
                offers.append(GpuOffer(
                    address=item.address, role=Role.NOVA_VF, model=model,
                    resource_class=naming.vf_resource_class(
                        model.name, compute, memory, item.vf_count),
                    traits=_traits(naming, naming.traits(
                        model.name, compute, memory), index),
                    alias=naming.vf_alias(model.name, compute, memory,
                                          item.vf_count),
                    device_type=TYPE_VF, vendor_id=0x1002,
                    product_id=model.vf_device_id or 0,
                    compute_mode=compute, memory_mode=memory,
                    vf_count=item.vf_count, gpu_index=index,
                    gpu_trait=_gpu_trait(naming, index)))
            elif item.role is Role.NOVA_DEDICATED:
                offers.append(GpuOffer(
                    address=item.address, role=Role.NOVA_DEDICATED,
                    model=model,
                    resource_class=naming.dedicated_resource_class(
                        model.name),
                    traits=_traits(naming, naming.traits(model.name),
                                   index),
                    alias=naming.dedicated_alias(model.name),
                    device_type=dedicated_device_type(model, device_type),
                    vendor_id=0x1002, product_id=model.pf_device_id,
                    gpu_index=index,
                    gpu_trait=_gpu_trait(naming, index)))
        result.append(HostPlan(hostname=host, offers=tuple(offers)))
    return tuple(result)
