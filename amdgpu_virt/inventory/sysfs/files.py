"""Reading the files of one sysfs tree: PCI functions, DRM nodes, KFD nodes.

:class:`Reader` reads (bounded, never following a FIFO or an endless
file) and decodes what :mod:`amdgpu_virt.inventory.sysfs` assembles into
GPUs: one :class:`Function` per AMD PCI function, the render -> card
minors of ``class/drm`` and one :class:`KfdNode` per KFD GPU node. A
missing, unreadable or malformed file becomes a warning naming it, never
an error (see the package's documentation for what is read).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import sysfsparse as parse
from amdgpu_virt.model import AMD_VENDOR_ID
from amdgpu_virt.model import Driver
from amdgpu_virt.model import InventoryWarning
from amdgpu_virt.model import MIB
from amdgpu_virt.model import PciAddress

LOG = logging.getLogger(__name__)

PCI_DEVICES = layout.PCI_DEVICES
DRM_CLASS = layout.DRM_CLASS
KFD_NODES = layout.KFD_NODES
#: assumed when KFD's value is unusable
SIMD_PER_CU = layout.SIMD_PER_CU
_MAX_BYTES = 4096
_T = TypeVar('_T')



@dataclasses.dataclass
class Function:
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
class KfdNode:
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


class Reader:
    """The reads of one scan of one sysfs tree; collects warnings as it
    goes."""

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
                self.warn(path, 'dangling link to %s' % readlink(path))
            elif os.path.islink(parent) and not os.path.exists(parent):
                self.warn(parent, 'dangling link to %s' % readlink(parent))
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

    def number(self, text: str, path: str, maximum: int) -> int | None:
        """``text`` (a name in the tree) as a number up to ``maximum``;
        None, and a warning naming ``path``, when it is not one."""
        try:
            return parse.parse_int(text, path, maximum=maximum)
        except exception.SysfsValueError as err:
            self.bad_value(err)
            return None

    def optional(self, fn: Function, name: str,
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

    def pci_functions(self) -> list[Function]:
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

    def pci_function(self, devices: str, name: str) -> Function | None:
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
        fn = Function(name=name, path=path, address=address, entries=entries)
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
            index = self.number(entry[len(layout.VIRTFN):], link_path,
                                0xffff)
            if index is None:
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
            minor = self.number(number, path, 0xfffff)
            if minor is None:
                continue
            target = self.link(path)
            if target is None:
                continue
            parent = os.path.normpath(os.path.dirname(target))
            groups.setdefault(parent, {})[kind] = minor
        return {group['render']: group['card'] for group in groups.values()
                if 'render' in group and 'card' in group}

    def kfd_nodes(self) -> list[KfdNode] | None:
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
            number = self.number(name, path, 0xffff)
            if number is None:
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

    def kfd_node(self, number: int, path: str) -> KfdNode | None:
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
        return KfdNode(
            node=number, path=props_path, domain=props.get('domain', 0),
            bus=bus, device=device, partition=partition,
            location_id=location_id,
            compute_units=simd_count // simd_per_cu,
            vram_mib=vram_bytes // MIB, render_minor=render,
            unique_id=parse.kfd_unique_id(props.get('unique_id', 0)),
            hive_id=props.get('hive_id') or None)



def readlink(path: str) -> str:
    """The target of link ``path``, or ``?``."""
    try:
        return os.readlink(path)
    except OSError:
        return '?'
