"""What runs on the Kubernetes side, as holdings for the planner.

``plan --running-from k8s`` asks this module: every consumer the one
consumer view counts (:mod:`amdgpu_virt.k8s.pool.consumers`: bound pods, pods
chosen by the extender but not bound yet; allocated ResourceClaims of
the DRA driver, :mod:`amdgpu_virt.k8s.pool.claims`) becomes one
:class:`~amdgpu_virt.policy.running.Holding` per GPU it holds:

* a HAMi pod holds, per device of ``hami.io/amd-devices-allocated``, a
  slice of the device's CUs and MiB. The device is one of the node's
  units (a GPU in SPX, or one compute partition), found by its uuid among
  the units of the host's inventory, else by the ``pciBDF`` of the node's
  registration. The CU ids come from the node's allocation record (the
  truth the extender books), else from ``hami.io/amd-cu-allocated``;
* a pod the allocation record books but the API does not list (gone, or
  not visible yet) still holds what the record says;
* an allocated claim holds the GPU or partition it names (device
  ``gpu-<address>[-p<N>]``), or for a share the ``consumedCapacity`` it
  was granted.

Only GETs and LISTs are sent: pods (one LIST), nodes (one LIST), the
allocation records (one LIST by label) and ResourceClaims (one LIST).
Whatever cannot be read is a holding with a ``problem`` (the planner
keeps its GPU, or every GPU of its node, occupied), never an exception.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.k8s.node import devices as k8s_devices
from amdgpu_virt.k8s.pool import claims as holders
from amdgpu_virt.k8s.pool import consumers as k8s_consumers
from amdgpu_virt.k8s.pool import side as pool_side
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import MIB
from amdgpu_virt.policy import running
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

_PARTITION = re.compile(r'-p(\d{1,3})(?:-share)?$')
#: the most results of one claim read (a crafted claim stays cheap)
MAX_RESULTS = 64


def _unit_index(hosts: Iterable[HostInventory]
                ) -> dict[tuple[str, str], tuple[str, int | None]]:
    """(host, unit uuid) -> (GPU address, partition or None)."""
    index: dict[tuple[str, str], tuple[str, int | None]] = {}
    for inventory in hosts:
        parts = {str(g.address): len(g.partitions) for g in inventory.gpus}
        for unit in k8s_devices.units_from_inventory(inventory):
            partition = unit.partition if parts.get(unit.gpu_address, 0) > 1 \
                else None
            index[(inventory.hostname, unit.uuid.lower())] = (
                unit.gpu_address, partition)
    return index


def _pod_holdings(consumer: k8s_consumers.Consumer,
                  units: Mapping[tuple[str, str], tuple[str, int | None]],
                  registered: Mapping[str, Mapping[str, Any]],
                  booked: Mapping[str, int] | None
                  ) -> list[running.Holding]:
    name = 'pod/%s' % consumer.name
    what = 'pod %s' % consumer.describe()
    node = consumer.node
    if consumer.problem:
        return [running.Holding(name, running.KUBERNETES, node, None,
                                what=what, problem=consumer.problem)]
    result = []
    masks = booked if booked is not None else consumer.cu_masks or {}
    for device, mib, cus in consumer.grants:
        unit = units.get((node, device))
        problem = None
        address: str | None = None
        partition: int | None = None
        if unit is not None:
            address, partition = unit
        else:
            address = registered.get(node, {}).get(device)
            if address is None:
                problem = ('device %s is neither a GPU of the inventory of '
                           '%s nor registered by the node' % (device, node))
            else:
                problem = ('device %s is registered on GPU %s, but it is not '
                           'a device of that GPU in the inventory' % (
                               device, address))
        mask = masks.get(device)
        result.append(running.Holding(
            name, running.KUBERNETES, node, address, partition=partition,
            compute_units=cus, memory_mib=mib,
            cus=allocator.ids_of(mask) if mask else None, what=what,
            problem=problem))
    return result


def _record_holdings(node: str, grants: allocrecord.PodGrants,
                     units: Mapping[tuple[str, str], tuple[str, int | None]]
                     ) -> list[running.Holding]:
    """A pod the record books that the API does not list."""
    name = 'pod/%s' % grants.key
    what = '%s, booked in the allocation record of node %s (no such pod ' \
        'listed)' % (grants.describe(), node)
    result = []
    for container in grants.containers:
        for grant in container:
            found = units.get((node, grant.gpu.lower()))
            result.append(running.Holding(
                name, running.KUBERNETES, node,
                found[0] if found else None,
                partition=found[1] if found else None,
                compute_units=grant.cus.bit_count(), memory_mib=grant.mem,
                cus=allocator.ids_of(grant.cus), what=what,
                problem=None if found else 'device %s of the allocation '
                'record is not a GPU of the inventory of %s' % (grant.gpu,
                                                                node)))
    return result


def _quantity(value: Any) -> Fraction | None:
    try:
        amount = quantity.value(value)
    except exception.InvalidQuantity:
        return None
    return amount if amount >= 0 else None


def _claim_holdings(claim: Mapping[str, Any], driver: str
                    ) -> list[running.Holding]:
    meta = claim.get('metadata') or {}
    key = '%s/%s' % (meta.get('namespace', ''), meta.get('name', ''))
    name = 'claim/%s' % key
    what = 'ResourceClaim %s' % key
    allocation = (claim.get('status') or {}).get('allocation')
    if not isinstance(allocation, Mapping):
        return []
    results = (allocation.get('devices') or {}).get('results') or []
    if not isinstance(results, list):
        return []
    found = []
    for index, result in enumerate(results[:MAX_RESULTS + 1]):
        if not isinstance(result, Mapping) or result.get('driver') != driver:
            continue
        node = str(result.get('pool') or '')
        device = result.get('device')
        where = 'status.allocation.devices.results[%d]' % index
        if index >= MAX_RESULTS:
            found.append(running.Holding(
                name, running.KUBERNETES, node, None, what=what,
                problem='more than %d results' % MAX_RESULTS))
            break
        gpu = holders.device_gpu(device) if isinstance(device, str) else None
        if gpu is None or not isinstance(device, str):
            found.append(running.Holding(
                name, running.KUBERNETES, node, None, what=what,
                problem='%s names device %r, which maps to no GPU' % (
                    where, str(device)[:80])))
            continue
        match = _PARTITION.search(device)
        partition = int(match.group(1)) if match else None
        if not device.endswith('-share'):
            found.append(running.Holding(
                name, running.KUBERNETES, node, str(gpu), whole=True,
                partition=partition, what=what))
            continue
        consumed = result.get('consumedCapacity')
        consumed = consumed if isinstance(consumed, Mapping) else {}
        cus = _quantity(consumed.get('computeUnits'))
        memory = _quantity(consumed.get('memory'))
        problem = None
        if cus is None or memory is None or cus.denominator != 1:
            problem = ('%s.consumedCapacity %s is not computeUnits and '
                       'memory quantities' % (where, json.dumps(
                           consumed, default=str)[:160]))
        found.append(running.Holding(
            name, running.KUBERNETES, node, str(gpu), partition=partition,
            compute_units=0 if problem or cus is None else int(cus),
            memory_mib=0 if problem or memory is None
            else math.ceil(memory / MIB), what=what, problem=problem))
    return found


class LiveKubernetes:
    """The Kubernetes side's holdings, read through a ``CoreV1Api``.

    :param core_api: the API client.
    :param namespace: the project's namespace (the allocation records).
    :param driver: the DRA driver name (claims of other drivers are not
        ours).
    :param resource: the extended resource name (node registrations).
    """

    def __init__(self, core_api: Any, namespace: str, driver: str,
                 resource: str = hami.RESOURCE_GPU) -> None:
        self.api = core_api
        self.namespace = namespace
        self.driver = driver
        self.resource = resource

    def _registered(self) -> dict[str, dict[str, Any]]:
        """node -> device id -> GPU address of its registration."""
        response = k8s_client.call('LIST nodes', self.api.list_node,
                                   _preload_content=False)
        result: dict[str, dict[str, Any]] = {}
        for obj in json.loads(response.data).get('items') or []:
            entry = schedcache.decode_node(obj, self.resource)
            result[entry.name] = {
                d: str(a) for d, a in k8s_consumers.device_addresses(
                    entry.devices).items() if a is not None}
        return result

    def memory_enforcement(self) -> dict[str, dict[str, str]]:
        """node -> GPU address -> the memory enforcement level its
        registration states (``custominfo.memoryEnforcement``; GPUs that
        state none are left out).

        :raises KubernetesError: the nodes cannot be listed.
        """
        response = k8s_client.call('LIST nodes', self.api.list_node,
                                   _preload_content=False)
        result: dict[str, dict[str, str]] = {}
        for obj in json.loads(response.data).get('items') or []:
            entry = schedcache.decode_node(obj, self.resource)
            for device in entry.devices:
                address = k8s_consumers.gpu_address(device)
                level = enforcement.registered_level(device.custominfo)
                if address is not None and level is not None:
                    result.setdefault(entry.name, {})[str(address)] = \
                        level.value
        return result

    def _records(self, nodes: Iterable[str]
                 ) -> tuple[dict[str, allocrecord.Record],
                            list[running.Holding]]:
        """The allocation records of ``nodes``, and a holding for each
        record that cannot be read."""
        names = {allocrecord.configmap_name(n): n for n in nodes}
        response = k8s_client.call(
            'LIST configmaps %s' % self.namespace,
            self.api.list_namespaced_config_map, self.namespace,
            label_selector='%s=%s' % (allocrecord.COMPONENT_LABEL,
                                      allocrecord.COMPONENT),
            _preload_content=False)
        records: dict[str, allocrecord.Record] = {}
        bad: list[running.Holding] = []
        for obj in json.loads(response.data).get('items') or []:
            cm = str((obj.get('metadata') or {}).get('name', ''))
            node = names.get(cm)
            if node is None:
                continue
            text = (obj.get('data') or {}).get(allocrecord.DATA_KEY)
            if text is None:
                continue
            try:
                records[node] = allocrecord.decode(
                    text, node, '%s/%s' % (self.namespace, cm))
            except exception.AllocationRecordError as err:
                bad.append(running.Holding(
                    'record/%s/%s' % (self.namespace, cm), running.KUBERNETES,
                    node, None, what='allocation record %s/%s' % (
                        self.namespace, cm),
                    problem='unreadable allocation record: %s' % err))
        return records, bad

    def unhealthy(self) -> dict[tuple[str, str], str]:
        """(node, GPU address) -> why its node registers it unhealthy.

        :raises KubernetesError: the nodes cannot be listed.
        """
        response = k8s_client.call('LIST nodes', self.api.list_node,
                                   _preload_content=False)
        result: dict[tuple[str, str], str] = {}
        for obj in json.loads(response.data).get('items') or []:
            view = pool_side.node_view(obj)
            for address, reason in view.sick.items():
                result[(view.name, str(address))] = reason
        return result

    def claims(self) -> list[dict[str, Any]]:
        return holders.ClaimConsumers(self.api, self.driver).claims()

    def holdings(self, hosts: Sequence[HostInventory]
                 ) -> list[running.Holding]:
        """Every holding of the cluster.

        :raises KubernetesError: the API cannot be read.
        """
        units = _unit_index(hosts)
        view = k8s_consumers.ConsumerView(self.api)
        found = view.consumers()
        registered = self._registered()
        nodes = {inv.hostname for inv in hosts} | {c.node for c in found}
        records, result = self._records(nodes)
        listed = set()
        for consumer in found:
            listed.add((consumer.node, consumer.name))
            record = records.get(consumer.node)
            namespace, _sep, pod_name = consumer.name.partition('/')
            grants = record.find(namespace, pod_name) if record else None
            result.extend(_pod_holdings(consumer, units, registered,
                                        grants.masks() if grants else None))
        for node, record in sorted(records.items()):
            for grants in sorted(record.pods.values(), key=lambda g: g.key):
                if (node, grants.key) not in listed:
                    result.extend(_record_holdings(node, grants, units))
        for claim in self.claims():
            result.extend(_claim_holdings(claim, self.driver))
        return result
