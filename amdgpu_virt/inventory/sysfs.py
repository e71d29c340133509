"""The sysfs inventory driver: the only code of amdgpu_virt that reads /sys.

What it reads, below ``[inventory] sysfs_root`` (``/sys``):

* ``bus/pci/devices/<bdf>/``: ``vendor`` (only 0x1002 is looked at further),
  ``class`` (display 0x03xxxx or accelerator 0x12xxxx), ``device``,
  ``subsystem_vendor``, ``subsystem_device``, ``numa_node`` (-1 is unknown),
  the ``driver`` and ``iommu_group`` links, SR-IOV files of a PF
  (``sriov_totalvfs``, ``sriov_numvfs``, ``sriov_offset``, ``sriov_stride``,
  ``virtfn<N>`` links) and the ``physfn`` link of a VF;
* amdgpu attributes of a PF bound to ``amdgpu``:
  ``current_compute_partition``, ``available_compute_partition``,
  ``current_memory_partition``, ``available_memory_partition``,
  ``mem_info_vram_total``, ``unique_id``, ``product_name`` (all optional:
  a GPU bound to ``gim`` or ``vfio-pci`` has none of them);
* ``class/drm/{cardN,renderDN}`` links: a card and a render node in the same
  directory belong to the same partition (the PCI device's ``drm/`` for
  partition 0, ``devices/platform/amdgpu_xcp_<i>/drm/`` or, on older
  kernels, ``amdgpu_xcp.<i>`` for the others);
* ``class/kfd/kfd/topology/nodes/<N>/properties`` and
  ``mem_banks/0/properties``: one node per GPU partition (nodes with
  ``simd_count`` 0 are CPUs). CUs = ``simd_count / simd_per_cu``; VRAM =
  ``size_in_bytes`` of memory bank 0; the node is joined to its PCI device by
  ``domain`` and ``location_id`` (bus = loc>>8 & 0xff, device = loc>>3 &
  0x1f, partition = loc & 7) and to its card by ``drm_render_minor``;
* ``module/gim/version``.

Nothing read stops the scan: a missing, unreadable or malformed file, a
dangling link or a KFD node that matches no PCI device becomes an
:class:`~amdgpu_virt.model.InventoryWarning` naming the file and the value,
and the GPU is reported with what could be read.

A VF whose PF is not in the tree (a VF passed into a guest, or a PF hidden
from this host) is reported as a GPU of its own at the VF's address, with
the model of its family and its own driver, plus a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from oslo_config import cfg

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.inventory import base
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import sysfsparse as parse
from amdgpu_virt.model import AMD_VENDOR_ID
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import InventoryWarning
from amdgpu_virt.model import MIB
from amdgpu_virt.model import Partition
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import VirtualFunction

LOG = logging.getLogger(__name__)

PCI_DEVICES = layout.PCI_DEVICES
DRM_CLASS = layout.DRM_CLASS
KFD_NODES = layout.KFD_NODES
GIM_VERSION = layout.GIM_VERSION
#: assumed when KFD's value is unusable
SIMD_PER_CU = layout.SIMD_PER_CU
_MAX_BYTES = 4096
_T = TypeVar('_T')


@dataclasses.dataclass
class _Function:
    """What was read of one AMD PCI function."""

    name: str
    path: str
    address: PciAddress
    entries: frozenset[str]
    device_id: int | None = None
    pci_class: int | None = None
    subsystem_vendor_id: int | None = None
    subsystem_device_id: int | None = None
    numa_node: int | None = None
    driver: Driver = Driver.NONE
    iommu_group: int | None = None
    physfn: PciAddress | None = None
    physfn_target: str | None = None
    virtfns: dict[int, PciAddress] = dataclasses.field(default_factory=dict)

    @property
    def is_vf(self) -> bool:
        return self.physfn_target is not None or (
            self.device_id is not None
            and catalog.is_vf_device_id(self.device_id))


@dataclasses.dataclass
class _KfdNode:
    """A KFD GPU node, decoded."""

    node: int
    path: str
    domain: int
    bus: int
    device: int
    partition: int
    location_id: int
    compute_units: int
    vram_mib: int
    render_minor: int | None
    unique_id: str | None
    hive_id: int | None


class _Scan:
    """One scan of one sysfs tree; collects warnings as it goes."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.warnings: list[InventoryWarning] = []
        self.pci_count = 0

    # low-level reads ---------------------------------------------------------

    def warn(self, culprit: str, message: str) -> None:
        LOG.debug('%s: %s', culprit, message)
        self.warnings.append(InventoryWarning(culprit=culprit,
                                              message=message))

    def bad_value(self, err: exception.SysfsValueError) -> None:
        self.warn(str(err.kwargs.get('path', '?')), 'bad value %r: %s' % (
            err.kwargs.get('value'), err.kwargs.get('reason')))

    def read(self, path: str) -> bytes | None:
        """Content of ``path``; None (and a warning) if unreadable, not a
        regular file (a FIFO, socket or device planted in the tree); the
        first page of a larger file."""
        try:
            return fileutil.read_bytes(path, 'sysfs value', _MAX_BYTES,
                                      truncate=True)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if os.path.islink(path):
                self.warn(path, 'dangling link to %s' % _readlink(path))
            elif os.path.islink(parent) and not os.path.exists(parent):
                self.warn(parent, 'dangling link to %s' % _readlink(parent))
            else:
                self.warn(path, 'missing')
        except exception.FileInputError as err:
            self.warn(path, 'unreadable: %s' % err.kwargs.get('reason'))
        return None

    def value(self, parser: Callable[..., _T], path: str,
              *args: Any) -> _T | None:
        raw = self.read(path)
        if raw is None:
            return None
        try:
            return parser(raw, path, *args)
        except exception.SysfsValueError as err:
            self.bad_value(err)
            return None

    def optional(self, fn: _Function, name: str,
                 parser: Callable[..., _T], *args: Any) -> _T | None:
        """Parse file ``name`` of ``fn`` if the directory lists it."""
        if name not in fn.entries:
            return None
        return self.value(parser, os.path.join(fn.path, name), *args)

    def link(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.warn(path, 'not a readable link: %s' % (err.strerror or err))
            return None

    def link_address(self, path: str) -> tuple[str | None,
                                               PciAddress | None]:
        target = self.link(path)
        if target is None:
            return None, None
        name = os.path.basename(target.rstrip('/'))
        try:
            return target, PciAddress.parse(name)
        except exception.InvalidPciAddress:
            self.warn(path, 'link to %r, which is not a PCI address' % target)
            return target, None

    # PCI ---------------------------------------------------------------------

    def pci_functions(self) -> list[_Function]:
        devices = os.path.join(self.root, PCI_DEVICES)
        try:
            names = sorted(os.listdir(devices))
        except OSError as err:
            raise exception.NothingReadable(
                source=self.root, reason='cannot list %s: %s' % (
                    devices, err.strerror or err)) from None
        functions = []
        for name in names:
            fn = self.pci_function(devices, name)
            if fn is not None:
                functions.append(fn)
        self.pci_count = len(names)
        return functions

    def pci_function(self, devices: str, name: str) -> _Function | None:
        path = os.path.join(devices, name)
        try:
            address = PciAddress.parse(name)
        except exception.InvalidPciAddress:
            self.warn(path, 'not named like a PCI address; ignored')
            return None
        vendor = self.value(parse.parse_hex, os.path.join(path, layout.VENDOR))
        if vendor != AMD_VENDOR_ID:
            return None
        try:
            entries = frozenset(os.listdir(path))
        except OSError as err:
            self.warn(path, 'cannot list: %s' % (err.strerror or err))
            return None
        fn = _Function(name=name, path=path, address=address, entries=entries)
        fn.pci_class = self.optional(fn, layout.CLASS, parse.parse_hex,
                                     0xffffff)
        fn.device_id = self.optional(fn, layout.DEVICE, parse.parse_hex)
        known_id = fn.device_id is not None and (
            catalog.by_pf_device_id(fn.device_id) is not None
            or catalog.is_vf_device_id(fn.device_id))
        if fn.pci_class is None:
            if not known_id:
                self.warn(os.path.join(path, layout.CLASS),
                          'unknown PCI class of an AMD function with an '
                          'unknown device id; ignored')
                return None
        elif not catalog.is_gpu_class(fn.pci_class):
            return None
        if fn.device_id is None:
            self.warn(os.path.join(path, layout.DEVICE),
                      'device id unknown; reported as device 0000')
        fn.subsystem_vendor_id = self.optional(fn, layout.SUBSYSTEM_VENDOR,
                                               parse.parse_hex)
        fn.subsystem_device_id = self.optional(fn, layout.SUBSYSTEM_DEVICE,
                                               parse.parse_hex)
        fn.numa_node = self.optional(fn, layout.NUMA_NODE,
                                     parse.parse_numa_node)
        if layout.DRIVER in entries:
            target = self.link(os.path.join(path, layout.DRIVER))
            if target is not None:
                fn.driver = Driver.from_name(
                    os.path.basename(target.rstrip('/')))
        if layout.IOMMU_GROUP in entries:
            group_path = os.path.join(path, layout.IOMMU_GROUP)
            target = self.link(group_path)
            if target is not None:
                try:
                    fn.iommu_group = parse.parse_link_number(target,
                                                             group_path)
                except exception.SysfsValueError as err:
                    self.bad_value(err)
        if layout.PHYSFN in entries:
            fn.physfn_target, fn.physfn = self.link_address(
                os.path.join(path, layout.PHYSFN))
        for entry in entries:
            if not entry.startswith(layout.VIRTFN):
                continue
            link_path = os.path.join(path, entry)
            try:
                index = parse.parse_int(entry[len(layout.VIRTFN):], link_path,
                                        maximum=0xffff)
            except exception.SysfsValueError as err:
                self.bad_value(err)
                continue
            _target, vf_address = self.link_address(link_path)
            if vf_address is not None:
                fn.virtfns[index] = vf_address
        return fn

    # DRM and KFD -------------------------------------------------------------

    def drm_cards(self) -> dict[int, int]:
        """Render minor -> card minor, for nodes sharing a directory."""
        drm = os.path.join(self.root, DRM_CLASS)
        try:
            names = os.listdir(drm)
        except OSError:
            return {}
        groups: dict[str, dict[str, int]] = {}
        for name in names:
            if name.startswith(layout.RENDER):
                kind, number = 'render', name[len(layout.RENDER):]
            elif name.startswith(layout.CARD) and '-' not in name:
                kind, number = 'card', name[len(layout.CARD):]
            else:
                continue
            path = os.path.join(drm, name)
            try:
                minor = parse.parse_int(number, path, maximum=0xfffff)
            except exception.SysfsValueError as err:
                self.bad_value(err)
                continue
            target = self.link(path)
            if target is None:
                continue
            parent = os.path.normpath(os.path.dirname(target))
            groups.setdefault(parent, {})[kind] = minor
        return {group['render']: group['card'] for group in groups.values()
                if 'render' in group and 'card' in group}

    def kfd_nodes(self) -> list[_KfdNode] | None:
        """The KFD GPU nodes; None when there is no KFD topology."""
        nodes_dir = os.path.join(self.root, KFD_NODES)
        try:
            names = os.listdir(nodes_dir)
        except FileNotFoundError:
            return None
        except OSError as err:
            self.warn(nodes_dir, 'cannot list: %s' % (err.strerror or err))
            return None
        nodes = []
        for name in names:
            path = os.path.join(nodes_dir, name)
            try:
                number = parse.parse_int(name, path, maximum=0xffff)
            except exception.SysfsValueError as err:
                self.bad_value(err)
                continue
            node = self.kfd_node(number, path)
            if node is not None:
                nodes.append(node)
        return sorted(nodes, key=lambda n: n.node)

    def properties(self, path: str) -> dict[str, int] | None:
        raw = self.read(path)
        if raw is None:
            return None
        try:
            values, problems = parse.parse_properties(raw, path)
        except exception.SysfsValueError as err:
            self.bad_value(err)
            return None
        if problems:
            self.warn(path, 'ignored malformed line(s): %s'
                      % '; '.join(problems[:5]))
        return values

    def kfd_node(self, number: int, path: str) -> _KfdNode | None:
        props_path = os.path.join(path, layout.PROPERTIES)
        props = self.properties(props_path)
        if props is None:
            return None
        simd_count = props.get('simd_count', 0)
        if simd_count <= 0:
            return None  # a CPU node
        location_id = props.get('location_id')
        if location_id is None:
            self.warn(props_path, 'GPU node without location_id; ignored')
            return None
        try:
            bus, device, partition = parse.decode_location_id(location_id,
                                                              props_path)
        except exception.SysfsValueError as err:
            self.bad_value(err)
            return None
        simd_per_cu = props.get('simd_per_cu', 0)
        if simd_per_cu <= 0:
            self.warn(props_path, 'bad value %r of simd_per_cu: assuming %d'
                      % (props.get('simd_per_cu'), SIMD_PER_CU))
            simd_per_cu = SIMD_PER_CU
        bank_path = os.path.join(path, layout.MEM_BANK_PROPERTIES)
        vram_bytes = None
        if os.path.exists(bank_path):
            bank = self.properties(bank_path)
            if bank is not None:
                vram_bytes = bank.get('size_in_bytes')
                if vram_bytes is None:
                    self.warn(bank_path, 'no size_in_bytes')
        if not vram_bytes:
            vram_bytes = props.get('local_mem_size', 0)
            if not vram_bytes:
                self.warn(bank_path, 'VRAM size unknown; reported as 0')
        render = props.get('drm_render_minor')
        if render is not None and not 0 <= render <= 0xfffff:
            render = None
        return _KfdNode(
            node=number, path=props_path, domain=props.get('domain', 0),
            bus=bus, device=device, partition=partition,
            location_id=location_id,
            compute_units=simd_count // simd_per_cu,
            vram_mib=vram_bytes // MIB, render_minor=render,
            unique_id=parse.kfd_unique_id(props.get('unique_id', 0)),
            hive_id=props.get('hive_id') or None)

    # assembling GPUs ---------------------------------------------------------

    def model_of(self, fn: _Function) -> GpuModel | None:
        """The catalog model of ``fn`` (a VF's family for a VF)."""
        device_id = fn.device_id or 0
        if fn.is_vf:
            return catalog.by_vf_device_id(device_id)
        return catalog.by_pf_device_id(device_id)

    def unknown_model(self, fn: _Function, product_name: str | None,
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

    def partitions(self, fn: _Function, nodes: list[_KfdNode],
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

    def expected_partitions(self, fn: _Function, model: GpuModel | None,
                            mode: str | None) -> int | None:
        """Partitions ``mode`` makes on ``model`` (None if unknown)."""
        try:
            return base.expected_partitions(model, mode)
        except exception.InvalidPartitionMode as err:
            self.warn(os.path.join(fn.path, layout.CURRENT_COMPUTE_PARTITION),
                      str(err))
            return None

    def gpu(self, fn: _Function, vfs: tuple[VirtualFunction, ...],
            nodes: list[_KfdNode], cards: dict[int, int]) -> Gpu:
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
            hive_id=min(hive_ids) if hive_ids else None)

    def virtual_functions(self, pfs: dict[PciAddress, _Function],
                          vfs: dict[PciAddress, _Function]
                          ) -> tuple[dict[PciAddress,
                                          list[VirtualFunction]],
                                     list[_Function]]:
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
        orphans: list[_Function] = []
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

    def vf_index(self, pf: _Function, vf: _Function) -> int | None:
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
        by_slot: dict[tuple[int, int, int], _Function] = {}
        for fn in gpu_functions:
            slot = (fn.address.domain, fn.address.bus, fn.address.device)
            by_slot.setdefault(slot, fn)
        nodes_of: dict[PciAddress, list[_KfdNode]] = {
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


def _vf(fn: _Function, index: int) -> VirtualFunction:
    return VirtualFunction(address=fn.address, index=index,
                           device_id=fn.device_id or 0, driver=fn.driver,
                           iommu_group=fn.iommu_group, numa_node=fn.numa_node)


def _routing_id(address: PciAddress) -> int:
    return (address.bus << 8) | (address.device << 3) | address.function


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return '?'


class SysfsInventory(base.InventoryDriver):
    """Reads GPUs, partitions and VFs from a sysfs tree.

    :param conf: configuration; ``[inventory] sysfs_root`` and ``hostname``
        are read here.
    :param root: sysfs root overriding ``[inventory] sysfs_root``.
    :param hostname: host name overriding ``[inventory] hostname`` (which
        defaults to the machine's name).
    """

    def __init__(self, conf: cfg.ConfigOpts, root: str | None = None,
                 hostname: str | None = None) -> None:
        super().__init__(conf)
        self.root = root or conf.inventory.sysfs_root
        self.hostname = (hostname or conf.inventory.hostname
                         or socket.gethostname())

    def scan(self) -> HostInventory:
        """Read the tree once.

        :returns: every AMD GPU found, with warnings for what was odd.
        :raises NothingReadable: no AMD GPU could be read (the PCI device
            directory is missing or unreadable, or lists no AMD GPU).
        """
        return _Scan(self.root).scan(self.hostname)


#: the directory below ``devices/`` that names a PCI host bridge (the
#: root complex): ``pci<domain>:<bus>``
_PCIE_ROOT = re.compile(r'^pci[0-9a-f]{4}:[0-9a-f]{2}$')


def pcie_root(root: str, address: PciAddress) -> str:
    """The PCIe root complex of a PCI function: ``pci<domain>:<bus>``.

    ``bus/pci/devices/<bdf>`` links to the function's directory below
    ``devices/``, whose first component is the host bridge the function
    sits behind (``devices/pci0000:80/0000:80:01.1/.../0000:83:00.0``):
    the value of Kubernetes' standard DRA attribute
    ``resource.kubernetes.io/pcieRoot``, read the way its reference
    implementation reads it.

    :raises InventoryError: naming the link when it is missing or does not
        lead to ``devices/pci<domain>:<bus>/.../<bdf>``.
    """
    name = str(address)
    link = os.path.join(root, PCI_DEVICES, name)
    try:
        target = os.readlink(link)
    except OSError as err:
        raise exception.InventoryError(
            source=link, reason='not a readable link (%s)' % (
                err.strerror or err)) from None
    full = os.path.normpath(os.path.join(os.path.dirname(link), target))
    devices = os.path.join(os.path.normpath(root), 'devices') + os.sep
    parts = full[len(devices):].split(os.sep) \
        if full.startswith(devices) else []
    if len(parts) < 2 or not _PCIE_ROOT.match(parts[0]) or \
            parts[-1] != name:
        raise exception.InventoryError(
            source=link, reason='links to %r, not to devices/pci<domain>:'
            '<bus>/.../%s' % (target[:200], name))
    return parts[0]


def pcie_roots(root: str, addresses: Iterable[PciAddress]
               ) -> dict[PciAddress, str]:
    """:func:`pcie_root` of each address that has one; the others are
    logged and left out (their devices then carry no pcieRoot)."""
    found = {}
    for address in addresses:
        try:
            found[address] = pcie_root(root, address)
        except exception.InventoryError as err:
            LOG.warning('No PCIe root for %s: %s', address, err)
    return found


def device_number(root: str, device_class: str, name: str
                  ) -> tuple[int, int]:
    """(major, minor) of the character device ``name`` of a class.

    Read from ``<root>/class/<device_class>/<name>/dev`` (``226:128``), as
    for ``drm``/``renderD128`` or ``kfd``/``kfd``.

    :raises InventoryError: naming the file when it is missing or bad.
    """
    path = os.path.join(root, 'class', device_class, name, 'dev')
    try:
        # the bounded reader: a FIFO or an endless file there is refused,
        # never read
        raw = fileutil.read_bytes(path, 'sysfs value', 64, truncate=True)
        major, minor = raw.decode('ascii').strip().split(':')
        return int(major), int(minor)
    except exception.FileInputError as err:
        raise exception.InventoryError(source=path, reason=str(err)) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise exception.InventoryError(
            source=path, reason='no device number (%s)' % (
                getattr(err, 'strerror', None) or err)) from None
