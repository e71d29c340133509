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
module is the driver (:class:`SysfsInventory`) and
:func:`device_number`.
"""

from __future__ import annotations

import os
import socket

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

__all__ = ['DRM_CLASS', 'GIM_VERSION', 'KFD_NODES', 'PCI_DEVICES',
           'SIMD_PER_CU', 'SysfsInventory', 'device_number']


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
