"""The Kubernetes side of the shared GPU pool: what it offers and uses.

* Offers: each node's registration ``hami.io/node-amd-register``; a GPU
  is offered when an entry with ``custominfo.pciBDF`` = its address is
  healthy (a partitioned GPU has one entry per partition).
* Consumers: the one answer of :mod:`amdgpu_virt.k8s.pool.consumers` (bound
  pods, pods the extender chose but did not bind yet, allocated claims),
  mapped to the GPU through the registration's ``id`` -> ``pciBDF``. A
  device the registration no longer lists cannot be mapped; the pod then
  counts against every GPU of its node (it refuses rather than guesses).
* Withdraw: the ledger ConfigMap gives the GPU no role and the node's
  registration loses its entries (written with the node's
  resourceVersion); offer: the ledger ConfigMap gives the GPU its new
  role, and the node agent registers it.

Kubernetes node names are the ledger's host names.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any


from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.dra import DEFAULT_DRIVER
from amdgpu_virt.k8s.pool import claims as dra_holders
from amdgpu_virt.k8s.pool import consumers
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.pool.observed import SideObservation
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

SIDE = 'k8s'
CONFLICT_RETRIES = 5


@dataclasses.dataclass(frozen=True)
class NodeView:
    """One node's registration, reduced to what the pool needs."""

    name: str
    #: device id -> PCI address of its GPU
    devices: Mapping[str, PciAddress]
    #: GPU address -> (healthy entries, units offered, device ids)
    offers: Mapping[PciAddress, tuple[bool, int, tuple[str, ...]]]
    problem: str = ''
    #: GPU address -> why an entry of it registers ``health: false``
    sick: Mapping[PciAddress, str] = dataclasses.field(
        default_factory=dict)


#: The GPU of a registered device (``custominfo.pciBDF``), or None.
gpu_address = consumers.gpu_address


def node_view(node: Mapping[str, Any]) -> NodeView:
    """What a node object registers (a bad annotation offers nothing)."""
    meta = node.get('metadata') or {}
    name = str(meta.get('name', ''))
    value = (meta.get('annotations') or {}).get(hami.NODE_REGISTER)
    if value is None:
        return NodeView(name, {}, {})
    try:
        infos = hami.decode_node_register(value)
    except exception.HamiProtocolError as err:
        return NodeView(name, {}, {}, problem=str(err))
    devices: dict[str, PciAddress] = {}
    offers: dict[PciAddress, tuple[bool, int, tuple[str, ...]]] = {}
    sick: dict[PciAddress, str] = {}
    for info in infos:
        address = gpu_address(info)
        if address is None:
            LOG.warning('node %s: device %s has no usable %s (%r)', name,
                        info.id, hami.CUSTOMINFO_PCI_BDF,
                        info.custominfo.get(hami.CUSTOMINFO_PCI_BDF))
            continue
        devices[info.id] = address
        if not info.health and address not in sick:
            reason = info.custominfo.get(hami.CUSTOMINFO_HEALTH_REASON)
            sick[address] = str(reason)[:200] if reason else \
                'registered health: false'
        healthy, count, ids = offers.get(address, (False, 0, ()))
        offers[address] = (healthy or info.health,
                           count + (info.count if info.health else 0),
                           ids + (info.id,))
    return NodeView(name, devices, offers, sick=sick)


class KubernetesPool:
    """The Kubernetes side, over a ``kubernetes.client.CoreV1Api``.

    :param core_api: the API client.
    :param where: the ledger ConfigMap.
    :param ledger: the ledger before the change (the base of the
        ConfigMap content written by :meth:`withdraw` and :meth:`offer`).
    """

    name = SIDE

    def __init__(self, core_api: Any, where: ledgermap.Location,
                 ledger: av_ledger.Ledger | None = None,
                 dra_driver: str = DEFAULT_DRIVER) -> None:
        self.dra_driver = dra_driver
        self.api = core_api
        self.where = where
        self.ledger = ledger
        #: what was written or found, for the command to print
        self.notes: list[str] = []

    # -- reading ------------------------------------------------------------

    def _node(self, name: str) -> dict[str, Any] | None:
        try:
            response = k8s_client.call('GET node %s' % name,
                                       self.api.read_node, name,
                                       _preload_content=False)
        except exception.KubernetesNotFound:
            return None
        node: dict[str, Any] = json.loads(response.data)
        return node

    def _nodes(self) -> list[dict[str, Any]]:
        response = k8s_client.call('LIST nodes', self.api.list_node,
                                   _preload_content=False)
        return list(json.loads(response.data).get('items') or [])

    def _view(self) -> consumers.ConsumerView:
        return dra_holders.consumer_view(self.api, self.dra_driver)

    def observations(self, hosts: Iterable[str] | None = None
                     ) -> tuple[list[SideObservation], list[str]]:
        """Every GPU the cluster offers or uses, and what could not be read.

        :param hosts: only these nodes (default: every node).
        :returns: (observations, warnings naming node, pod and annotation).
        """
        wanted = None if hosts is None else set(hosts)
        views = {}
        warnings: list[str] = []
        for item in self._nodes():
            view = node_view(item)
            if wanted is not None and view.name not in wanted:
                continue
            if view.problem:
                warnings.append('node %s: %s' % (view.name, view.problem))
            views[view.name] = view
        users: dict[tuple[str, PciAddress], tuple[str, ...]] = {}
        everyone = self._view().consumers()
        for consumer in everyone:
            seen = views.get(consumer.node)
            if seen is None:
                continue
            if consumer.problem:
                warnings.append('pod %s: %s' % (consumer.name,
                                                consumer.problem))
            known = {d.lower() for d in seen.devices}
            for device in sorted(consumer.devices - known):
                warnings.append(
                    'pod %s holds device %s that node %s does not register '
                    '(counted as a user of each of its GPUs)' % (
                        consumer.name, device, consumer.node))
        for name, view in views.items():
            registered: dict[str, PciAddress | None] = {
                d.lower(): a for d, a in view.devices.items()}
            for address in view.offers:
                found = consumers.on_gpu(everyone, name, address,
                                         registered)
                if found:
                    users[(name, address)] = tuple(c.describe()
                                                   for c in found)
        result = []
        keys = {(n, a) for n, v in views.items() for a in v.offers}
        for name, address in sorted(keys | set(users)):
            healthy, count, ids = views[name].offers.get(
                address, (False, 0, ()))
            result.append(SideObservation(
                side=SIDE, host=name, address=address, offered=healthy,
                capacity=count,
                consumers=users.get((name, address), ()),
                detail='%s devices %s' % (name, ','.join(ids) or '-'),
                unhealthy=views[name].sick.get(address, '')))
        return result, warnings

    # -- the Side protocol of a move ------------------------------------------

    def consumers(self, host: str, address: PciAddress) -> tuple[str, ...]:
        return self._view().of_gpu(host, address,
                                                       self._node(host))

    def _write_ledger(self, ledger: av_ledger.Ledger) -> None:
        if ledgermap.write(self.api, ledger, self.where):
            self.notes.append('updated %s' % self.where)
        self.ledger = ledger

    def _current_ledger(self) -> av_ledger.Ledger:
        found = ledgermap.read(self.api, self.where)
        if found is not None:
            return found
        return self.ledger or av_ledger.Ledger()

    def withdraw(self, host: str, address: PciAddress) -> None:
        ledger = self._current_ledger()
        item = ledger.get(host, address)
        if item is not None and item.role.side == SIDE:
            self._write_ledger(ledger.replace(dataclasses.replace(
                item, role=Role.IDLE, compute_mode=None, memory_mode=None,
                vf_count=None)))
        for _attempt in range(CONFLICT_RETRIES):
            node = self._node(host)
            if node is None:
                return
            meta = node.get('metadata') or {}
            value = (meta.get('annotations') or {}).get(hami.NODE_REGISTER)
            if value is None:
                return
            infos = hami.decode_node_register(value)
            keep = [i for i in infos if gpu_address(i) != address]
            if len(keep) == len(infos):
                return
            body = {'metadata': {
                'resourceVersion': meta.get('resourceVersion'),
                'annotations': {hami.NODE_REGISTER:
                                hami.encode_node_register(keep)}}}
            try:
                k8s_client.call('PATCH node %s' % host, self.api.patch_node,
                                host, body,
                                _content_type=k8s_client.MERGE_PATCH,
                                _preload_content=False)
            except exception.KubernetesConflict:
                continue
            self.notes.append('removed GPU %s from the registration of node '
                              '%s' % (address, host))
            return
        raise exception.KubernetesError(
            request='PATCH node %s' % host,
            reason='%d conflicts in a row' % CONFLICT_RETRIES)

    def is_withdrawn(self, host: str, address: PciAddress) -> bool:
        node = self._node(host)
        return node is None or address not in node_view(node).offers

    def offer(self, assignment: av_ledger.GpuAssignment) -> None:
        self._write_ledger(self._current_ledger().replace(assignment))
        self.notes.append('node agent of %s: register GPU %s (it reads its '
                          'roles from %s)' % (assignment.host,
                                              assignment.address, self.where))

    def is_offered(self, host: str, address: PciAddress) -> bool:
        node = self._node(host)
        if node is None:
            return False
        healthy, _count, _ids = node_view(node).offers.get(
            address, (False, 0, ()))
        return healthy
