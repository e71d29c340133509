"""What each side (Nova, Kubernetes) reports about a GPU.

The adapters (``amdgpu_virt.nova``, ``amdgpu_virt.k8s``) read their APIs
and reduce what they find to these values; the cross-audit compares them
with the ledger and the host inventories without talking to anything.
"""

from __future__ import annotations

import dataclasses

from amdgpu_virt.model import PciAddress


@dataclasses.dataclass(frozen=True, order=True)
class SideObservation:
    """One GPU as one side sees it.

    :param side: ``'nova'`` or ``'k8s'``.
    :param offered: the side offers the GPU (a Placement provider with
        inventory; a node registration entry marked healthy).
    :param capacity: units offered (VFs, devices or sharing slots).
    :param consumers: who uses it now (Placement consumer UUIDs,
        ``namespace/pod`` names), sorted.
    :param detail: what the side calls it (provider name, device id).
    :param unhealthy: why the side reports the GPU unhealthy (a node
        registration entry with ``health: false`` and its
        ``healthReason``); empty when it does not.
    """

    side: str
    host: str
    address: PciAddress
    offered: bool = True
    capacity: int = 0
    consumers: tuple[str, ...] = ()
    detail: str = ''
    unhealthy: str = ''

    @property
    def in_use(self) -> bool:
        return bool(self.consumers)


#: health and enforcement a node did not report
UNKNOWN = 'unknown'
HEALTHY = 'healthy'
UNHEALTHY = 'unhealthy'


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What a node says about one of its GPUs in its registration.

    :param health: :data:`HEALTHY`, :data:`UNHEALTHY` (an entry of the GPU
        registered ``health: false``) or :data:`UNKNOWN`.
    :param reason: why it is unhealthy, as the node wrote it (node input:
        free text, shown escaped, never interpreted).
    :param enforcement: how the node enforces a slice's memory
        (``kernel``, ``hook``, ``kernel+hook``, ``none``) or :data:`UNKNOWN`.
    """

    health: str = UNKNOWN
    reason: str = ''
    enforcement: str = UNKNOWN
