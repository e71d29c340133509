"""The host side of a GPU move: what to change, and whether it changed.

:class:`InventoryHost` implements :class:`amdgpu_virt.pool.move.Host`
from an inventory source (a snapshot file or the inventory driver, called
again each time so that a rebooted host is seen as it is now) and the
Nova renderers (GIM / vfio-pci files, through
:class:`~amdgpu_virt.pool.apply.NovaRenderer`). It writes the host files
for the GPU's new role into the output directory and says, step by step,
what the operator does on the host; it never changes a host itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from amdgpu_virt import exception
from amdgpu_virt.ledger import GpuAssignment
from amdgpu_virt.ledger import Ledger
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Role
from amdgpu_virt.pool import apply as pool_apply
from amdgpu_virt.pool import crossaudit


class InventoryHost:
    """A :class:`~amdgpu_virt.pool.move.Host` over an inventory source.

    :param inventory_of: the current inventory of a host.
    :param ledger: the ledger before the move.
    :param nova: the Nova renderers (None when the deployment has no
        Nova side).
    :param output_dir: host files go to ``<output_dir>/<host>/host/``.
    """

    def __init__(self, inventory_of: Callable[[str], HostInventory],
                 ledger: Ledger, nova: pool_apply.NovaRenderer | None,
                 output_dir: str) -> None:
        self.inventory_of = inventory_of
        self.ledger = ledger
        self.nova = nova
        self.output_dir = output_dir

    def _host_files(self, ledger: Ledger, host: str) -> list[str]:
        if self.nova is None or not any(
                a.role.side == 'nova' for a in ledger.for_host(host)):
            return []
        base = os.path.join(self.output_dir, host, pool_apply.HOST_DIR)
        written = []
        for item in self.nova.host_files(self.inventory_of(host), ledger,
                                         host):
            relpath = os.path.join(host, pool_apply.HOST_DIR,
                                   item.path.lstrip('/'))
            pool_apply.apply_files(
                self.output_dir, [pool_apply.OutputFile(relpath, item.content,
                                                        item.mode)],
                scope=lambda path: False)
            written.append(item.path)
        if written:
            return ['install the files of %s on %s at the same paths (%s)'
                    % (base, host, ', '.join(sorted(written)))]
        return []

    def instructions(self, old: GpuAssignment,
                     new: GpuAssignment) -> list[str]:
        """What to do on the host, in order.

        :raises NovaConfigError: the new roles of the host cannot be
            rendered (naming the GPUs).
        """
        host, address = old.host, old.address
        steps = self._host_files(self.ledger.replace(new), host)
        if old.role is Role.NOVA_VF and new.role is not Role.NOVA_VF:
            steps.append('GIM must leave GPU %s: its VFs disappear at the '
                         'next boot (enabled_devices no longer lists it)'
                         % address)
        if old.role is Role.NOVA_DEDICATED:
            steps.append('release GPU %s from vfio-pci: driverctl '
                         'unset-override %s' % (address, address))
        if new.role is Role.NOVA_VF:
            steps.append('GIM takes GPU %s with %d VFs at the next boot'
                         % (address, new.vf_count or 0))
        elif new.role is Role.NOVA_DEDICATED:
            steps.append('bind GPU %s to vfio-pci at boot: driverctl '
                         '--nowait set-override %s vfio-pci'
                         % (address, address))
        elif new.role in (Role.K8S_SHARED, Role.K8S_DEDICATED):
            steps.append('let amdgpu drive GPU %s' % address)
            if new.compute_mode or new.memory_mode:
                steps.append('set the partition modes of GPU %s: amd-smi set '
                             '--gpu <index of %s>%s%s' % (
                                 address, address,
                                 ' --compute-partition %s' % new.compute_mode
                                 if new.compute_mode else '',
                                 ' --memory-partition %s' % new.memory_mode
                                 if new.memory_mode else ''))
        else:
            steps.append('GPU %s keeps no role: no driver needs to take it'
                         % address)
        return steps

    def matches(self, assignment: GpuAssignment) -> bool:
        try:
            gpu = self.inventory_of(assignment.host).gpu(assignment.address)
        except exception.InventoryError:
            return False
        return not crossaudit.reality_problems(gpu, assignment)
