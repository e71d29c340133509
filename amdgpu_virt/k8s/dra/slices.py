"""ResourceSlices (resource.k8s.io/v1) of one node: pure.

The pool is the node (pool name = node name). ``resourceSliceCount``
counts every slice of the pool, counter slices included, and every slice
carries the same ``generation``. Quantities are written in canonical form
(:mod:`amdgpu_virt.k8s.api.quantity`: ``24Gi``, not ``24576Mi``), as the
API server stores them. Where the counter sets of partitioned GPUs go
depends on the API server (:class:`~amdgpu_virt.k8s.dra.served.Layout`):

* ``separate`` (Kubernetes 1.35 and later, the only layout they accept):
  counter sets in slices of their own (at most 8 per slice), devices in
  others, at most 128 devices per slice, 64 when any device of the slice
  consumes counters;
* ``mixed`` (Kubernetes 1.34, which resolves a device's ``counterSet``
  only in its own slice): each counter set in the slice of the devices
  that consume it, at most 128 devices, 32 counters over all counter sets
  and 1024 consumed counters per slice (1.34's limits). All devices go in
  one slice when they fit, so the publishing order is the same as in the
  separate layout.

Slice names are ``<node>-<driver>-<NN>``: the allocator reads the slices
of a pool sorted by name, so the index keeps the publishing order of
:func:`amdgpu_virt.k8s.dra.devices.plan`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.dra import served as dra_served
from amdgpu_virt.k8s.dra.devices import DeviceType, DraDevice
from amdgpu_virt.k8s.dra.served import Layout, layout_for
from amdgpu_virt.sharing import enforcement

API_VERSION = 'resource.k8s.io/v1'
MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS = 64
MAX_COUNTER_SETS = 8
#: Kubernetes 1.34's limits of a slice: counters over all counter sets,
#: and counters consumed over all devices
MAX_SHARED_COUNTERS_1_34 = 32
MAX_CONSUMED_COUNTERS_1_34 = 1024
#: standard attributes of the deviceattribute package: the PCI address
#: (Kubernetes 1.35+) and the PCIe root complex, ``pci<domain>:<bus>``
#: (1.34+), which claims match across drivers to align a GPU with a NIC
PCI_BUS_ID = 'resource.kubernetes.io/pciBusID'
PCIE_ROOT = 'resource.kubernetes.io/pcieRoot'
MANAGED_LABEL = 'app.kubernetes.io/managed-by'
MANAGER = 'amdgpu-virt'
MAX_NAME = 253


def layout_of(slices: Sequence[dict[str, Any]]) -> Layout | None:
    """The layout of stored slices; None when none holds counters.

    :returns: MIXED when a slice holds devices and counter sets, SEPARATE
        when one holds counter sets only.
    """
    found = None
    for obj in slices:
        spec = obj.get('spec') or {}
        if spec.get('sharedCounters'):
            if spec.get('devices'):
                return Layout.MIXED
            found = Layout.SEPARATE
    return found


_mi = quantity.mebibytes
_int = quantity.decimal


def slice_prefix(node: str, driver: str) -> str:
    """``<node>-<driver>``, hashed when a name would exceed 253 characters."""
    prefix = '%s-%s' % (node, driver)
    if len(prefix) + 3 > MAX_NAME:
        digest = hashlib.sha256(prefix.encode()).hexdigest()[:12]
        prefix = '%s-%s' % (prefix[:MAX_NAME - 3 - 13], digest)
    return prefix


def _attributes(device: DraDevice) -> dict[str, Any]:
    gpu = device.gpu
    attrs: dict[str, Any] = {
        'type': {'string': device.type.value},
        'model': {'string': gpu.model.name[:64]},
        'productName': {'string': (gpu.product_name or
                                   gpu.model.product_name)[:64]},
        'family': {'string': gpu.model.family},
        'productId': {'string': '0x%04x' % gpu.device_id},
        'pciAddress': {'string': str(gpu.address)},
        PCI_BUS_ID: {'string': str(gpu.address)},
        'role': {'string': device.role.value},
        'cuUnit': {'int': device.cu_unit},
    }
    if device.pcie_root:
        attrs[PCIE_ROOT] = {'string': device.pcie_root}
    if gpu.model.gfx:
        attrs['gfx'] = {'string': gpu.model.gfx}
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs['numaNode'] = {'int': gpu.numa_node}
    # Only GPUs that can be partitioned say their modes.
    if gpu.compute_partition:
        attrs['computePartition'] = {'string': gpu.compute_partition}
    if gpu.memory_partition:
        attrs['memoryPartition'] = {'string': gpu.memory_partition}
    if device.partition is not None:
        attrs['partitionIndex'] = {'int': device.partition}
    if device.memory_enforcement:
        attrs[enforcement.DRA_ATTRIBUTE] = {
            'string': device.memory_enforcement}
    return attrs


def _capacity(device: DraDevice, memory_step_mib: int) -> dict[str, Any]:
    cus: dict[str, Any] = {'value': _int(device.compute_units)}
    memory: dict[str, Any] = {'value': _mi(device.memory_mib)}
    if device.shared:
        unit = device.cu_unit
        top = device.compute_units - device.compute_units % unit
        cus['requestPolicy'] = {
            'default': _int(top),
            'validRange': {'min': _int(unit), 'max': _int(top),
                           'step': _int(unit)}}
        step = min(memory_step_mib, device.memory_mib)
        mtop = device.memory_mib - device.memory_mib % step
        memory['requestPolicy'] = {
            'default': _mi(mtop),
            'validRange': {'min': _mi(step), 'max': _mi(mtop),
                           'step': _mi(step)}}
    return {'computeUnits': cus, 'memory': memory}


def device_object(device: DraDevice, memory_step_mib: int = 256
                  ) -> dict[str, Any]:
    """The ``spec.devices[]`` entry of ``device``."""
    obj: dict[str, Any] = {
        'name': device.name,
        'attributes': _attributes(device),
        'capacity': _capacity(device, memory_step_mib),
    }
    if device.counter_set is not None:
        obj['consumesCounters'] = [{
            'counterSet': device.counter_set,
            'counters': {name: {'value': _counter_value(name, value)}
                         for name, value in device.counters}}]
    if device.shared:
        obj['allowMultipleAllocations'] = True
    return obj


def _counter_value(name: str, value: int) -> str:
    return _mi(value) if name == 'memory' else _int(value)


def _chunks(devices: Sequence[DraDevice]) -> list[list[DraDevice]]:
    """Split ``devices``, in order, into slices within the device limits."""
    chunks: list[list[DraDevice]] = []
    current: list[DraDevice] = []
    countered = False
    for device in devices:
        would_count = countered or device.counter_set is not None
        limit = MAX_DEVICES_WITH_COUNTERS if would_count else MAX_DEVICES
        if current and len(current) + 1 > limit:
            chunks.append(current)
            current, countered = [], False
            would_count = device.counter_set is not None
        current.append(device)
        countered = would_count
    if current:
        chunks.append(current)
    return chunks


def _counter_set(counter_set: dra_devices.CounterSet) -> dict[str, Any]:
    return {'name': counter_set.name,
            'counters': {name: {'value': _counter_value(name, value)}
                         for name, value in counter_set.counters}}


def _separate(plan: dra_devices.DevicePlan, memory_step_mib: int
              ) -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = []
    for chunk in _chunks(plan.devices):
        specs.append({'devices': [device_object(d, memory_step_mib)
                                  for d in chunk]})
    sets = list(plan.counter_sets)
    for start in range(0, len(sets), MAX_COUNTER_SETS):
        specs.append({'sharedCounters': [
            _counter_set(cs) for cs in sets[start:start + MAX_COUNTER_SETS]]})
    return specs


class _Group:
    """The devices and counter sets of one mixed slice."""

    def __init__(self) -> None:
        self.sets: list[dra_devices.CounterSet] = []
        self.devices: list[int] = []
        self.counters = 0
        self.consumed = 0

    def fits(self, counter_set: dra_devices.CounterSet | None,
             devices: Sequence[tuple[int, DraDevice]]) -> bool:
        counters = len(counter_set.counters) if counter_set else 0
        return (len(self.devices) + len(devices) <= MAX_DEVICES
                and self.counters + counters <= MAX_SHARED_COUNTERS_1_34
                and self.consumed + sum(len(d.counters) for _i, d in devices)
                <= MAX_CONSUMED_COUNTERS_1_34)

    def add(self, counter_set: dra_devices.CounterSet | None,
            devices: Sequence[tuple[int, DraDevice]]) -> None:
        if counter_set is not None:
            self.sets.append(counter_set)
            self.counters += len(counter_set.counters)
        self.devices.extend(i for i, _d in devices)
        self.consumed += sum(len(d.counters) for _i, d in devices)


def _mixed(plan: dra_devices.DevicePlan, memory_step_mib: int
           ) -> list[dict[str, Any]]:
    """Each counter set with the devices that consume it, in few slices;
    devices keep their publishing order within a slice.

    :raises InventoryError: one GPU's devices exceed 1.34's slice limits.
    """
    indexed = list(enumerate(plan.devices))
    groups: list[_Group] = [_Group()]
    for counter_set in plan.counter_sets:
        members = [(i, d) for i, d in indexed
                   if d.counter_set == counter_set.name]
        if not groups[-1].fits(counter_set, members):
            groups.append(_Group())
            if not groups[-1].fits(counter_set, members):
                raise exception.InventoryError(
                    source=plan.node, reason='GPU %s needs %d devices and '
                    '%d counters, more than one Kubernetes 1.34 '
                    'ResourceSlice holds' % (counter_set.name, len(members),
                                             len(counter_set.counters)))
        groups[-1].add(counter_set, members)
    for item in indexed:
        if item[1].counter_set is None:
            if not groups[-1].fits(None, [item]):
                groups.append(_Group())
            groups[-1].add(None, [item])
    specs: list[dict[str, Any]] = []
    for group in groups:
        if not group.devices:
            continue
        spec: dict[str, Any] = {'devices': [
            device_object(plan.devices[i], memory_step_mib)
            for i in sorted(group.devices)]}
        if group.sets:
            spec['sharedCounters'] = [_counter_set(cs) for cs in group.sets]
        specs.append(spec)
    return specs


def build(plan: dra_devices.DevicePlan, driver: str, generation: int = 1,
          memory_step_mib: int = 256,
          layout: Layout = Layout.SEPARATE) -> list[dict[str, Any]]:
    """The ResourceSlices of ``plan``'s node, in name order.

    A node that offers nothing has no slice at all.

    :raises InventoryError: the mixed layout cannot hold a GPU.
    """
    if layout is Layout.MIXED:
        specs = _mixed(plan, memory_step_mib)
    else:
        specs = _separate(plan, memory_step_mib)
    prefix = slice_prefix(plan.node, driver)
    result = []
    for index, extra in enumerate(specs):
        spec: dict[str, Any] = {
            'driver': driver,
            'pool': {'name': plan.node, 'generation': generation,
                     'resourceSliceCount': len(specs)},
            'nodeName': plan.node,
        }
        spec.update(extra)
        result.append({
            'apiVersion': API_VERSION, 'kind': 'ResourceSlice',
            'metadata': {'name': '%s-%02d' % (prefix, index),
                         'labels': {MANAGED_LABEL: MANAGER}},
            'spec': spec})
    return result


def device_types(slices: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Device name -> ``type`` attribute, over ``slices`` (for reports)."""
    return {d['name']: d['attributes']['type']['string']
            for s in slices for d in s['spec'].get('devices', [])}


def render_yaml(inventory: Any, ledger: Any, host: str, driver: str,
                partition_devices: bool = True,
                memory_step_mib: int = 256,
                served: dra_served.Served = dra_served.FULL,
                without_counters: str = dra_devices.WHOLE) -> str:
    """The host's slices as YAML documents ('' when it offers none), on an
    API server that keeps what ``served`` says (by default: Kubernetes
    1.36 and later)."""
    import yaml

    plan = dra_devices.plan(host, inventory, ledger.for_host(host),
                            partition_devices=partition_devices,
                            served=served, without_counters=without_counters)
    docs = build(plan, driver, memory_step_mib=memory_step_mib,
                 layout=served.layout)
    if not docs:
        return ''
    return ('# Generated by amdgpu-virt for host %s: the ResourceSlices '
            'its DRA plugin\n# publishes (generation 1 here; the plugin '
            'raises it on every change)\n# on an API server that keeps '
            '%s.\n' % (host, served.describe()) +
            yaml.safe_dump_all(docs, sort_keys=False))


__all__ = ['API_VERSION', 'DeviceType', 'Layout', 'build', 'device_object',
           'device_types', 'layout_for', 'layout_of', 'render_yaml',
           'slice_prefix']
