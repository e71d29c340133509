"""The Kubernetes side of the shared GPU pool: what it offers and uses.

* Offers: each node's registration ``hami.io/node-amd-register``; a GPU
  is offered when an entry with ``custominfo.pciBDF`` = its address is
  healthy (a partitioned GPU has one entry per partition).
* Consumers: pods (not Succeeded/Failed) whose
  ``hami.io/amd-devices-allocated`` names a device of the GPU, mapped to
  the GPU through the registration's ``id`` -> ``pciBDF``. A device the
  registration no longer lists cannot be mapped; :meth:`consumers` then
  counts the pod against every GPU of its node (it refuses rather than
  guesses). Allocated ResourceClaims of the DRA driver count too (see
  :mod:`amdgpu_virt.k8s.dra.holders`).
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
from amdgpu_virt.k8s import ledgermap
from amdgpu_virt.k8s import pods
from amdgpu_virt.k8s.dra import DEFAULT_DRIVER
from amdgpu_virt.k8s.dra import holders as dra_holders
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.pool.observed import SideObservation
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

SIDE = 'k8s'
CONFLICT_RETRIES = 5
_ENDED = ('Succeeded', 'Failed')


@dataclasses.dataclass(frozen=True)
class NodeView:
    """One node's registration, reduced to what the pool needs."""

    name: str
    #: device id -> PCI address of its GPU
    devices: Mapping[str, PciAddress]
    #: GPU address -> (healthy entries, units offered, device ids)
    offers: Mapping[PciAddress, tuple[bool, int, tuple[str, ...]]]
    problem: str = ''


def gpu_address(info: hami.DeviceInfo) -> PciAddress | None:
    """The GPU of a registered device (``custominfo.pciBDF``), or None."""
    raw = info.custominfo.get(hami.CUSTOMINFO_PCI_BDF)
    try:
        return PciAddress.parse(str(raw))
    except exception.InvalidPciAddress:
        return None


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
    for info in infos:
        address = gpu_address(info)
        if address is None:
            LOG.warning('node %s: device %s has no usable %s (%r)', name,
                        info.id, hami.CUSTOMINFO_PCI_BDF,
                        info.custominfo.get(hami.CUSTOMINFO_PCI_BDF))
            continue
        devices[info.id] = address
        healthy, count, ids = offers.get(address, (False, 0, ()))
        offers[address] = (healthy or info.health,
                           count + (info.count if info.health else 0),
                           ids + (info.id,))
    return NodeView(name, devices, offers)


def pod_devices(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Device ids a live pod holds (none for ended pods).

    :raises HamiProtocolError: the annotation is malformed.
    """
    if (pod.get('status') or {}).get('phase') in _ENDED:
        return ()
    value = ((pod.get('metadata') or {}).get('annotations') or {}).get(
        hami.DEVICES_ALLOCATED)
    if not value:
        return ()
    return tuple(sorted({d.uuid for container in
                         hami.decode_pod_devices(value)
                         for d in container}))


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get('metadata') or {}
    return '%s/%s' % (meta.get('namespace', ''), meta.get('name', ''))


class KubernetesPool:
    """The Kubernetes side, over a ``kubernetes.client.CoreV1Api``.

    :param core_api: the API client.
    :param where: the ledger ConfigMap.
    :param ledger: the ledger before the change (the base of the
        ConfigMap content written by :meth:`withdraw` and :meth:`offer`).
    :param dra_driver: the DRA driver whose allocated ResourceClaims
        count as consumers.
    """

    name = SIDE

    def __init__(self, core_api: Any, where: ledgermap.Location,
                 ledger: av_ledger.Ledger | None = None,
                 dra_driver: str = DEFAULT_DRIVER) -> None:
        self.api = core_api
        self.where = where
        self.ledger = ledger
        self.dra_driver = dra_driver
        #: what was written or found, for the command to print
        self.notes: list[str] = []

    # -- reading ------------------------------------------------------------

    def _node(self, name: str) -> dict[str, Any] | None:
        try:
            response = pods.call('GET node %s' % name, self.api.read_node,
                                 name, _preload_content=False)
        except exception.KubernetesNotFound:
            return None
        node: dict[str, Any] = json.loads(response.data)
        return node

    def _nodes(self) -> list[dict[str, Any]]:
        response = pods.call('LIST nodes', self.api.list_node,
                             _preload_content=False)
        return list(json.loads(response.data).get('items') or [])

    def _pods(self, node: str | None = None) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        if node is not None:
            kwargs['field_selector'] = 'spec.nodeName=%s' % node
        response = pods.call('LIST pods', self.api.list_pod_for_all_namespaces,
                             _preload_content=False, **kwargs)
        return list(json.loads(response.data).get('items') or [])

    def _claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim; none on a cluster without DRA (404)."""
        from kubernetes import client

        resource = client.ResourceV1Api(self.api.api_client)
        try:
            response = pods.call(
                'LIST resourceclaims',
                resource.list_resource_claim_for_all_namespaces,
                _preload_content=False)
        except exception.KubernetesNotFound:
            return []
        return list(json.loads(response.data).get('items') or [])

    def _claim_holders(self) -> dict[tuple[str, PciAddress | None],
                                      set[str]]:
        return dra_holders.held_gpus(self._claims(), self.dra_driver)

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
        users: dict[tuple[str, PciAddress], set[str]] = {}
        for pod in self._pods():
            node = str((pod.get('spec') or {}).get('nodeName') or '')
            if node not in views:
                continue
            try:
                ids = pod_devices(pod)
            except exception.HamiProtocolError as err:
                warnings.append('pod %s: %s' % (_pod_name(pod), err))
                continue
            for device in ids:
                address = views[node].devices.get(device)
                if address is None:
                    warnings.append(
                        'pod %s holds device %s that node %s does not '
                        'register' % (_pod_name(pod), device, node))
                    continue
                users.setdefault((node, address), set()).add(
                    _pod_name(pod))
        for (node, address), names in self._claim_holders().items():
            if node not in views:
                continue
            if address is None:
                warnings.append('%s on node %s name a device of driver %s '
                                'that maps to no GPU' % (
                                    ', '.join(sorted(names)), node,
                                    self.dra_driver))
                continue
            users.setdefault((node, address), set()).update(names)
        result = []
        keys = {(n, a) for n, v in views.items() for a in v.offers}
        for name, address in sorted(keys | set(users)):
            healthy, count, ids = views[name].offers.get(
                address, (False, 0, ()))
            result.append(SideObservation(
                side=SIDE, host=name, address=address, offered=healthy,
                capacity=count,
                consumers=tuple(sorted(users.get((name, address), ()))),
                detail='%s devices %s' % (name, ','.join(ids) or '-')))
        return result, warnings

    # -- the Side protocol of a move ------------------------------------------

    def consumers(self, host: str, address: PciAddress) -> tuple[str, ...]:
        node = self._node(host)
        view = node_view(node) if node is not None else NodeView(host, {},
                                                                 {})
        found = set()
        for pod in self._pods(host):
            try:
                ids = pod_devices(pod)
            except exception.HamiProtocolError as err:
                found.add('%s (unreadable %s: %s)' % (
                    _pod_name(pod), hami.DEVICES_ALLOCATED, err))
                continue
            for device in ids:
                mapped = view.devices.get(device)
                if mapped == address:
                    found.add(_pod_name(pod))
                elif mapped is None:
                    found.add('%s (device %s not registered: may be this '
                              'GPU)' % (_pod_name(pod), device))
        for (claim_node, gpu), names in self._claim_holders().items():
            if claim_node != host:
                continue
            if gpu == address:
                found.update(names)
            elif gpu is None:
                found.update('%s (device of no known GPU: may be this GPU)'
                             % name for name in names)
        return tuple(sorted(found))

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
                pods.call('PATCH node %s' % host, self.api.patch_node, host,
                          body, _content_type=pods.MERGE_PATCH,
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
