"""The amdsmi inventory driver: ask ROCm's AMD SMI library.

Optional: the ``amdsmi`` Python package is a wrapper around ROCm's
``libamd_smi.so``; importing it raises (a ``KeyError``, not an
``ImportError``) when the shared library is absent, so it is imported
lazily, inside :meth:`AmdSmiInventory.scan`, and any failure becomes
:class:`~amdgpu_virt.exception.AmdSmiUnavailable`.

Calls used, per processor handle (amdsmi gives one handle per compute
partition): ``amdsmi_get_gpu_device_bdf``, ``amdsmi_get_gpu_asic_info``
(``market_name``, ``device_id``, ``num_compute_units``,
``target_graphics_version``, checked against the catalog, and
``asic_serial``, taken as the partition's unique id like KFD's
``unique_id``), ``amdsmi_get_gpu_vram_info``
(``vram_size`` in MB), ``amdsmi_get_gpu_compute_partition``,
``amdsmi_get_gpu_memory_partition``, ``amdsmi_get_gpu_virtualization_mode``,
``amdsmi_get_gpu_kfd_info`` (``node_id``, ``current_partition_id``) and
``amdsmi_get_gpu_enumeration_info`` (``drm_render``, ``drm_card``).
Handles are grouped into GPUs by PCI domain, bus and device; the partition
index is ``current_partition_id`` (or the BDF's function). A call that
fails becomes a warning naming the call and the BDF.

What amdsmi does not tell (NUMA node, IOMMU group, SR-IOV VFs) stays
unknown; use the sysfs driver for those.
"""

from __future__ import annotations

import importlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from oslo_config import cfg

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.inventory import base
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import InventoryWarning
from amdgpu_virt.model import Partition
from amdgpu_virt.model import PciAddress

LOG = logging.getLogger(__name__)

#: amdsmi's virtualization modes (AmdSmiVirtualizationMode)
VIRT_BAREMETAL = 1
VIRT_HOST = 2
VIRT_GUEST = 3
VIRT_PASSTHROUGH = 4
_DRIVER_OF_MODE = {VIRT_BAREMETAL: Driver.AMDGPU, VIRT_HOST: Driver.GIM,
                   VIRT_GUEST: Driver.AMDGPU, VIRT_PASSTHROUGH: Driver.AMDGPU}
#: amdsmi reports "not supported" as all ones
_UNSUPPORTED = {0xffff, 0xffffffff, 0xffffffffffffffff}
_COMPUTE_MODES = ('SPX', 'DPX', 'TPX', 'QPX', 'CPX')
_MEMORY_MODES = ('NPS1', 'NPS2', 'NPS4')


def import_amdsmi() -> Any:
    """The ``amdsmi`` module.

    :raises AmdSmiUnavailable: saying what is missing.
    """
    try:
        return importlib.import_module('amdsmi')
    except ImportError as err:
        raise exception.AmdSmiUnavailable(
            reason='the amdsmi Python package is not installed (%s)'
            % err) from None
    except Exception as err:  # KeyError 'libamd_smi.so', OSError ...
        raise exception.AmdSmiUnavailable(
            reason='importing amdsmi failed with %s: %s (is ROCm\'s '
            'libamd_smi.so installed?)' % (type(err).__name__, err)
        ) from None


def _number(value: Any) -> int | None:
    """An int from amdsmi's int, hex string or "N/A"; None if unknown."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value in _UNSUPPORTED or value < 0 else value
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            number = int(text, 16) if text.startswith('0x') else int(text)
        except ValueError:
            return None
        return _number(number)
    return None


def _serial(value: Any) -> str | None:
    """``asic_serial`` (hex) as 16 lowercase hex digits, like unique_id."""
    if isinstance(value, str) and not value.strip().lower().startswith('0x'):
        value = '0x' + value.strip()
    number = _number(value)
    return None if not number else '%016x' % number


def _mode(value: Any, allowed: tuple[str, ...]) -> str | None:
    name = getattr(value, 'name', value)
    if not isinstance(name, str):
        return None
    name = name.strip().upper().rsplit('_', 1)[-1]
    return name if name in allowed else None


def _virt_mode(value: Any) -> int | None:
    if isinstance(value, dict):
        value = value.get('mode')
    value = getattr(value, 'value', value)
    return value if isinstance(value, int) else None


def _gfx_version(value: Any) -> int | None:
    """``gfx942`` or 90402 as KFD's gfx_target_version (90402)."""
    if isinstance(value, str) and value.lower().startswith('gfx'):
        digits = value[3:]
        if len(digits) >= 3 and digits.isalnum():
            try:
                major = int(digits[:-2])
                minor, step = int(digits[-2], 16), int(digits[-1], 16)
            except ValueError:
                return None
            return major * 10000 + minor * 100 + step
        return None
    return _number(value)


class _Reader:
    """One scan through an amdsmi module (or a stand-in for it)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.warnings: list[InventoryWarning] = []

    def call(self, name: str, handle: Any, where: str) -> Any:
        func: Callable[..., Any] | None = getattr(self.lib, name, None)
        if func is None:
            self.warn('amdsmi.%s' % name, 'not provided by this amdsmi '
                      'version')
            return None
        try:
            return func(handle)
        except Exception as err:  # the library raises its own exceptions
            self.warn('amdsmi.%s(%s)' % (name, where), '%s: %s' % (
                type(err).__name__, err))
            return None

    def warn(self, culprit: str, message: str) -> None:
        LOG.debug('%s: %s', culprit, message)
        self.warnings.append(InventoryWarning(culprit=culprit,
                                              message=message))

    def handle_info(self, handle: Any, position: int
                    ) -> tuple[PciAddress, int, dict[str, Any]] | None:
        bdf = self.call('amdsmi_get_gpu_device_bdf', handle,
                        'handle %d' % position)
        try:
            address = PciAddress.parse(bdf)
        except exception.InvalidPciAddress:
            self.warn('amdsmi.amdsmi_get_gpu_device_bdf(handle %d)'
                      % position, 'not a PCI address: %r' % (bdf,))
            return None
        where = str(address)
        info = {
            'asic': self.call('amdsmi_get_gpu_asic_info', handle, where)
            or {},
            'vram': self.call('amdsmi_get_gpu_vram_info', handle, where)
            or {},
            'kfd': self.call('amdsmi_get_gpu_kfd_info', handle, where) or {},
            'enum': self.call('amdsmi_get_gpu_enumeration_info', handle,
                              where) or {},
            'compute': self.call('amdsmi_get_gpu_compute_partition', handle,
                                 where),
            'memory': self.call('amdsmi_get_gpu_memory_partition', handle,
                                where),
            'virt': self.call('amdsmi_get_gpu_virtualization_mode', handle,
                              where),
        }
        index = _number(info['kfd'].get('current_partition_id'))
        if index is None or index > 7:
            index = address.function
        return address, index, info

    def gpu(self, address: PciAddress,
            parts: list[tuple[int, dict[str, Any]]]) -> Gpu:
        first = parts[0][1]
        asic = first['asic']
        device_id = _number(asic.get('device_id')) or 0
        compute = _mode(first['compute'], _COMPUTE_MODES)
        memory = _mode(first['memory'], _MEMORY_MODES)
        model = (catalog.by_pf_device_id(device_id)
                 or catalog.by_vf_device_id(device_id))
        partitions = []
        for index, info in parts:
            kfd, enum = info['kfd'], info['enum']
            render = _number(enum.get('drm_render'))
            partitions.append(Partition(
                index=index,
                compute_units=_number(
                    info['asic'].get('num_compute_units')) or 0,
                vram_mib=_number(info['vram'].get('vram_size')) or 0,
                kfd_node=_number(kfd.get('node_id')),
                render_minor=render,
                card_minor=_number(enum.get('drm_card')),
                location_id=((address.bus << 8) | (address.device << 3)
                             | index),
                unique_id=_serial(info['asic'].get('asic_serial'))))
        expected = None
        try:
            expected = base.expected_partitions(model, compute)
        except exception.InvalidPartitionMode as err:
            self.warn('amdsmi.amdsmi_get_gpu_compute_partition(%s)'
                      % address, str(err))
        compute_units = base.gpu_compute_units(partitions, expected) or 0
        if expected is not None and len(partitions) < expected:
            self.warn('amdsmi.amdsmi_get_processor_handles',
                      '%s: %s implies %d partitions but amdsmi lists %d'
                      % (address, compute, expected, len(partitions)))
        vram_mib = sum(p.vram_mib for p in partitions) or None
        name = asic.get('market_name')
        name = name.strip() if isinstance(name, str) and name.strip() \
            else None
        if model is None:
            self.warn('amdsmi.amdsmi_get_gpu_asic_info(%s)' % address,
                      'AMD device id 0x%04x is not in the catalog'
                      % device_id)
            model = catalog.unknown_model(device_id, name, compute_units,
                                          vram_mib)
        gfx = _gfx_version(asic.get('target_graphics_version'))
        if (model.known and gfx is not None and model.gfx_target_version
                and gfx != model.gfx_target_version):
            self.warn('amdsmi.amdsmi_get_gpu_asic_info(%s)' % address,
                      'target_graphics_version %r differs from %s\'s %d' % (
                          asic.get('target_graphics_version'), model.name,
                          model.gfx_target_version))
        driver = _DRIVER_OF_MODE.get(_virt_mode(first['virt']) or 0,
                                     Driver.AMDGPU)
        return Gpu(
            address=address, device_id=device_id, model=model, driver=driver,
            subsystem_vendor_id=_number(asic.get('subvendor_id')),
            pci_class=model.pci_class, compute_partition=compute,
            memory_partition=memory, compute_units=compute_units or None,
            vram_mib=vram_mib, unique_id=_serial(asic.get('asic_serial')),
            product_name=name,
            partitions=tuple(sorted(partitions, key=lambda p: p.index)))

    def scan(self, hostname: str) -> HostInventory:
        handles = self.lib.amdsmi_get_processor_handles()
        groups: dict[PciAddress, list[tuple[int, dict[str, Any]]]] = {}
        for position, handle in enumerate(handles):
            found = self.handle_info(handle, position)
            if found is None:
                continue
            address, index, info = found
            base_address = PciAddress(address.domain, address.bus,
                                      address.device, 0)
            groups.setdefault(base_address, []).append((index, info))
        gpus = [self.gpu(address, sorted(parts, key=lambda p: p[0]))
                for address, parts in sorted(groups.items())]
        if not gpus:
            raise exception.NothingReadable(
                source='amdsmi', reason='amdsmi listed %d processor '
                'handle(s), none readable' % len(handles))
        return HostInventory(hostname=hostname, gpus=tuple(gpus),
                             warnings=tuple(self.warnings), source='amdsmi')


class AmdSmiInventory(base.InventoryDriver):
    """Discovers GPUs through ROCm's amdsmi library.

    :param conf: configuration (``[inventory] hostname``).
    :param library: an object with amdsmi's functions; the ``amdsmi``
        module is imported when None (the default).
    """

    def __init__(self, conf: cfg.ConfigOpts, library: Any = None,
                 hostname: str | None = None) -> None:
        super().__init__(conf)
        self.library = library
        self.hostname = (hostname or conf.inventory.hostname
                         or socket.gethostname())

    def scan(self) -> HostInventory:
        """Ask amdsmi.

        :raises AmdSmiUnavailable: the library cannot be imported or
            initialised.
        :raises NothingReadable: amdsmi lists no readable GPU.
        """
        lib = self.library if self.library is not None else import_amdsmi()
        try:
            lib.amdsmi_init()
        except Exception as err:
            raise exception.AmdSmiUnavailable(
                reason='amdsmi_init failed with %s: %s (is the amdgpu '
                'driver loaded?)' % (type(err).__name__, err)) from None
        try:
            try:
                return _Reader(lib).scan(self.hostname)
            except exception.AmdgpuVirtError:
                raise
            except Exception as err:
                raise exception.NothingReadable(
                    source='amdsmi', reason='amdsmi_get_processor_handles '
                    'failed with %s: %s' % (type(err).__name__, err)
                ) from None
        finally:
            try:
                lib.amdsmi_shut_down()
            except Exception as err:
                LOG.warning('amdsmi_shut_down failed: %s', err)
