"""Simulated hosts: what a real host of a given kind looks like.

:func:`design_host` is pure: it returns the :class:`HostInventory` a host
built from a :class:`HostSpec` must produce when scanned. The sysfs writer
(:func:`amdgpu_virt.inventory.simtree.write_tree`, also importable from
here) lays out the files a real kernel would show for the same host, so
that ``scan(write_tree(design_host(spec)))`` can be compared with
``design_host(spec)``.

Facts followed (see the hardware notes in the documentation):

* PFs of an 8-GPU host sit on buses 05, 25, 45, ... e5 (device 00.0); GPUs
  0..n/2-1 on NUMA node 0, the rest on node 1;
* under GIM the PF binds to ``gim``; its VFs sit on the PF's bus at
  ``BB:02.0``..``BB:02.7``, bind to ``vfio-pci`` and have one IOMMU group
  each; there is no KFD topology and no DRM device for them on the host;
* on bare metal every partition-capable GPU reserves 8 DRM minors:
  partition p of the k-th amdgpu-bound GPU uses ``renderD(128+8k+p)`` and,
  because an onboard VGA device holds ``card0``, ``card(1+8k+p)``; card
  minors end at 63, so on an 8 x CPX host the last partition gets none and
  does not appear (the 63-partition quirk seen on real hosts);
* minors go to amdgpu-bound GPUs in probe order: GPUs bound to ``gim`` or
  ``vfio-pci`` take none, so they do not shift the minors of the others;
* GPUs without partitions (MI210, MI250X) take consecutive minors;
* KFD lists two CPU nodes first, then one node per partition;
* a GPU bound to amdgpu shows its RAS counts (all 0) for the blocks of
  :data:`RAS_BLOCKS`, idle telemetry (``mem_info_vram_used``,
  ``gpu_busy_percent``) and hwmon sensors named by label (MI300-class:
  junction and mem, socket power in ``power1_input``); change them while
  a test runs with :mod:`amdgpu_virt.inventory.simnode`.
"""

from __future__ import annotations

import dataclasses
import hashlib

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import simtree
from amdgpu_virt.inventory.simtree import write_tree
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import GpuHealth
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Partition
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import RasCount
from amdgpu_virt.model import VirtualFunction

BARE_MODES = ('spx', 'dpx', 'tpx', 'qpx', 'cpx')
GIM_MODES = {'gim-spx': 1, 'gim-dpx': 2, 'gim-qpx': 4, 'gim-cpx': 8}
#: PF bound to vfio-pci for whole-GPU passthrough
VFIO_MODE = 'vfio'
MODES = BARE_MODES + tuple(GIM_MODES) + (VFIO_MODE,)
NPS_MODES = ('nps1', 'nps2', 'nps4')

CPU_NODES = simtree.CPU_NODES
FIRST_RENDER_MINOR = layout.FIRST_RENDER_MINOR
FIRST_CARD_MINOR = layout.FIRST_CARD_MINOR
MAX_CARD_MINOR = layout.MAX_CARD_MINOR
MINORS_PER_GPU = layout.MINORS_PER_GPU
#: what the VBIOS reports beyond the nominal size (MI300X: 206141652992 B)
VRAM_SHORTFALL_MIB = 16
#: the RAS blocks an Instinct GPU under amdgpu shows (``ras/<block>_err_
#: count``), in the kernel's order
RAS_BLOCKS = ('umc', 'sdma', 'gfx', 'mmhub', 'pcie_bif', 'hdp', 'xgmi_wafl')


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """What to simulate.

    :param mode: one of :data:`MODES` for every GPU, unless ``gpu_modes``
        gives one mode per GPU (a mixed host).
    :param nps: memory mode of the bare-metal GPUs (one per host).
    :param off_catalog: build a GIM VF count the catalog does not list
        for the model (a VBIOS variant), for tests of how readers cope;
        never set from a fleet file or the command line.
    """

    hostname: str
    model: str = 'MI300X'
    gpus: int = 8
    mode: str = 'spx'
    nps: str = 'nps1'
    gpu_modes: tuple[str, ...] = ()
    gim_version: str = '8.1.0.K'
    off_catalog: bool = False

    def modes(self) -> tuple[str, ...]:
        if self.gpu_modes:
            return tuple(m.lower() for m in self.gpu_modes)
        return (self.mode.lower(),) * self.gpus


def gim_modes(model: GpuModel) -> tuple[str, ...]:
    """The ``gim-*`` modes ``model`` supports (its VF counts)."""
    return tuple(mode for mode, count in GIM_MODES.items()
                 if model.vf_device_id is not None
                 and count in model.vf_counts)


def _kinds() -> dict[str, HostSpec]:
    kinds = {}
    for model, modes in (
            ('MI300X', ('spx', 'dpx', 'dpx-nps2', 'qpx', 'qpx-nps4', 'cpx',
                        'cpx-nps4', 'gim-spx', 'gim-cpx', 'vfio')),
            ('MI325X', ('spx', 'cpx-nps4', 'gim-spx')),
            ('MI308X', ('spx', 'dpx', 'cpx-nps4', 'gim-spx')),
            ('MI300A', ('spx', 'tpx', 'cpx')),
            ('MI355X', ('spx', 'dpx-nps2', 'cpx-nps2', 'gim-dpx', 'gim-cpx')),
            ('MI210', ('spx', 'gim-spx', 'vfio')),
            ('MI250X', ('spx', 'vfio'))):
        for kind in modes:
            mode, _sep, nps = kind.partition('-nps')
            name = '%s-%s' % (model.lower(), kind)
            # MI300A is an APU: servers hold four of them.
            gpus = 4 if model == 'MI300A' else 8
            kinds[name] = HostSpec(hostname=name, model=model, gpus=gpus,
                                   mode=mode, nps='nps' + (nps or '1'))
    kinds['mi300x-mixed'] = HostSpec(
        hostname='mi300x-mixed', model='MI300X', gpus=8,
        gpu_modes=('gim-cpx', 'gim-cpx', 'spx', 'dpx', 'qpx', 'cpx', 'vfio',
                   'vfio'))
    kinds['mi300x-mixed-nps4'] = HostSpec(
        hostname='mi300x-mixed-nps4', model='MI300X', gpus=8, nps='nps4',
        gpu_modes=('cpx', 'qpx', 'gim-cpx', 'gim-cpx', 'vfio', 'cpx', 'cpx',
                   'cpx'))
    return kinds


#: Named host kinds (8 GPUs, or 4 APUs) covering every model and mode worth
#: simulating (tests and benchmarks loop over them).
KINDS: dict[str, HostSpec] = _kinds()


#: The most GPUs a simulated host can have (the PCI buses it uses).
MAX_GPUS = 16


def pf_address(index: int) -> PciAddress:
    """PCI address of the ``index``-th GPU of a simulated host."""
    if index < 8:
        bus = 0x05 + 0x20 * index
    else:
        bus = 0x0d + 0x20 * (index - 8) % 0x100
    if bus > 0xff or index >= 16:
        raise exception.SimulationError(
            reason='at most 16 GPUs per simulated host (asked for GPU %d)'
            % index)
    return PciAddress(0, bus, 0, 0)


def _uid(hostname: str, address: PciAddress, part: int = 0) -> str:
    seed = '%s/%s/%d' % (hostname, address, part)
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


def _validate(spec: HostSpec, model: GpuModel) -> tuple[str, ...]:
    # the bounds first: modes() builds one entry per GPU
    if isinstance(spec.gpus, bool) or not isinstance(spec.gpus, int) or \
            not 1 <= spec.gpus <= MAX_GPUS:
        raise exception.SimulationError(
            reason='gpus %s is out of range; allowed: 1..%d' % (
                str(spec.gpus)[:40], MAX_GPUS))
    if len(spec.gpu_modes) > MAX_GPUS:
        raise exception.SimulationError(
            reason='%d per-GPU modes; at most %d GPUs per host' % (
                len(spec.gpu_modes), MAX_GPUS))
    modes = spec.modes()
    if len(modes) != spec.gpus:
        raise exception.SimulationError(
            reason='gpus=%d but %d per-GPU modes given' % (
                spec.gpus, len(spec.gpu_modes)))
    nps = spec.nps.lower()
    if nps not in NPS_MODES:
        raise exception.SimulationError(
            reason='nps %r is not one of %s' % (spec.nps,
                                                ', '.join(NPS_MODES)))
    for mode in modes:
        if mode not in MODES:
            raise exception.SimulationError(
                reason='mode %r is not one of %s' % (mode, ', '.join(MODES)))
        if mode in GIM_MODES and model.vf_device_id is None:
            raise exception.SimulationError(
                reason='%s has no SR-IOV VFs, so mode %s is impossible'
                % (model.name, mode))
        if mode in GIM_MODES and not spec.off_catalog:
            # the VF counts GIM supports on this model (the VBIOS decides)
            try:
                catalog.check_vf_count(model, GIM_MODES[mode])
            except exception.InvalidPartitionMode as err:
                raise exception.SimulationError(
                    reason='mode %s: %s (modes: %s)' % (
                        mode, err, ', '.join(gim_modes(model)) or 'none')
                ) from None
        if mode in BARE_MODES and (model.compute_units is None
                                   or model.vram_mib is None):
            raise exception.SimulationError(
                reason='the catalog does not know the CUs and VRAM of %s, '
                'so mode %s cannot be simulated; use a gim or vfio mode'
                % (model.name, mode))
        if mode in BARE_MODES and model.partition_modes:
            try:
                catalog.check_modes(model, mode, nps)
            except exception.InvalidPartitionMode as err:
                raise exception.SimulationError(reason=str(err)) from None
        elif mode in BARE_MODES and mode != 'spx':
            raise exception.SimulationError(
                reason='%s has no compute partitions; use mode spx'
                % model.name)
    return modes


def design_host(spec: HostSpec) -> HostInventory:
    """The inventory a host built from ``spec`` yields when scanned.

    :raises SimulationError: the spec asks for something the hardware
        cannot do (naming the field).
    :raises UnknownModel: ``spec.model`` is not in the catalog.
    """
    model = catalog.by_name(spec.model)
    modes = _validate(spec, model)
    nps = spec.nps.upper()
    vram_mib = (model.vram_mib or 0) - VRAM_SHORTFALL_MIB
    gpus = []
    kfd_node = CPU_NODES
    # DRM minors are handed out in probe order to amdgpu-bound GPUs only.
    next_card, next_render = FIRST_CARD_MINOR, FIRST_RENDER_MINOR
    for k, mode in enumerate(modes):
        address = pf_address(k)
        numa = 0 if k < (spec.gpus + 1) // 2 else 1
        base = Gpu(address=address, device_id=model.pf_device_id,
                   model=model, subsystem_vendor_id=0x1002,
                   subsystem_device_id=model.pf_device_id,
                   pci_class=model.pci_class, numa_node=numa,
                   iommu_group=20 + k,
                   sriov_totalvfs=(max(model.vf_counts) if model.vf_counts
                                   else None))
        if mode in GIM_MODES:
            count = GIM_MODES[mode]
            vfs = tuple(VirtualFunction(
                address=PciAddress(0, address.bus, 2, i), index=i,
                device_id=model.vf_device_id or 0, driver=Driver.VFIO_PCI,
                iommu_group=100 + 8 * k + i, numa_node=numa)
                for i in range(count))
            gpus.append(dataclasses.replace(
                base, driver=Driver.GIM, sriov_numvfs=count, vfs=vfs,
                sriov_totalvfs=max(count, base.sriov_totalvfs or 0)))
            continue
        sriov_numvfs = 0 if model.vf_counts else None
        if mode == VFIO_MODE:
            gpus.append(dataclasses.replace(
                base, driver=Driver.VFIO_PCI, sriov_numvfs=sriov_numvfs))
            continue
        uid = _uid(spec.hostname, address)
        base = dataclasses.replace(
            base, driver=Driver.AMDGPU, compute_units=model.compute_units,
            vram_mib=vram_mib, unique_id=uid,
            product_name=model.product_name, sriov_numvfs=sriov_numvfs,
            health=GpuHealth(ras=tuple(RasCount(b) for b in RAS_BLOCKS)))
        if model.partition_modes:
            count = catalog.partitions_in_mode(model, mode)
            render_base, card_base = next_render, next_card
            next_render += MINORS_PER_GPU
            next_card += MINORS_PER_GPU
            mems = model.memory_modes
            base = dataclasses.replace(
                base, compute_partition=mode.upper(), memory_partition=nps,
                available_compute_partitions=tuple(
                    m for m, allowed in model.partition_modes
                    if nps in allowed),
                available_memory_partitions=mems if len(mems) > 1 else ())
        else:
            count = 1
            render_base, card_base = next_render, next_card
            next_render += 1
            next_card += 1
        parts = []
        for p in range(count):
            if card_base + p > MAX_CARD_MINOR:
                break
            parts.append(Partition(
                index=p, compute_units=(model.compute_units or 0) // count,
                vram_mib=vram_mib // count, kfd_node=kfd_node,
                render_minor=render_base + p, card_minor=card_base + p,
                location_id=(address.bus << 8) | (address.device << 3) | p,
                unique_id=uid if p == 0 else _uid(spec.hostname, address,
                                                  p)))
            kfd_node += 1
        gpus.append(dataclasses.replace(base, partitions=tuple(parts)))
    gim = spec.gim_version if any(m in GIM_MODES for m in modes) else None
    return HostInventory(hostname=spec.hostname, gpus=tuple(gpus),
                         source='simulated', gim_version=gim)


def simulate_host(spec: HostSpec, root: str,
                  legacy_xcp_names: bool = False) -> HostInventory:
    """Write the tree of ``spec`` below ``root``; return its inventory."""
    inventory = design_host(spec)
    write_tree(inventory, root, legacy_xcp_names)
    return inventory


__all__ = ['HostSpec', 'KINDS', 'MODES', 'design_host', 'pf_address',
           'simulate_host', 'write_tree']
