"""What runs on the Nova side, as holdings for the planner.

``plan --running-from placement`` asks Placement (GET only, through
:class:`~amdgpu_virt.nova.placement.PlacementReader`): Nova makes one
resource provider per GPU it passes through, named ``<compute node>_<PCI
ADDRESS>`` (:func:`amdgpu_virt.nova.pool.provider_address`), with the
GPU's VFs as its inventory when it is a ``nova-vf`` GPU. Every consumer
(instance) with an allocation on such a provider becomes one
:class:`~amdgpu_virt.policy.running.Holding`: as many VFs as units it
holds, or the whole GPU on a whole-GPU provider (the planner reads which
from the GPU's role). Placement does not say which VF an instance has:
the planner books the lowest free VF indexes, which only the count
matters for.

Only providers of the hosts planned are read (one call lists Nova's PCI
providers, one more per provider of those hosts). A provider of those
hosts counts when it is at a GPU of the host's inventory or one of its
allocations is of an AMD resource class (``CUSTOM_AMD_*`` or
``CUSTOM_PCI_1002_*``); other PCI devices (NICs) are not ours.
"""

from __future__ import annotations

from collections.abc import Sequence

from amdgpu_virt.model import HostInventory
from amdgpu_virt.nova import pool as nova_pool
from amdgpu_virt.nova.placement import PlacementReader
from amdgpu_virt.policy import running

AMD_CLASSES = ('CUSTOM_AMD_', 'CUSTOM_PCI_1002_')


def holdings(reader: PlacementReader, hosts: Sequence[HostInventory]
             ) -> list[running.Holding]:
    """The Placement consumers of the GPUs of ``hosts``.

    :raises PlacementError: a request failed.
    """
    gpus = {(inv.hostname, str(g.address)) for inv in hosts
            for g in inv.gpus}
    names = {inv.hostname for inv in hosts}
    result = []
    for provider in reader.pci_providers():
        found = nova_pool.provider_address(provider.name, names)
        if found is None:
            continue
        host, address = found
        allocations = reader.provider_allocations(provider.uuid)
        ours = (host, str(address)) in gpus or any(
            rc.startswith(AMD_CLASSES) for alloc in allocations.values()
            for rc in alloc)
        if not ours:
            continue
        for consumer, resources in sorted(allocations.items()):
            units = sum(n for n in resources.values() if n > 0)
            if units <= 0:
                continue
            result.append(running.Holding(
                'instance/%s' % consumer, running.NOVA, host, str(address),
                vfs=units, what='Placement consumer %s (%s on %s)' % (
                    consumer, ', '.join('%s %d' % i for i in sorted(
                        resources.items())), provider.name)))
    return result
