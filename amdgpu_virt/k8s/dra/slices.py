"""ResourceSlices (resource.k8s.io/v1) of one node: pure.

The pool is the node (pool name = node name). Slices respect the API's
limits: at most 128 devices per slice, 64 when any device of the slice
consumes counters; counter sets live in slices of their own (the only
layout Kubernetes 1.35 and later accept), at most 8 per slice.
``resourceSliceCount`` counts every slice of the pool, counter slices
included, and every slice carries the same ``generation``.

Slice names are ``<node>-<driver>-<NN>``: the allocator reads the slices
of a pool sorted by name, so the index keeps the publishing order of
:func:`amdgpu_virt.k8s.dra.devices.plan`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.dra.devices import DeviceType, DraDevice

API_VERSION = 'resource.k8s.io/v1'
MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS = 64
MAX_COUNTER_SETS = 8
#: standard attributes of the deviceattribute package: the PCI address
#: (Kubernetes 1.35+) and the PCIe root complex, ``pci<domain>:<bus>``
#: (1.34+), which claims match across drivers to align a GPU with a NIC
PCI_BUS_ID = 'resource.kubernetes.io/pciBusID'
PCIE_ROOT = 'resource.kubernetes.io/pcieRoot'
MANAGED_LABEL = 'app.kubernetes.io/managed-by'
MANAGER = 'amdgpu-virt'
MAX_NAME = 253


def _mi(mib: int) -> str:
    return '%dMi' % mib


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
    return attrs


def _capacity(device: DraDevice, memory_step_mib: int) -> dict[str, Any]:
    cus: dict[str, Any] = {'value': str(device.compute_units)}
    memory: dict[str, Any] = {'value': _mi(device.memory_mib)}
    if device.shared:
        unit = device.cu_unit
        top = device.compute_units - device.compute_units % unit
        cus['requestPolicy'] = {
            'default': str(top),
            'validRange': {'min': str(unit), 'max': str(top),
                           'step': str(unit)}}
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
    return _mi(value) if name == 'memory' else str(value)


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


def build(plan: dra_devices.DevicePlan, driver: str, generation: int = 1,
          memory_step_mib: int = 256) -> list[dict[str, Any]]:
    """The ResourceSlices of ``plan``'s node, in name order.

    A node that offers nothing has no slice at all.
    """
    specs: list[dict[str, Any]] = []
    for chunk in _chunks(plan.devices):
        specs.append({'devices': [device_object(d, memory_step_mib)
                                  for d in chunk]})
    sets = list(plan.counter_sets)
    for start in range(0, len(sets), MAX_COUNTER_SETS):
        specs.append({'sharedCounters': [
            {'name': cs.name,
             'counters': {name: {'value': _counter_value(name, value)}
                          for name, value in cs.counters}}
            for cs in sets[start:start + MAX_COUNTER_SETS]]})
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
                memory_step_mib: int = 256) -> str:
    """The host's slices as YAML documents ('' when it offers none)."""
    import yaml

    plan = dra_devices.plan(host, inventory, ledger.for_host(host),
                            partition_devices=partition_devices)
    docs = build(plan, driver, memory_step_mib=memory_step_mib)
    if not docs:
        return ''
    return ('# Generated by amdgpu-virt for host %s: the ResourceSlices '
            'its DRA plugin\n# publishes (generation 1 here; the plugin '
            'raises it on every change).\n' % host +
            yaml.safe_dump_all(docs, sort_keys=False))


__all__ = ['API_VERSION', 'DeviceType', 'build', 'device_object',
           'device_types', 'render_yaml', 'slice_prefix']
