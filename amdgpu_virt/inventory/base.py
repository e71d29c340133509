"""The contract every inventory driver fulfils."""

from __future__ import annotations

import abc

from oslo_config import cfg

from amdgpu_virt.model import HostInventory


class InventoryDriver(abc.ABC):
    """Discovers the AMD GPUs of one host.

    :param conf: the process configuration; a driver reads its own options
        (``[inventory]``) here, at construction, never during discovery.
    """

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.conf = conf

    @abc.abstractmethod
    def scan(self) -> HostInventory:
        """Read the host and return what it has.

        Unreadable or odd values do not stop the scan: the GPU is still
        reported with what could be read, and an
        :class:`~amdgpu_virt.model.InventoryWarning` names the culprit.

        :returns: the host inventory (possibly with no GPUs).
        :raises NothingReadable: when no AMD GPU could be read at all.
        :raises InventoryError: when the source itself is unusable.
        """
