"""Assembling GPUs from what :mod:`~amdgpu_virt.inventory.sysfs.files`
read: a GPU per physical function (or per VF whose PF is absent) with its
partitions, VFs and VRAM, and the host inventory with every warning.
"""

from __future__ import annotations

import os

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.inventory import base
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import sysfsparse as parse
from amdgpu_virt.inventory.sysfs.files import DRM_CLASS
from amdgpu_virt.inventory.sysfs.files import Function
from amdgpu_virt.inventory.sysfs.files import KFD_NODES
from amdgpu_virt.inventory.sysfs.files import KfdNode
from amdgpu_virt.inventory.sysfs.files import PCI_DEVICES
from amdgpu_virt.inventory.sysfs.files import Reader
from amdgpu_virt.inventory.sysfs.telemetry import read_ras
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import GpuHealth
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import MIB
from amdgpu_virt.model import Partition
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import VirtualFunction

GIM_VERSION = layout.GIM_VERSION


class Scan(Reader):
    """One scan of one sysfs tree: GPUs, partitions and VFs."""


    def model_of(self, fn: Function) -> GpuModel | None:
        """The catalog model of ``fn`` (a VF's family for a VF)."""
        device_id = fn.device_id or 0
        if fn.is_vf:
            return catalog.by_vf_device_id(device_id)
        return catalog.by_pf_device_id(device_id)

    def unknown_model(self, fn: Function, product_name: str | None,
                      compute_units: int | None,
                      vram_mib: int | None) -> GpuModel:
        device_id = fn.device_id or 0
        if fn.device_id is not None:
            self.warn(os.path.join(fn.path, layout.DEVICE),
                      'AMD device id 0x%04x is not in the catalog; reported '
                      'as unknown-%04x with what sysfs says' % (device_id,
                                                                device_id))
        return catalog.unknown_model(device_id, product_name=product_name,
                                     compute_units=compute_units,
                                     vram_mib=vram_mib)

    def partitions(self, fn: Function, nodes: list[KfdNode],
                   cards: dict[int, int]) -> tuple[Partition, ...]:
        result: dict[int, Partition] = {}
        for node in nodes:
            seen = result.get(node.partition)
            if seen is not None:
                self.warn(node.path, 'partition %d of %s already seen at KFD '
                          'node %s; ignored' % (node.partition, fn.address,
                                                seen.kfd_node))
                continue
            card = None
            if node.render_minor is not None:
                card = cards.get(node.render_minor)
                if card is None:
                    self.warn(node.path, 'no card shares a directory with '
                              'renderD%d in %s' % (node.render_minor,
                                                   DRM_CLASS))
            result[node.partition] = Partition(
                index=node.partition, compute_units=node.compute_units,
                vram_mib=node.vram_mib, kfd_node=node.node,
                render_minor=node.render_minor, card_minor=card,
                location_id=node.location_id, unique_id=node.unique_id)
        return tuple(result[index] for index in sorted(result))

    def expected_partitions(self, fn: Function, model: GpuModel | None,
                            mode: str | None) -> int | None:
        """Partitions ``mode`` makes on ``model`` (None if unknown)."""
        try:
            return base.expected_partitions(model, mode)
        except exception.InvalidPartitionMode as err:
            self.warn(os.path.join(fn.path, layout.CURRENT_COMPUTE_PARTITION),
                      str(err))
            return None

    def gpu(self, fn: Function, vfs: tuple[VirtualFunction, ...],
            nodes: list[KfdNode], cards: dict[int, int]) -> Gpu:
        compute = self.optional(fn, layout.CURRENT_COMPUTE_PARTITION,
                                parse.parse_mode, parse.COMPUTE_MODES)
        memory = self.optional(fn, layout.CURRENT_MEMORY_PARTITION,
                               parse.parse_mode, parse.MEMORY_MODES)
        available_compute = self.optional(
            fn, layout.AVAILABLE_COMPUTE_PARTITION, parse.parse_mode_list,
            parse.COMPUTE_MODES) or ()
        available_memory = self.optional(
            fn, layout.AVAILABLE_MEMORY_PARTITION, parse.parse_mode_list,
            parse.MEMORY_MODES) or ()
        vram_bytes = self.optional(fn, layout.MEM_INFO_VRAM_TOTAL,
                                   parse.parse_int)
        unique_id = self.optional(fn, layout.UNIQUE_ID, parse.parse_unique_id)
        product_name = self.optional(fn, layout.PRODUCT_NAME, parse.parse_name)
        partitions = self.partitions(fn, nodes, cards)
        vram_mib = None if vram_bytes is None else vram_bytes // MIB
        if vram_mib is None and partitions:
            vram_mib = sum(p.vram_mib for p in partitions)
        model = self.model_of(fn)
        expected = self.expected_partitions(fn, model, compute)
        compute_units = base.gpu_compute_units(partitions, expected)
        if expected is not None and len(partitions) < expected:
            self.warn(os.path.join(fn.path, layout.CURRENT_COMPUTE_PARTITION),
                      '%s implies %d partitions but KFD shows %d (%s); a '
                      'partition without DRM minors is not usable' % (
                          compute, expected, len(partitions),
                          ', '.join(str(p.index) for p in partitions)
                          or 'none'))
        beyond = [p.index for p in partitions
                  if expected is not None and p.index >= expected]
        if beyond and expected is not None:
            self.warn(os.path.join(fn.path, layout.CURRENT_COMPUTE_PARTITION),
                      '%s implies %d partitions but KFD shows partition(s) '
                      '%s too' % (compute, expected,
                                  ', '.join(map(str, beyond))))
        if model is None:
            model = self.unknown_model(fn, product_name, compute_units,
                                       vram_mib)
        hive_ids = {node.hive_id for node in nodes if node.hive_id}
        return Gpu(
            address=fn.address, device_id=fn.device_id or 0, model=model,
            driver=fn.driver, subsystem_vendor_id=fn.subsystem_vendor_id,
            subsystem_device_id=fn.subsystem_device_id,
            pci_class=fn.pci_class, numa_node=fn.numa_node,
            iommu_group=fn.iommu_group, compute_partition=compute,
            memory_partition=memory,
            available_compute_partitions=available_compute,
            available_memory_partitions=available_memory,
            compute_units=compute_units, vram_mib=vram_mib,
            unique_id=unique_id, product_name=product_name,
            sriov_totalvfs=self.optional(fn, layout.SRIOV_TOTALVFS,
                                         parse.parse_int, 0, 0xffff),
            sriov_numvfs=self.optional(fn, layout.SRIOV_NUMVFS,
                                       parse.parse_int, 0, 0xffff),
            vfs=vfs, partitions=partitions,
            hive_id=min(hive_ids) if hive_ids else None,
            health=self.health(fn))

    def health(self, fn: Function) -> GpuHealth | None:
        """The RAS counts of ``fn`` (None: it has no ``ras/``)."""
        if layout.RAS_DIR not in fn.entries:
            return None
        counts, problems = read_ras(self.root, fn.name)
        for _source, message in problems:
            path, _sep, what = message.partition(': ')
            self.warn(path, what)
        return None if counts is None else GpuHealth(ras=counts)

    def virtual_functions(self, pfs: dict[PciAddress, Function],
                          vfs: dict[PciAddress, Function]
                          ) -> tuple[dict[PciAddress,
                                          list[VirtualFunction]],
                                     list[Function]]:
        """VFs per PF, and the VFs whose PF is absent."""
        result: dict[PciAddress, list[VirtualFunction]] = {a: [] for a in pfs}
        claimed: set[PciAddress] = set()
        for pf in pfs.values():
            for index in sorted(pf.virtfns):
                address = pf.virtfns[index]
                vf = vfs.get(address)
                if vf is None:
                    self.warn(os.path.join(pf.path, '%s%d' % (
                        layout.VIRTFN, index)),
                              'points to %s, which is not an AMD GPU '
                              'function in %s' % (address, PCI_DEVICES))
                    continue
                claimed.add(address)
                result[pf.address].append(_vf(vf, index))
        orphans: list[Function] = []
        for address, vf in sorted(vfs.items()):
            if address in claimed:
                continue
            owner = pfs.get(vf.physfn) if vf.physfn is not None else None
            if owner is None:
                if vf.physfn_target is not None:
                    why = 'its physfn link points to %s, which is absent' % (
                        vf.physfn_target)
                else:
                    why = ('VF device id 0x%04x without a physfn link (a VF '
                           'passed into a guest?)' % (vf.device_id or 0))
                self.warn(vf.path, '%s; reported as a GPU of its own' % why)
                orphans.append(vf)
                continue
            taken = {v.index for v in result[owner.address]}
            computed = self.vf_index(owner, vf)
            if computed is None or computed in taken:
                index = max(taken | {-1}) + 1
            else:
                index = computed
            self.warn(vf.path, 'VF of %s not listed as a virtfn link of it; '
                      'reported as its VF %d' % (owner.address, index))
            result[owner.address].append(_vf(vf, index))
        for items in result.values():
            items.sort(key=lambda v: v.index)
        return result, orphans

    def vf_index(self, pf: Function, vf: Function) -> int | None:
        """VF index from the routing ids, ``sriov_offset``/``_stride``."""
        offset = self.optional(pf, layout.SRIOV_OFFSET, parse.parse_int, 0,
                               0xffff)
        stride = self.optional(pf, layout.SRIOV_STRIDE, parse.parse_int, 1,
                               0xffff)
        if offset is None or stride is None:
            return None
        delta = _routing_id(vf.address) - _routing_id(pf.address) - offset
        if delta < 0 or delta % stride:
            return None
        return delta // stride

    def gim_version(self, gpus: list[Gpu]) -> str | None:
        path = os.path.join(self.root, GIM_VERSION)
        if not os.path.exists(path):
            if any(gpu.driver is Driver.GIM for gpu in gpus):
                self.warn(path, 'missing although a GPU is bound to gim')
            return None
        return self.value(parse.parse_token, path)

    def scan(self, hostname: str) -> HostInventory:
        functions = self.pci_functions()
        pfs = {fn.address: fn for fn in functions if not fn.is_vf}
        vfs = {fn.address: fn for fn in functions if fn.is_vf}
        vfs_by_pf, orphans = self.virtual_functions(pfs, vfs)
        gpu_functions = sorted(list(pfs.values()) + orphans,
                               key=lambda f: f.address)
        by_slot: dict[tuple[int, int, int], Function] = {}
        for fn in gpu_functions:
            slot = (fn.address.domain, fn.address.bus, fn.address.device)
            by_slot.setdefault(slot, fn)
        nodes_of: dict[PciAddress, list[KfdNode]] = {
            fn.address: [] for fn in gpu_functions}
        kfd = self.kfd_nodes()
        for node in kfd or ():
            owner = by_slot.get((node.domain, node.bus, node.device))
            if owner is None:
                self.warn(node.path, 'location_id %d (%04x:%02x:%02x) matches '
                          'no AMD GPU in %s; ignored' % (
                              node.location_id, node.domain, node.bus,
                              node.device, PCI_DEVICES))
                continue
            nodes_of[owner.address].append(node)
        amdgpu = [fn for fn in gpu_functions if fn.driver is Driver.AMDGPU]
        if kfd is None and amdgpu:
            self.warn(os.path.join(self.root, KFD_NODES),
                      'missing although %s is bound to amdgpu: no partitions '
                      'or CU counts' % amdgpu[0].address)
        elif kfd is not None:
            for fn in amdgpu:
                if not nodes_of[fn.address]:
                    self.warn(fn.path, 'bound to amdgpu but no KFD node has '
                              'its location_id')
        cards = self.drm_cards() if kfd else {}
        gpus = [self.gpu(fn, tuple(vfs_by_pf.get(fn.address, ())),
                         nodes_of[fn.address], cards)
                for fn in gpu_functions]
        if not gpus:
            raise exception.NothingReadable(
                source=self.root, reason='no AMD GPU (vendor 0x1002, display '
                'or accelerator class) among the %d functions of %s' % (
                    self.pci_count, os.path.join(self.root, PCI_DEVICES)))
        gim_version = self.gim_version(gpus)
        return HostInventory(
            hostname=hostname, gpus=tuple(gpus),
            warnings=tuple(self.warnings), source='sysfs:%s' % self.root,
            gim_version=gim_version)


def _vf(fn: Function, index: int) -> VirtualFunction:
    return VirtualFunction(address=fn.address, index=index,
                           device_id=fn.device_id or 0, driver=fn.driver,
                           iommu_group=fn.iommu_group, numa_node=fn.numa_node)


def _routing_id(address: PciAddress) -> int:
    return (address.bus << 8) | (address.device << 3) | address.function

