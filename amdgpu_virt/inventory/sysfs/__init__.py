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

The package has three parts: :mod:`.files` reads and decodes the files,
:mod:`.assemble` makes GPUs and the host inventory of them, and this
module is the driver (:class:`SysfsInventory`), :func:`device_number`
and :func:`pcie_root`.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Iterable

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.inventory import base
from amdgpu_virt.inventory.sysfs.assemble import GIM_VERSION
from amdgpu_virt.inventory.sysfs.assemble import Scan
from amdgpu_virt.inventory.sysfs.files import DRM_CLASS
from amdgpu_virt.inventory.sysfs.files import KFD_NODES
from amdgpu_virt.inventory.sysfs.files import PCI_DEVICES
from amdgpu_virt.inventory.sysfs.files import SIMD_PER_CU
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress

__all__ = ['DRM_CLASS', 'GIM_VERSION', 'KFD_NODES', 'PCI_DEVICES',
           'SIMD_PER_CU', 'SysfsInventory', 'device_number', 'pcie_root',
           'pcie_roots']

LOG = logging.getLogger(__name__)


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
        return Scan(self.root).scan(self.hostname)


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
