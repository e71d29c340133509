"""Simulated hosts: what a real host of a given kind looks like.

:func:`design_host` is pure: it returns the :class:`HostInventory` a host
built from a :class:`HostSpec` must produce when scanned. The sysfs writer
(:func:`write_tree`) lays out the files a real kernel would show for the
same host, so that ``scan(write_tree(design_host(spec)))`` can be compared
with ``design_host(spec)``.

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
* KFD lists two CPU nodes first, then one node per partition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import MIB
from amdgpu_virt.model import Partition
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import VirtualFunction

BARE_MODES = ('spx', 'dpx', 'tpx', 'qpx', 'cpx')
GIM_MODES = {'gim-spx': 1, 'gim-dpx': 2, 'gim-qpx': 4, 'gim-cpx': 8}
#: PF bound to vfio-pci for whole-GPU passthrough
VFIO_MODE = 'vfio'
MODES = BARE_MODES + tuple(GIM_MODES) + (VFIO_MODE,)
NPS_MODES = ('nps1', 'nps2', 'nps4')

CPU_NODES = 2
FIRST_RENDER_MINOR = 128
#: card0 belongs to the onboard VGA controller of the server
FIRST_CARD_MINOR = 1
MAX_CARD_MINOR = 63
MINORS_PER_GPU = 8
#: what the VBIOS reports beyond the nominal size (MI300X: 206141652992 B)
VRAM_SHORTFALL_MIB = 16


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """What to simulate.

    :param mode: one of :data:`MODES` for every GPU, unless ``gpu_modes``
        gives one mode per GPU (a mixed host).
    :param nps: memory mode of the bare-metal GPUs (one per host).
    """

    hostname: str
    model: str = 'MI300X'
    gpus: int = 8
    mode: str = 'spx'
    nps: str = 'nps1'
    gpu_modes: tuple[str, ...] = ()
    gim_version: str = '8.1.0.K'

    def modes(self) -> tuple[str, ...]:
        if self.gpu_modes:
            return tuple(m.lower() for m in self.gpu_modes)
        return (self.mode.lower(),) * self.gpus


def _kinds() -> dict[str, HostSpec]:
    kinds = {}
    for model, modes in (
            ('MI300X', ('spx', 'dpx', 'dpx-nps2', 'qpx', 'qpx-nps4', 'cpx',
                        'cpx-nps4', 'gim-spx', 'gim-dpx', 'gim-qpx',
                        'gim-cpx', 'vfio')),
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
    modes = spec.modes()
    if not 1 <= spec.gpus <= MAX_GPUS:
        raise exception.SimulationError(
            reason='gpus %d is out of range; allowed: 1..%d' % (
                spec.gpus, MAX_GPUS))
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
            product_name=model.product_name, sriov_numvfs=sriov_numvfs)
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


# --- the sysfs tree of a simulated host ------------------------------------

#: Onboard VGA controller (ASPEED AST2600) that holds ``card0``.
VGA_ADDRESS = PciAddress(0, 0xc2, 0, 0)
VGA_BRIDGE = PciAddress(0, 0xc1, 0, 0)
VGA_ROOT_PORT = PciAddress(0, 0xc0, 5, 2)
ASPEED_VENDOR_ID = 0x1a03
ASPEED_VGA_DEVICE_ID = 0x2000
ASPEED_BRIDGE_DEVICE_ID = 0x1150
#: AMD (CPU) root ports and a Broadcom PCIe switch in front of each GPU
ROOT_PORT_IDS = (0x1022, 0x14ab)
SWITCH_PORT_IDS = (0x1000, 0xc030)
BRIDGE_CLASS = 0x060400
VGA_CLASS = 0x030000
DRM_MAJOR = 226
#: /dev/kfd's major is dynamic; one seen on ROCm hosts
KFD_MAJOR = 237
#: VF routing id offset and stride: VF i of PF BB:00.0 is BB:02.i
SRIOV_OFFSET = 16
SRIOV_STRIDE = 1
SIMD_PER_CU = 4
ARRAYS_PER_XCC = 4
CPU_CORES_PER_NODE = 96

#: Key order of a KFD GPU node ``properties`` file, as the kernel prints it.
KFD_NODE_KEYS = (
    'cpu_cores_count', 'simd_count', 'mem_banks_count', 'caches_count',
    'io_links_count', 'p2p_links_count', 'cpu_core_id_base', 'simd_id_base',
    'max_waves_per_simd', 'lds_size_in_kb', 'gds_size_in_kb', 'num_gws',
    'wave_front_size', 'array_count', 'simd_arrays_per_engine',
    'cu_per_simd_array', 'simd_per_cu', 'max_slots_scratch_cu',
    'gfx_target_version', 'vendor_id', 'device_id', 'location_id', 'domain',
    'drm_render_minor', 'hive_id', 'num_sdma_engines',
    'num_sdma_xgmi_engines', 'num_sdma_queues_per_engine', 'num_cp_queues',
    'max_engine_clk_fcompute', 'local_mem_size', 'fw_version', 'capability',
    'debug_prop', 'sdma_fw_version', 'unique_id', 'num_xcc',
    'max_engine_clk_ccompute')


def _pci_name(address: PciAddress) -> str:
    return str(address)


class _TreeWriter:
    """Writes files and relative symlinks below one root directory.

    A file or link that already has the wanted content is left alone, so
    writing the same tree twice changes nothing.
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self._dirs: set[str] = set()

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _ensure_dir(self, directory: str) -> None:
        if directory not in self._dirs:
            os.makedirs(directory, exist_ok=True)
            self._dirs.add(directory)

    def write(self, rel: str, value: object) -> None:
        full = self.path(rel)
        data = ('%s\n' % (value,)).encode('ascii')
        try:
            fd = os.open(full, os.O_RDONLY)
        except FileNotFoundError:
            self._ensure_dir(os.path.dirname(full))
        else:
            try:
                current = os.read(fd, len(data) + 1)
            except OSError:
                current = b''
            finally:
                os.close(fd)
            if current == data:
                return
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def mkdir(self, rel: str) -> None:
        self._ensure_dir(self.path(rel))

    def link(self, rel: str, target_rel: str) -> None:
        """Make ``rel`` a relative symlink to ``target_rel`` (both rooted)."""
        full = self.path(rel)
        parent = os.path.dirname(full)
        target = os.path.relpath(self.path(target_rel), parent)
        try:
            if os.readlink(full) == target:
                return
            os.unlink(full)
        except FileNotFoundError:
            self._ensure_dir(parent)
        os.symlink(target, full)


def _device_path(address: PciAddress) -> str:
    """``devices/...`` path of a GPU PF: root port, switch port, device."""
    domain, bus = address.domain, address.bus
    root_bus = bus & 0xe0
    parts = ['devices', 'pci%04x:%02x' % (domain, root_bus),
             '%04x:%02x:01.1' % (domain, root_bus)]
    if bus - 1 > root_bus:
        parts.append('%04x:%02x:00.0' % (domain, bus - 1))
    parts.append(_pci_name(address))
    return '/'.join(parts)


class _HostWriter:
    """Lays out the sysfs tree of one :class:`HostInventory`."""

    def __init__(self, inventory: HostInventory, root: str,
                 legacy_xcp_names: bool) -> None:
        self.inventory = inventory
        self.tree = _TreeWriter(root)
        self.legacy_xcp_names = legacy_xcp_names
        self.next_xcp = 0

    # PCI ------------------------------------------------------------------

    def pci_function(self, path: str, address: PciAddress, vendor: int,
                     device: int, pci_class: int | None,
                     driver: str | None, numa: int | None,
                     iommu_group: int | None,
                     subsystem: tuple[int, int] | None = None) -> None:
        tree = self.tree
        name = _pci_name(address)
        tree.write(path + '/vendor', '0x%04x' % vendor)
        tree.write(path + '/device', '0x%04x' % device)
        sub_vendor, sub_device = subsystem or (vendor, device)
        tree.write(path + '/subsystem_vendor', '0x%04x' % sub_vendor)
        tree.write(path + '/subsystem_device', '0x%04x' % sub_device)
        if pci_class is not None:
            tree.write(path + '/class', '0x%06x' % pci_class)
        tree.write(path + '/numa_node', -1 if numa is None else numa)
        tree.link(path + '/subsystem', 'bus/pci')
        if driver:
            tree.link(path + '/driver', 'bus/pci/drivers/' + driver)
            tree.link('bus/pci/drivers/%s/%s' % (driver, name), path)
        if iommu_group is not None:
            group = 'kernel/iommu_groups/%d' % iommu_group
            tree.link(path + '/iommu_group', group)
            tree.link(group + '/devices/' + name, path)
        tree.link('bus/pci/devices/' + name, path)

    def bridges(self, address: PciAddress) -> None:
        path = _device_path(address).split('/')
        for depth in range(2, len(path) - 1):
            bridge = PciAddress.parse(path[depth])
            ids = ROOT_PORT_IDS if depth == 2 else SWITCH_PORT_IDS
            self.pci_function('/'.join(path[:depth + 1]), bridge, ids[0],
                              ids[1], BRIDGE_CLASS, 'pcieport', None, None)

    def vga(self) -> None:
        taken = {gpu.address.bus for gpu in self.inventory.gpus}
        if taken & {VGA_ADDRESS.bus, VGA_BRIDGE.bus, VGA_ROOT_PORT.bus}:
            return
        root_port = 'devices/pci0000:c0/%s' % VGA_ROOT_PORT
        bridge = '%s/%s' % (root_port, VGA_BRIDGE)
        vga = '%s/%s' % (bridge, VGA_ADDRESS)
        self.pci_function(root_port, VGA_ROOT_PORT, *ROOT_PORT_IDS,
                          BRIDGE_CLASS, 'pcieport', None, None)
        self.pci_function(bridge, VGA_BRIDGE, ASPEED_VENDOR_ID,
                          ASPEED_BRIDGE_DEVICE_ID, BRIDGE_CLASS, None, 0, 40)
        self.pci_function(vga, VGA_ADDRESS, ASPEED_VENDOR_ID,
                          ASPEED_VGA_DEVICE_ID, VGA_CLASS, 'ast', 0, 40)
        self.drm_node(vga + '/drm', vga, 'card', 0)

    def gpu(self, gpu: Gpu) -> None:
        path = _device_path(gpu.address)
        self.bridges(gpu.address)
        subsystem = None
        if gpu.subsystem_vendor_id is not None:
            subsystem = (gpu.subsystem_vendor_id,
                         gpu.subsystem_device_id or gpu.device_id)
        self.pci_function(path, gpu.address, gpu.vendor_id, gpu.device_id,
                          gpu.pci_class, _driver_name(gpu.driver),
                          gpu.numa_node, gpu.iommu_group, subsystem)
        tree = self.tree
        if gpu.sriov_totalvfs is not None:
            tree.write(path + '/sriov_totalvfs', gpu.sriov_totalvfs)
            tree.write(path + '/sriov_numvfs', gpu.sriov_numvfs or 0)
            tree.write(path + '/sriov_offset', SRIOV_OFFSET)
            tree.write(path + '/sriov_stride', SRIOV_STRIDE)
            tree.write(path + '/sriov_vf_device',
                       '%04x' % (gpu.model.vf_device_id or 0))
        parent = path.rsplit('/', 1)[0]
        for vf in gpu.vfs:
            vf_path = '%s/%s' % (parent, _pci_name(vf.address))
            self.pci_function(vf_path, vf.address, gpu.vendor_id,
                              vf.device_id, gpu.pci_class,
                              _driver_name(vf.driver), vf.numa_node,
                              vf.iommu_group, subsystem)
            tree.link('%s/virtfn%d' % (path, vf.index), vf_path)
            tree.link(vf_path + '/physfn', path)
        if gpu.driver is Driver.AMDGPU:
            self.amdgpu_attributes(path, gpu)

    def amdgpu_attributes(self, path: str, gpu: Gpu) -> None:
        tree = self.tree
        if gpu.compute_partition is not None:
            tree.write(path + '/current_compute_partition',
                       gpu.compute_partition)
            tree.write(path + '/available_compute_partition',
                       ', '.join(gpu.available_compute_partitions))
            tree.write(path + '/current_memory_partition',
                       gpu.memory_partition or 'UNKNOWN')
            if len(gpu.available_memory_partitions) > 1:
                tree.write(path + '/available_memory_partition',
                           ', '.join(gpu.available_memory_partitions))
        if gpu.vram_mib is not None:
            tree.write(path + '/mem_info_vram_total', gpu.vram_mib * MIB)
        if gpu.unique_id is not None:
            tree.write(path + '/unique_id', gpu.unique_id)
        if gpu.product_name is not None:
            tree.write(path + '/product_name', gpu.product_name)
        self.drm_minors(path, gpu)

    # DRM --------------------------------------------------------------------

    def drm_node(self, drm_dir: str, device_path: str, kind: str,
                 minor: int) -> None:
        name = '%s%d' % (kind, minor)
        node = '%s/%s' % (drm_dir, name)
        self.tree.write(node + '/dev', '%d:%d' % (DRM_MAJOR, minor))
        self.tree.link(node + '/device', device_path)
        self.tree.link('class/drm/' + name, node)

    def drm_minors(self, path: str, gpu: Gpu) -> None:
        if not gpu.partitions:
            return
        first = gpu.partitions[0]
        if first.index != 0 or first.card_minor is None:
            return
        card, render = first.card_minor, first.render_minor
        self.drm_node(path + '/drm', path, 'card', card)
        if render is not None:
            self.drm_node(path + '/drm', path, 'renderD', render)
        if gpu.compute_partition is None:
            return
        # Partitions 1..7 are platform devices made at probe time, whatever
        # the current mode; a device whose card minor would pass 63 gets no
        # DRM nodes (and no KFD node: the 63-partition quirk).
        for p in range(1, MINORS_PER_GPU):
            name = ('amdgpu_xcp.%d' if self.legacy_xcp_names
                    else 'amdgpu_xcp_%d') % self.next_xcp
            self.next_xcp += 1
            platform = 'devices/platform/' + name
            self.tree.mkdir(platform)
            if card + p > MAX_CARD_MINOR:
                continue
            self.drm_node(platform + '/drm', platform, 'card', card + p)
            if render is not None:
                self.drm_node(platform + '/drm', platform, 'renderD',
                              render + p)

    # KFD --------------------------------------------------------------------

    def kfd(self) -> None:
        nodes = [(gpu, part) for gpu in self.inventory.gpus
                 for part in gpu.partitions]
        if not nodes:
            return
        tree = self.tree
        topology = 'devices/virtual/kfd/kfd/topology'
        tree.link('class/kfd/kfd', 'devices/virtual/kfd/kfd')
        tree.write('devices/virtual/kfd/kfd/dev', '%d:0' % KFD_MAJOR)
        tree.write(topology + '/generation_id', 1)
        tree.write(topology + '/system_properties',
                   'platform_oem 0\nplatform_id 0\nplatform_rev 0')
        used = {part.kfd_node for _gpu, part in nodes
                if part.kfd_node is not None}
        cpu_nodes = min(used) if used else CPU_NODES
        for number in range(cpu_nodes):
            self.kfd_node(topology, number, _cpu_properties(number), 0, None)
        next_node = max(used | {cpu_nodes - 1}) + 1
        for gpu, part in nodes:
            if part.kfd_node is None:
                number, next_node = next_node, next_node + 1
            else:
                number = part.kfd_node
            self.kfd_node(topology, number, _gpu_properties(gpu, part),
                          part.vram_mib * MIB, gpu.model.gfx)

    def kfd_node(self, topology: str, node: int, props: dict[str, int],
                 mem_bytes: int, name: str | None) -> None:
        base = '%s/nodes/%d' % (topology, node)
        self.tree.write(base + '/properties', '\n'.join(
            '%s %d' % item for item in props.items()))
        self.tree.write(base + '/name', name or '')
        gpu_id = 0
        if props['simd_count']:
            gpu_id = int(hashlib.sha256(repr(sorted(props.items())).encode())
                         .hexdigest()[:4], 16) or 1
        self.tree.write(base + '/gpu_id', gpu_id)
        self.tree.write(base + '/mem_banks/0/properties', '\n'.join((
            'heap_type %d' % (1 if props['simd_count'] else 0),
            'size_in_bytes %d' % mem_bytes, 'flags 0', 'width 4096',
            'mem_clk_max 1300')))

    def write(self) -> None:
        self.tree.mkdir('bus/pci/devices')
        self.tree.mkdir('class/drm')
        self.vga()
        for gpu in sorted(self.inventory.gpus, key=lambda g: g.address):
            self.gpu(gpu)
        self.kfd()
        if self.inventory.gim_version is not None:
            self.tree.write('module/gim/version', self.inventory.gim_version)
            self.tree.mkdir('bus/pci/drivers/gim')


def _driver_name(driver: Driver) -> str | None:
    if driver in (Driver.NONE, Driver.OTHER):
        return None
    return driver.value


def _cpu_properties(node: int) -> dict[str, int]:
    props = dict.fromkeys(KFD_NODE_KEYS, 0)
    props.update(cpu_cores_count=CPU_CORES_PER_NODE, mem_banks_count=1,
                 cpu_core_id_base=node * CPU_CORES_PER_NODE,
                 max_engine_clk_ccompute=3700)
    return props


def _gpu_properties(gpu: Gpu, part: Partition) -> dict[str, int]:
    model = gpu.model
    count = 1
    if gpu.compute_partition is not None:
        try:
            count = catalog.partitions_in_mode(model, gpu.compute_partition)
        except exception.InvalidPartitionMode:
            count = 1
    num_xcc = max(1, (model.xcds or 1) // count)
    arrays = ARRAYS_PER_XCC * num_xcc
    location = part.location_id
    if location is None:
        location = ((gpu.address.bus << 8) | (gpu.address.device << 3)
                    | part.index)
    props = dict.fromkeys(KFD_NODE_KEYS, 0)
    props.update(
        simd_count=part.compute_units * SIMD_PER_CU, mem_banks_count=1,
        simd_id_base=2147487744 + 16 * (part.kfd_node or 0),
        max_waves_per_simd=8,
        lds_size_in_kb=160 if model.family == 'CDNA4' else 64,
        num_gws=64, wave_front_size=64, array_count=arrays,
        simd_arrays_per_engine=1,
        cu_per_simd_array=-(-part.compute_units // arrays),
        simd_per_cu=SIMD_PER_CU, max_slots_scratch_cu=32,
        gfx_target_version=model.gfx_target_version or 0,
        vendor_id=gpu.vendor_id, device_id=gpu.device_id,
        location_id=location, domain=gpu.address.domain,
        drm_render_minor=(-1 if part.render_minor is None
                          else part.render_minor),
        hive_id=gpu.hive_id or 0, num_sdma_engines=2,
        num_sdma_xgmi_engines=6,
        num_sdma_queues_per_engine=8, num_cp_queues=24 * num_xcc,
        max_engine_clk_fcompute=2100, fw_version=177, capability=746083968,
        debug_prop=1495, sdma_fw_version=19,
        unique_id=int(part.unique_id, 16) if part.unique_id else 0,
        num_xcc=num_xcc, max_engine_clk_ccompute=3700)
    return props


def write_tree(inventory: HostInventory, root: str,
               legacy_xcp_names: bool = False) -> None:
    """Write the sysfs tree a real kernel would show for ``inventory``.

    Only the GPUs' facts are taken from ``inventory``; the rest (bridges,
    an onboard VGA controller on ``card0``, CPU KFD nodes) is what a real
    server adds around them. Writing the same inventory twice changes
    nothing.

    :param legacy_xcp_names: name the partition platform devices
        ``amdgpu_xcp.<i>`` as older kernels do, instead of ``amdgpu_xcp_<i>``.
    """
    _HostWriter(inventory, root, legacy_xcp_names).write()


def simulate_host(spec: HostSpec, root: str,
                  legacy_xcp_names: bool = False) -> HostInventory:
    """Write the tree of ``spec`` below ``root``; return its inventory."""
    inventory = design_host(spec)
    write_tree(inventory, root, legacy_xcp_names)
    return inventory
