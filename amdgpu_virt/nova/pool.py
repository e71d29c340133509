"""The Nova side of the shared GPU pool: what Placement shows, and moves.

* Offers: the providers Nova reports for PCI devices, named
  ``<node>_<PCI ADDRESS>`` (trait ``COMPUTE_MANAGED_PCI_DEVICE``); a GPU
  is offered when its provider has inventory.
* Consumers: the Placement consumers (instances) with allocations on the
  GPU's provider.
* Withdraw and offer: the host's ``nova.conf.d`` snippet is rendered
  again from the ledger with the GPU's new role (none while it moves)
  into the output directory; the operator installs it and restarts
  nova-compute, which removes or creates the provider. Nothing here
  writes to Placement: providers are Nova's own (see the design notes on
  ``OWNER_NOVA``).

Compute node names are the ledger's host names.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt import fileutil
from amdgpu_virt.nova.driver import NovaBackend
from amdgpu_virt.pool import apply as pool_apply
from amdgpu_virt.pool.observed import SideObservation

LOG = logging.getLogger(__name__)

SIDE = 'nova'


class NovaRenderer:
    """:class:`~amdgpu_virt.pool.apply.NovaRenderer` over a NovaBackend."""

    def __init__(self, backend: NovaBackend) -> None:
        self.backend = backend

    def compute_snippet(self, inventory: HostInventory,
                        ledger: av_ledger.Ledger, host: str) -> str:
        return self.backend.render_compute(inventory, ledger, host)

    def host_files(self, inventory: HostInventory, ledger: av_ledger.Ledger,
                   host: str) -> tuple[pool_apply.HostFile, ...]:
        config = self.backend.render_host_config(inventory, ledger, host)
        notes = ''.join('# NOTE: %s\n' % n for n in config.notes)
        result = [pool_apply.HostFile(f.path, f.content, f.mode)
                  for f in config.files]
        if notes:
            result.append(pool_apply.HostFile(pool_apply.HOST_NOTES, notes))
        return tuple(result)


def provider_address(name: str, hosts: Iterable[str] | None = None
                     ) -> tuple[str, PciAddress] | None:
    """(host, GPU address) of a provider named ``<node>_<ADDRESS>``."""
    host, sep, address = name.rpartition('_')
    if not sep or (hosts is not None and host not in set(hosts)):
        return None
    try:
        return host, PciAddress.parse(address)
    except exception.InvalidPciAddress:
        return None


class NovaPool:
    """The Nova side, through a :class:`NovaBackend`.

    :param backend: Placement access and renderers.
    :param ledger: the ledger before the change.
    :param inventory_of: the inventory of a host (for rendering).
    :param output_dir: where snippets are rendered (``<dir>/<host>/...``).
    """

    name = SIDE

    def __init__(self, backend: NovaBackend,
                 ledger: av_ledger.Ledger | None = None,
                 inventory_of: Callable[[str], HostInventory] | None = None,
                 output_dir: str = '.') -> None:
        self.backend = backend
        self.ledger = ledger or av_ledger.Ledger()
        self.inventory_of = inventory_of
        self.output_dir = output_dir
        self.notes: list[str] = []

    def observations(self, hosts: Iterable[str] | None = None
                     ) -> tuple[list[SideObservation], list[str]]:
        """What Placement shows for every GPU of ``hosts`` (default all).

        One call lists Nova's PCI providers, then two per provider of the
        hosts asked (inventories, allocations).

        :raises PlacementError: a request failed.
        """
        reader = self.backend.reader()
        wanted = None if hosts is None else set(hosts)
        result = []
        for provider in reader.pci_providers():
            found = provider_address(provider.name, wanted)
            if found is None:
                continue
            capacity = sum(reader.provider_totals(provider.uuid).values())
            users = reader.provider_allocations(provider.uuid)
            result.append(SideObservation(
                side=SIDE, host=found[0], address=found[1],
                offered=capacity > 0, capacity=capacity,
                consumers=tuple(sorted(users)), detail=provider.name))
        return result, []

    # -- the Side protocol of a move ------------------------------------------

    def consumers(self, host: str, address: PciAddress) -> tuple[str, ...]:
        return self.backend.consumers(host, address)

    def is_withdrawn(self, host: str, address: PciAddress) -> bool:
        return self.backend.is_withdrawn(host, address)

    def is_offered(self, host: str, address: PciAddress) -> bool:
        return self.backend.is_offered(host, address)

    def _render(self, ledger: av_ledger.Ledger, host: str, why: str) -> None:
        if self.inventory_of is None:
            raise exception.NovaConfigError(
                host=host, reason='no inventory source to render from')
        text = self.backend.render_compute(self.inventory_of(host), ledger,
                                           host)
        path = os.path.join(self.output_dir, host, pool_apply.NOVA_SNIPPET)
        changed = fileutil.write_if_changed(path, text)
        self.ledger = ledger
        self.notes.append('%s %s (%s): install it as nova.conf.d/%s on %s '
                          'and restart nova-compute there' % (
                              'wrote' if changed else 'unchanged', path, why,
                              os.path.basename(path), host))

    def withdraw(self, host: str, address: PciAddress) -> None:
        item = self.ledger.get(host, address)
        if item is None:
            return
        self._render(self.ledger.replace(dataclasses.replace(
            item, role=Role.IDLE, vf_count=None)), host,
            'without GPU %s' % address)

    def offer(self, assignment: av_ledger.GpuAssignment) -> None:
        self._render(self.ledger.replace(assignment), assignment.host,
                     'with GPU %s as %s' % (assignment.address,
                                            assignment.role.value))
