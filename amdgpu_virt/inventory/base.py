"""The contract every inventory driver fulfils."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from oslo_config import cfg

from amdgpu_virt import catalog
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Partition


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


def expected_partitions(model: GpuModel | None,
                        mode: str | None) -> int | None:
    """Partitions compute ``mode`` makes on ``model`` (None if unknown).

    :raises InvalidPartitionMode: the catalog says ``model`` has no such
        mode (the caller turns this into a warning).
    """
    if mode is None:
        return None
    if model is not None and model.partition_modes:
        return catalog.partitions_in_mode(model, mode)
    return catalog.PARTITIONS_PER_MODE.get(mode)


def gpu_compute_units(partitions: Sequence[Partition],
                      expected: int | None) -> int | None:
    """CUs of the whole GPU from the partitions that could be read.

    Equal partitions count as ``expected`` of them, so a partition missing
    from the listing (the 63-partition quirk) does not shrink the GPU.
    """
    if not partitions:
        return None
    sizes = {p.compute_units for p in partitions}
    if expected and len(sizes) == 1:
        return sizes.pop() * expected
    return sum(p.compute_units for p in partitions)
