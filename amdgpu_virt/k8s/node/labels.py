"""Node labels compatible with AMD's Kubernetes node labeller.

AMD's labeller (ROCm/k8s-device-plugin) describes a node's GPUs with
labels under ``amd.com/gpu.`` whose value is the property when every GPU
of the node agrees (``amd.com/gpu.cu-count=304``), and with counted
``beta.amd.com/gpu.<property>.<value>=<count>`` labels. Workloads and
tools select nodes by them, so the agent writes the same keys and value
formats for the GPUs it registers:

* ``family``: the amdgpu family acronym (``AI`` for gfx9, every Instinct);
* ``device-id``: PCI device id, 4 hex digits without ``0x``;
* ``product-name``: the product name made a valid label value;
* ``vram``: VRAM of a unit rounded to GiB with a ``G`` (``192G``);
* ``cu-count`` and ``simd-count``: per unit (a CPX partition counts as one
  unit, as it is one DRM card to the labeller);
* ``compute-memory-partition``: ``<compute>_<memory>`` in lower case
  (``cpx_nps4``), plus ``compute-partitioning-supported`` and
  ``memory-partitioning-supported`` (``true``/``false``);
* ``mode``: ``container`` (the GPU operator's label for GPUs given to pods).

The functions are pure; the agent compares and patches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Mapping

from amdgpu_virt.k8s.api.labels import label_value
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.model import Gpu

PREFIX = 'amd.com/gpu.'
BETA_PREFIX = 'beta.amd.com/gpu.'
#: CDNA and GCN have 4 SIMDs per CU
SIMD_PER_CU = 4
#: properties the labeller also publishes as counted beta labels
COUNTED = ('family', 'device-id', 'vram', 'simd-count', 'cu-count')


def is_managed(key: str) -> bool:
    """Labels this module owns on a node."""
    return key.startswith((PREFIX, BETA_PREFIX))


def _family(gpu: Gpu) -> str | None:
    gfx = gpu.model.gfx or ''
    return 'AI' if gfx.startswith('gfx9') else None


def unit_properties(gpu: Gpu, unit: devices.GpuUnit) -> dict[str, str]:
    """The labelled properties of one unit of ``gpu``."""
    props = {
        'device-id': '%04x' % gpu.device_id,
        'product-name': label_value(gpu.product_name
                                    or gpu.model.product_name),
        'vram': '%dG' % round(unit.vram_mib / 1024),
        'cu-count': str(unit.compute_units),
        'simd-count': str(unit.compute_units * SIMD_PER_CU),
        'compute-partitioning-supported': str(
            len(gpu.available_compute_partitions) > 1).lower(),
        'memory-partitioning-supported': str(
            len(gpu.available_memory_partitions) > 1).lower(),
        'mode': 'container',
    }
    family = _family(gpu)
    if family:
        props['family'] = family
    if gpu.compute_partition and gpu.memory_partition:
        props['compute-memory-partition'] = '%s_%s' % (
            gpu.compute_partition.lower(), gpu.memory_partition.lower())
    return {k: v for k, v in props.items() if v}


def node_labels(gpus: Mapping[str, Gpu],
                units: Iterable[devices.GpuUnit]) -> dict[str, str]:
    """The labels for ``units`` (the registered ones) of the node.

    :param gpus: the node's GPUs by PCI address string.
    """
    per_key: dict[str, Counter[str]] = {}
    for unit in units:
        gpu = gpus.get(unit.gpu_address)
        if gpu is None:
            continue
        for key, value in unit_properties(gpu, unit).items():
            per_key.setdefault(key, Counter())[value] += 1
    labels = {}
    for key, counts in sorted(per_key.items()):
        if len(counts) == 1:
            labels[PREFIX + key] = next(iter(counts))
        if key not in COUNTED:
            continue
        for value, count in sorted(counts.items()):
            labels['%s%s.%s' % (BETA_PREFIX, key, value)] = str(count)
    return labels


def label_changes(current: Mapping[str, str],
                  desired: Mapping[str, str]) -> dict[str, str | None]:
    """The merge-patch of the node's labels (None removes a stale one)."""
    changes: dict[str, str | None] = {
        k: v for k, v in desired.items() if current.get(k) != v}
    changes.update({k: None for k in current
                    if is_managed(k) and k not in desired})
    return changes
