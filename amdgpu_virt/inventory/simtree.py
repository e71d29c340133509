"""The sysfs tree of a simulated host: what a real kernel would show.

:func:`write_tree` lays out, below a root directory, the files and links
the sysfs driver (:mod:`amdgpu_virt.inventory.sysfs`) reads, for any
:class:`~amdgpu_virt.model.HostInventory` (usually one
:func:`~amdgpu_virt.inventory.simulate.design_host` made); the paths and
file names come from :mod:`amdgpu_virt.inventory.layout`, which the reader
uses too. Writing the same inventory twice changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import readings
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import MIB
from amdgpu_virt.model import Partition
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import RasCount

#: KFD lists this many CPU nodes before the GPUs
CPU_NODES = 2
MAX_CARD_MINOR = layout.MAX_CARD_MINOR
MINORS_PER_GPU = layout.MINORS_PER_GPU

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
DRM_MAJOR = layout.DRM_MAJOR
#: /dev/kfd's major is dynamic; one seen on ROCm hosts
KFD_MAJOR = 237
#: VF routing id offset and stride: VF i of PF BB:00.0 is BB:02.i
SRIOV_OFFSET = 16
SRIOV_STRIDE = 1
SIMD_PER_CU = layout.SIMD_PER_CU
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


#: what an idle GPU shows: VRAM the driver holds, sensors, socket power
IDLE_VRAM_USED = 283115520
IDLE_TEMPERATURES = {'edge': 32000, 'junction': 35000, 'mem': 30000}
IDLE_POWER_MICROWATTS = 140000000


def multi_aid(gpu: Gpu) -> bool:
    """MI300-class (CDNA3/CDNA4): hwmon hides temp1 (edge) and offers only
    the instantaneous ``power1_input``."""
    return gpu.model.family in ('CDNA3', 'CDNA4')


def ras_features(gpu: Gpu) -> int:
    """The ``ras/features`` mask of the blocks ``gpu.health`` lists."""
    mask = 0
    for count in gpu.health.ras if gpu.health else ():
        if count.block in readings.RAS_BLOCKS:
            mask |= 1 << readings.RAS_BLOCKS.index(count.block)
    return mask


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
            # never blocks: a FIFO planted where a file belongs is replaced
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            # missing, or a dangling or looping link planted there
            if os.path.islink(full):
                os.unlink(full)
            self._ensure_dir(os.path.dirname(full))
        else:
            try:
                regular = stat.S_ISREG(os.fstat(fd).st_mode)
                current = os.read(fd, len(data) + 1) if regular else b''
            except OSError:
                current = b''
            finally:
                os.close(fd)
            if current == data:
                return
            if not regular:
                os.unlink(full)
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
        self.next_hwmon = 0

    # PCI ------------------------------------------------------------------

    def pci_function(self, path: str, address: PciAddress, vendor: int,
                     device: int, pci_class: int | None,
                     driver: str | None, numa: int | None,
                     iommu_group: int | None,
                     subsystem: tuple[int, int] | None = None) -> None:
        tree = self.tree
        name = _pci_name(address)
        tree.write(path + '/' + layout.VENDOR, '0x%04x' % vendor)
        tree.write(path + '/' + layout.DEVICE, '0x%04x' % device)
        sub_vendor, sub_device = subsystem or (vendor, device)
        tree.write(path + '/' + layout.SUBSYSTEM_VENDOR, '0x%04x' % sub_vendor)
        tree.write(path + '/' + layout.SUBSYSTEM_DEVICE, '0x%04x' % sub_device)
        if pci_class is not None:
            tree.write(path + '/' + layout.CLASS, '0x%06x' % pci_class)
        tree.write(path + '/' + layout.NUMA_NODE, -1 if numa is None else numa)
        tree.link(path + '/' + layout.SUBSYSTEM, layout.PCI_BUS)
        if driver:
            tree.link(path + '/' + layout.DRIVER,
                      layout.PCI_DRIVERS + '/' + driver)
            tree.link('%s/%s/%s' % (layout.PCI_DRIVERS, driver, name), path)
        if iommu_group is not None:
            group = '%s/%d' % (layout.IOMMU_GROUPS, iommu_group)
            tree.link(path + '/' + layout.IOMMU_GROUP, group)
            tree.link(group + '/devices/' + name, path)
        tree.link(layout.PCI_DEVICES + '/' + name, path)

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
            tree.write(path + '/' + layout.SRIOV_TOTALVFS, gpu.sriov_totalvfs)
            tree.write(path + '/' + layout.SRIOV_NUMVFS, gpu.sriov_numvfs or 0)
            tree.write(path + '/' + layout.SRIOV_OFFSET, SRIOV_OFFSET)
            tree.write(path + '/' + layout.SRIOV_STRIDE, SRIOV_STRIDE)
            tree.write(path + '/' + layout.SRIOV_VF_DEVICE,
                       '%04x' % (gpu.model.vf_device_id or 0))
        parent = path.rsplit('/', 1)[0]
        for vf in gpu.vfs:
            vf_path = '%s/%s' % (parent, _pci_name(vf.address))
            self.pci_function(vf_path, vf.address, gpu.vendor_id,
                              vf.device_id, gpu.pci_class,
                              _driver_name(vf.driver), vf.numa_node,
                              vf.iommu_group, subsystem)
            tree.link('%s/%s%d' % (path, layout.VIRTFN, vf.index), vf_path)
            tree.link(vf_path + '/' + layout.PHYSFN, path)
        if gpu.driver is Driver.AMDGPU:
            self.amdgpu_attributes(path, gpu)

    def amdgpu_attributes(self, path: str, gpu: Gpu) -> None:
        tree = self.tree
        if gpu.compute_partition is not None:
            tree.write(path + '/' + layout.CURRENT_COMPUTE_PARTITION,
                       gpu.compute_partition)
            tree.write(path + '/' + layout.AVAILABLE_COMPUTE_PARTITION,
                       ', '.join(gpu.available_compute_partitions))
            tree.write(path + '/' + layout.CURRENT_MEMORY_PARTITION,
                       gpu.memory_partition or 'UNKNOWN')
            if len(gpu.available_memory_partitions) > 1:
                tree.write(path + '/' + layout.AVAILABLE_MEMORY_PARTITION,
                           ', '.join(gpu.available_memory_partitions))
        if gpu.vram_mib is not None:
            tree.write(path + '/' + layout.MEM_INFO_VRAM_TOTAL,
                       gpu.vram_mib * MIB)
        if gpu.unique_id is not None:
            tree.write(path + '/' + layout.UNIQUE_ID, gpu.unique_id)
        if gpu.product_name is not None:
            tree.write(path + '/' + layout.PRODUCT_NAME, gpu.product_name)
        self.telemetry(path, gpu)
        self.drm_minors(path, gpu)

    def telemetry(self, path: str, gpu: Gpu) -> None:
        """An idle GPU's telemetry, its hwmon sensors and its RAS counts."""
        tree = self.tree
        tree.write(path + '/' + layout.MEM_INFO_VRAM_USED, IDLE_VRAM_USED)
        tree.write(path + '/' + layout.GPU_BUSY_PERCENT, 0)
        tree.write(path + '/' + layout.MEM_BUSY_PERCENT, 0)
        name = 'hwmon%d' % self.next_hwmon
        self.next_hwmon += 1
        monitor = '%s/%s/%s' % (path, layout.HWMON_DIR, name)
        tree.write(monitor + '/' + layout.HWMON_NAME, 'amdgpu')
        sensors = (('junction', 2), ('mem', 3)) if multi_aid(gpu) else (
            ('edge', 1), ('junction', 2), ('mem', 3))
        for label, index in sensors:
            tree.write(monitor + '/' + layout.TEMP_INPUT % index,
                       IDLE_TEMPERATURES[label])
            tree.write(monitor + '/' + layout.TEMP_LABEL % index, label)
        tree.write(monitor + '/' + (layout.POWER_INPUT if multi_aid(gpu)
                                    else layout.POWER_AVERAGE),
                   IDLE_POWER_MICROWATTS)
        tree.link(layout.HWMON_CLASS + '/' + name, monitor)
        if gpu.health is None:
            return
        ras = path + '/' + layout.RAS_DIR
        tree.write(ras + '/' + layout.RAS_FEATURES,
                   'feature mask: 0x%x' % ras_features(gpu))
        for count in gpu.health.ras:
            tree.write(ras + '/' + count.block + layout.RAS_COUNT_SUFFIX,
                       ras_text(count))

    # DRM --------------------------------------------------------------------

    def drm_node(self, drm_dir: str, device_path: str, kind: str,
                 minor: int) -> None:
        name = '%s%d' % (kind, minor)
        node = '%s/%s' % (drm_dir, name)
        self.tree.write(node + '/' + layout.DEV, '%d:%d' % (DRM_MAJOR, minor))
        self.tree.link(node + '/' + layout.DEVICE, device_path)
        self.tree.link(layout.DRM_CLASS + '/' + name, node)

    def drm_minors(self, path: str, gpu: Gpu) -> None:
        if not gpu.partitions:
            return
        first = gpu.partitions[0]
        if first.index != 0 or first.card_minor is None:
            return
        card, render = first.card_minor, first.render_minor
        self.drm_node(path + '/drm', path, layout.CARD, card)
        if render is not None:
            self.drm_node(path + '/drm', path, layout.RENDER, render)
        if gpu.compute_partition is None:
            return
        # Partitions 1..7 are platform devices made at probe time, whatever
        # the current mode; a device whose card minor would pass 63 gets no
        # DRM nodes (and no KFD node: the 63-partition quirk).
        for p in range(1, MINORS_PER_GPU):
            name = (layout.LEGACY_XCP_NAME if self.legacy_xcp_names
                    else layout.XCP_NAME) % self.next_xcp
            self.next_xcp += 1
            platform = layout.PLATFORM_DEVICES + '/' + name
            self.tree.mkdir(platform)
            if card + p > MAX_CARD_MINOR:
                continue
            self.drm_node(platform + '/drm', platform, layout.CARD, card + p)
            if render is not None:
                self.drm_node(platform + '/drm', platform, layout.RENDER,
                              render + p)

    # KFD --------------------------------------------------------------------

    def kfd(self) -> None:
        nodes = [(gpu, part) for gpu in self.inventory.gpus
                 for part in gpu.partitions]
        if not nodes:
            return
        tree = self.tree
        topology = layout.KFD_TOPOLOGY
        tree.link(layout.KFD_CLASS, layout.KFD_DEVICE)
        tree.write(layout.KFD_DEVICE + '/' + layout.DEV, '%d:0' % KFD_MAJOR)
        tree.write(topology + '/' + layout.GENERATION_ID, 1)
        tree.write(topology + '/' + layout.SYSTEM_PROPERTIES,
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
        self.tree.write(base + '/' + layout.PROPERTIES, '\n'.join(
            '%s %d' % item for item in props.items()))
        self.tree.write(base + '/' + layout.NODE_NAME, name or '')
        gpu_id = 0
        if props['simd_count']:
            gpu_id = int(hashlib.sha256(repr(sorted(props.items())).encode())
                         .hexdigest()[:4], 16) or 1
        self.tree.write(base + '/' + layout.GPU_ID, gpu_id)
        self.tree.write(base + '/' + layout.MEM_BANK_PROPERTIES, '\n'.join((
            'heap_type %d' % (1 if props['simd_count'] else 0),
            'size_in_bytes %d' % mem_bytes, 'flags 0', 'width 4096',
            'mem_clk_max 1300')))

    def write(self) -> None:
        self.tree.mkdir(layout.PCI_DEVICES)
        self.tree.mkdir(layout.DRM_CLASS)
        self.vga()
        for gpu in sorted(self.inventory.gpus, key=lambda g: g.address):
            self.gpu(gpu)
        self.kfd()
        if self.inventory.gim_version is not None:
            self.tree.write(layout.GIM_VERSION, self.inventory.gim_version)
            self.tree.mkdir(layout.PCI_DRIVERS + '/gim')


def ras_text(count: RasCount) -> str:
    """A ``<block>_err_count`` file as the kernel prints it (no newline);
    the ``de:`` line only when there are deferred errors."""
    text = 'ue: %d\nce: %d' % (count.uncorrectable, count.correctable)
    if count.deferred:
        text += '\nde: %d' % count.deferred
    return text


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
