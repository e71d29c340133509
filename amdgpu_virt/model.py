"""Typed, frozen value objects describing GPUs, partitions, VFs and hosts.

This module is pure: it reads no files and imports no cloud library.
Identities are deterministic: a GPU is known by its PCI address, a VF by its
own PCI address, a partition by (GPU address, partition index).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any

from amdgpu_virt import exception

AMD_VENDOR_ID = 0x1002
MIB = 1024 * 1024

_BDF_RE = re.compile(
    r'^(?:(?P<domain>[0-9a-fA-F]{1,4}):)?(?P<bus>[0-9a-fA-F]{1,2}):'
    r'(?P<device>[0-9a-fA-F]{1,2})\.(?P<function>[0-7])$')


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class PciAddress:
    """A PCI function address (domain:bus:device.function)."""

    domain: int
    bus: int
    device: int
    function: int

    def __post_init__(self) -> None:
        if not (0 <= self.domain <= 0xffff and 0 <= self.bus <= 0xff
                and 0 <= self.device <= 0x1f and 0 <= self.function <= 7):
            raise exception.InvalidPciAddress(value=str(
                (self.domain, self.bus, self.device, self.function)))

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        """Parse ``0000:85:00.0`` (the domain may be omitted).

        :raises InvalidPciAddress: naming the text.
        """
        match = _BDF_RE.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise exception.InvalidPciAddress(value=text)
        try:
            return cls(int(match['domain'] or '0', 16),
                       int(match['bus'], 16), int(match['device'], 16),
                       int(match['function'], 16))
        except exception.InvalidPciAddress:
            # a field out of range (device 0x20..0xff): name the text
            raise exception.InvalidPciAddress(value=text) from None

    def __str__(self) -> str:
        return '%04x:%02x:%02x.%x' % (self.domain, self.bus, self.device,
                                      self.function)


class Driver(str, enum.Enum):  # noqa: UP042 (str() stays Enum-style)
    """The kernel driver bound to a PCI function."""

    AMDGPU = 'amdgpu'
    GIM = 'gim'
    VFIO_PCI = 'vfio-pci'
    NONE = 'none'
    OTHER = 'other'

    @classmethod
    def from_name(cls, name: str | None) -> Driver:
        if not name:
            return cls.NONE
        for member in cls:
            if member.value == name:
                return member
        return cls.OTHER


class Role(str, enum.Enum):  # noqa: UP042 (str() stays Enum-style)
    """What a GPU is used for; exactly one per GPU."""

    NOVA_VF = 'nova-vf'
    NOVA_DEDICATED = 'nova-dedicated'
    K8S_SHARED = 'k8s-shared'
    K8S_DEDICATED = 'k8s-dedicated'
    IDLE = 'idle'

    @property
    def side(self) -> str | None:
        """``'nova'``, ``'k8s'`` or None for idle GPUs."""
        if self.value.startswith('nova-'):
            return 'nova'
        if self.value.startswith('k8s-'):
            return 'k8s'
        return None


class Kind(str, enum.Enum):  # noqa: UP042 (str() stays Enum-style)
    """How a workload uses a GPU."""

    DEDICATED = 'dedicated'
    VF = 'vf'
    CU = 'cu'


@dataclasses.dataclass(frozen=True)
class GpuModel:
    """One row of the Instinct catalog (see :mod:`amdgpu_virt.catalog`).

    Values the public sources do not give are None. ``known`` is False for
    an AMD device id the catalog does not list: such a GPU is still
    reported, with what sysfs says about it.
    """

    name: str
    product_name: str
    pf_device_id: int
    vf_device_id: int | None = None
    gfx: str | None = None
    gfx_target_version: int | None = None
    compute_units: int | None = None
    xcds: int | None = None
    vram_mib: int | None = None
    pci_class: int | None = None
    family: str = 'unknown'
    #: compute mode -> memory modes it may be combined with
    partition_modes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: VF counts GIM officially supports for this model
    vf_counts: tuple[int, ...] = ()
    #: CUs a CU mask must enable together (2 on RDNA WGPs, 1 on CDNA)
    cu_alloc_unit: int = 1
    known: bool = True

    @property
    def compute_modes(self) -> tuple[str, ...]:
        return tuple(mode for mode, _mem in self.partition_modes)

    @property
    def memory_modes(self) -> tuple[str, ...]:
        seen: list[str] = []
        for _mode, mems in self.partition_modes:
            seen.extend(m for m in mems if m not in seen)
        return tuple(sorted(seen))

    @property
    def cus_per_xcd(self) -> int | None:
        if self.compute_units is None or not self.xcds:
            return None
        return self.compute_units // self.xcds

    def supports(self, compute_mode: str, memory_mode: str) -> bool:
        return memory_mode in dict(self.partition_modes).get(compute_mode, ())


@dataclasses.dataclass(frozen=True, slots=True)
class Partition:
    """A compute partition of a bare-metal GPU (one KFD node)."""

    index: int
    compute_units: int
    vram_mib: int
    kfd_node: int | None = None
    render_minor: int | None = None
    card_minor: int | None = None
    location_id: int | None = None
    #: ROCr-style id: 16 hex digits of the KFD unique_id, or None
    unique_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class VirtualFunction:
    """An SR-IOV virtual function of a GPU (made by GIM)."""

    address: PciAddress
    index: int
    device_id: int
    driver: Driver = Driver.NONE
    iommu_group: int | None = None
    numa_node: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RasCount:
    """The RAS error counts of one IP block of a GPU (amdgpu's
    ``ras/<block>_err_count``): cumulative since the driver loaded."""

    block: str
    uncorrectable: int = 0
    correctable: int = 0
    #: deferred errors (newer kernels, UMC only)
    deferred: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class GpuHealth:
    """What a host read about one GPU's health.

    :ivar ras: the RAS counts per block, in block order (empty when the
        host shows none: a GPU not driven by amdgpu, a kernel or firmware
        without RAS).
    :ivar unhealthy: why the host judged the GPU unhealthy with its own
        thresholds (a node agent); empty when it did not judge or found it
        healthy.
    """

    ras: tuple[RasCount, ...] = ()
    unhealthy: str = ''

    @property
    def uncorrectable(self) -> int:
        return sum(count.uncorrectable for count in self.ras)

    @property
    def correctable(self) -> int:
        return sum(count.correctable for count in self.ras)

    def problem(self, max_uncorrectable: int | None = 0) -> str | None:
        """Why the GPU is not fit for new work, or None.

        :param max_uncorrectable: uncorrectable errors a healthy GPU may
            have (``[health] max_uncorrectable``); None: do not judge the
            counts.
        """
        if self.unhealthy:
            return self.unhealthy
        if max_uncorrectable is not None and \
                self.uncorrectable > max_uncorrectable:
            blocks = ', '.join('%s %d' % (c.block, c.uncorrectable)
                               for c in self.ras if c.uncorrectable)
            return '%d uncorrectable RAS errors (%s), more than %d' % (
                self.uncorrectable, blocks, max_uncorrectable)
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU (its PCI physical function) and what it exposes."""

    address: PciAddress
    device_id: int
    model: GpuModel
    driver: Driver = Driver.NONE
    vendor_id: int = AMD_VENDOR_ID
    subsystem_vendor_id: int | None = None
    subsystem_device_id: int | None = None
    pci_class: int | None = None
    numa_node: int | None = None
    iommu_group: int | None = None
    compute_partition: str | None = None
    memory_partition: str | None = None
    available_compute_partitions: tuple[str, ...] = ()
    available_memory_partitions: tuple[str, ...] = ()
    compute_units: int | None = None
    vram_mib: int | None = None
    unique_id: str | None = None
    product_name: str | None = None
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    vfs: tuple[VirtualFunction, ...] = ()
    partitions: tuple[Partition, ...] = ()
    hive_id: int | None = None
    #: RAS counts and verdict, when the host could read them
    health: GpuHealth | None = None

    @property
    def id(self) -> str:
        """Deterministic identity of the GPU on its host."""
        return str(self.address)


@dataclasses.dataclass(frozen=True)
class InventoryWarning:
    """Something the inventory could not read or found odd.

    ``culprit`` names the file, field or device the warning is about.
    """

    culprit: str
    message: str

    def __str__(self) -> str:
        return '%s: %s' % (self.culprit, self.message)


@dataclasses.dataclass(frozen=True)
class HostInventory:
    """Everything amdgpu_virt knows about one host's AMD GPUs."""

    hostname: str
    gpus: tuple[Gpu, ...] = ()
    warnings: tuple[InventoryWarning, ...] = ()
    source: str = ''
    gim_version: str | None = None

    def gpu(self, address: PciAddress | str) -> Gpu:
        """The GPU at ``address``.

        :raises InventoryError: naming host and address when absent.
        """
        if isinstance(address, str):
            address = PciAddress.parse(address)
        for gpu in self.gpus:
            if gpu.address == address:
                return gpu
        raise exception.InventoryError(
            source=self.hostname, reason='no GPU at %s' % address)

    @property
    def vf_count(self) -> int:
        return sum(len(gpu.vfs) for gpu in self.gpus)

    @property
    def partition_count(self) -> int:
        return sum(len(gpu.partitions) for gpu in self.gpus)


def replace(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` re-exported for callers of this module."""
    return dataclasses.replace(obj, **changes)
