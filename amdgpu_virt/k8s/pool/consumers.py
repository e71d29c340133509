"""Who uses a GPU on the Kubernetes side: the one answer.

``move`` (through :class:`~amdgpu_virt.k8s.pool.side.KubernetesPool`),
``audit`` (its observations) and the ``kubernetes`` backend all ask this
module, so they count the same consumers:

* pods bound to the node that hold devices of the GPU
  (``hami.io/amd-devices-allocated``, or ``-to-allocate`` before it);
* pods the extender has chosen for the node but that are not bound yet
  (``hami.io/vgpu-node`` with the allocation annotations, whatever the
  bind phase: the extender's own cache books them the same way, see
  :func:`amdgpu_virt.k8s.scheduler.cache.cluster.decode_pod`);
* whatever a :class:`ClaimSource` reports (the extension point for
  allocated ResourceClaims of the DRA driver, which name GPUs by PCI
  address).

It fails closed: a pod whose allocation annotation is unreadable, or that
holds a device the node no longer registers, may be on any GPU of its
node and counts as a consumer of each of them. Succeeded and Failed pods
hold nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.api import labels
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.model import PciAddress
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)



class State(str, enum.Enum):
    BOUND = 'bound'
    #: chosen by the extender, not bound yet
    CHOSEN = 'chosen'
    #: an allocated ResourceClaim (DRA)
    CLAIM = 'claim'


@dataclasses.dataclass(frozen=True)
class Consumer:
    """One user of GPUs of one node.

    :ivar name: ``namespace/name`` of the pod or claim.
    :ivar devices: HAMi device ids it holds (lower case).
    :ivar addresses: GPUs it holds by PCI address (claims).
    :ivar problem: why what it holds cannot be read (it then counts
        against every GPU of the node).
    :ivar grants: what a pod holds, container by container: (device id,
        MiB, CUs) of ``hami.io/amd-devices-allocated`` (for sizes; not
        compared).
    :ivar cu_masks: ``hami.io/amd-cu-allocated`` (device id -> CU bitmap),
        when the pod carries it (not compared).
    """

    name: str
    node: str
    state: State
    devices: frozenset[str] = frozenset()
    addresses: frozenset[PciAddress] = frozenset()
    problem: str | None = None
    grants: tuple[tuple[str, int, int], ...] = dataclasses.field(
        default=(), compare=False)
    cu_masks: Mapping[str, int] | None = dataclasses.field(
        default=None, compare=False)

    def describe(self) -> str:
        notes = []
        if self.state is State.CHOSEN:
            notes.append('chosen by the extender, not bound yet')
        elif self.state is State.CLAIM:
            notes.append('allocated ResourceClaim')
        if self.problem:
            notes.append(self.problem)
        return '%s (%s)' % (self.name, '; '.join(notes)) if notes \
            else self.name


class ClaimSource(Protocol):
    """Further consumers of a node's GPUs (allocated ResourceClaims)."""

    def consumers(self, node: str | None) -> Iterable[Consumer]:
        """Consumers on ``node`` (None: every node)."""


def gpu_address(info: hami.DeviceInfo) -> PciAddress | None:
    """The GPU of a registered device (``custominfo.pciBDF``), or None."""
    raw = info.custominfo.get(hami.CUSTOMINFO_PCI_BDF)
    try:
        return PciAddress.parse(str(raw))
    except exception.InvalidPciAddress:
        return None


def device_addresses(devices: Iterable[hami.DeviceInfo]
                     ) -> dict[str, PciAddress | None]:
    """Registered device id (lower case) -> its GPU (None: unknown)."""
    return {d.id.lower(): gpu_address(d) for d in devices}


def from_pod(obj: Mapping[str, Any]) -> Consumer | None:
    """The consumer a pod object is, or None when it holds no GPU."""
    entry = schedcache.decode_pod(obj)
    if entry is None:
        return None
    bound = bool((obj.get('spec') or {}).get('nodeName'))
    return Consumer(
        name=entry.key, node=entry.node,
        state=State.BOUND if bound else State.CHOSEN,
        devices=frozenset(d.uuid.lower() for container in entry.devices
                          for d in container),
        problem=('unreadable allocation: %s' % entry.problem
                 if entry.problem else None),
        grants=tuple((d.uuid.lower(), d.usedmem, d.usedcores)
                     for container in entry.devices for d in container),
        cu_masks=({k.lower(): v for k, v in entry.cu_masks.items()}
                  if entry.cu_masks else None))


def on_gpu(consumers: Iterable[Consumer], node: str, address: PciAddress,
           registered: Mapping[str, PciAddress | None]
           ) -> tuple[Consumer, ...]:
    """The consumers of GPU ``address`` of ``node``, sorted by name.

    :param registered: the node's registered devices
        (:func:`device_addresses`).
    """
    found: dict[str, Consumer] = {}
    for consumer in consumers:
        if consumer.node != node:
            continue
        hit = consumer.problem is not None or address in consumer.addresses
        unmapped = sorted(d for d in consumer.devices
                          if registered.get(d) is None)
        if any(registered.get(d) == address for d in consumer.devices):
            hit = True
        elif unmapped:
            hit = True
            consumer = dataclasses.replace(consumer, problem='device %s not '
                                           'registered: may be this GPU'
                                           % ', '.join(unmapped))
        if hit:
            found.setdefault(consumer.name, consumer)
    return tuple(found[k] for k in sorted(found))


class ConsumerView:
    """Consumers read through a ``CoreV1Api``.

    :param claims: further sources (the DRA driver's allocated claims).
    """

    def __init__(self, core_api: Any,
                 claims: Sequence[ClaimSource] = ()) -> None:
        self.api = core_api
        self.claims = tuple(claims)

    def _list(self, **selector: str) -> list[dict[str, Any]]:
        response = k8s_client.call('LIST pods %s' % (
            ','.join('%s' % v for v in selector.values()) or 'of all nodes'),
            self.api.list_pod_for_all_namespaces, _preload_content=False,
            **selector)
        return list(json.loads(response.data).get('items') or [])

    def consumers(self, node: str | None = None) -> list[Consumer]:
        """Every consumer of ``node`` (None: of every node).

        :raises KubernetesError: the pods cannot be listed.
        """
        if node is None:
            objects = self._list()
        elif labels.is_label_value(node):
            # bound pods by field, chosen ones by the extender's label
            objects = self._list(field_selector='spec.nodeName=%s' % node)
            objects += self._list(label_selector='%s=%s' % (
                hami.VGPU_NODE, node))
        else:   # no label for such a name: read them all
            objects = self._list()
        found: dict[str, Consumer] = {}
        for obj in objects:
            consumer = from_pod(obj)
            if consumer is not None and (node is None or
                                         consumer.node == node):
                found.setdefault(consumer.name, consumer)
        result = [found[k] for k in sorted(found)]
        for source in self.claims:
            result.extend(c for c in source.consumers(node)
                          if node is None or c.node == node)
        return result

    def of_gpu(self, node: str, address: PciAddress,
               node_obj: Mapping[str, Any] | None,
               resource: str = hami.RESOURCE_GPU) -> tuple[str, ...]:
        """Who uses GPU ``address`` of ``node`` (described), sorted.

        :param node_obj: the node as the API serves it (None: gone); a
            registration that is missing, unreadable or reports no
            capacity maps no device, so every pod of the node counts.
        """
        registered: tuple[hami.DeviceInfo, ...] = ()
        if node_obj is not None:
            registered = schedcache.decode_node(node_obj, resource).devices
        return tuple(c.describe() for c in on_gpu(
            self.consumers(node), node, address,
            device_addresses(registered)))
