"""What an API server keeps of a ResourceSlice: pure.

An API server drops, silently and on every create, the ResourceSlice
fields of feature gates that are off (its ``PrepareForCreate`` runs
before validation, so nothing is refused either). The driver needs two
of them:

* ``DRAPartitionableDevices`` keeps ``sharedCounters`` and
  ``consumesCounters``: what makes a partitioned GPU's whole device and
  its partitions exclude each other;
* ``DRAConsumableCapacity`` keeps ``allowMultipleAllocations`` and
  ``capacity.requestPolicy``: what makes a GPU shareable.

Both are alpha, off by default, in Kubernetes 1.34 and 1.35, and beta, on
by default, from 1.36. Where the counter sets go changed in 1.35
(:class:`Layout`). :class:`Served` says what one API server keeps; the
device plan (:func:`amdgpu_virt.k8s.dra.devices.plan`) offers only what
still means the same there. The plugin learns it with a server-side
dry-run of :func:`probe_slice` (:func:`kept` reads the answer); without
a cluster, :func:`for_release` gives a release's defaults.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception

PARTITIONABLE = 'DRAPartitionableDevices'
CONSUMABLE = 'DRAConsumableCapacity'
#: the gates the driver depends on -> the first release that turns each
#: on by default (both beta there)
ON_BY_DEFAULT_SINCE = {PARTITIONABLE: (1, 36), CONSUMABLE: (1, 36)}
#: the first release that serves resource.k8s.io/v1 (DRA GA)
OLDEST = (1, 34)
#: the first release that keeps counter sets out of device slices
SEPARATE_SINCE = (1, 35)
#: the release whose defaults ``k8s dra-slices`` renders without
#: ``--release`` (later releases keep the same)
NEWEST = (1, 36)
#: the ResourceSlice fields each gate keeps
GATED_FIELDS = {
    PARTITIONABLE: ('sharedCounters', 'consumesCounters'),
    CONSUMABLE: ('allowMultipleAllocations', 'requestPolicy'),
}

_RELEASE = re.compile(r'^v?([0-9]{1,4})\.([0-9]{1,4})(\.[0-9]{1,6})?$')
_GATE = re.compile(r'^([A-Za-z0-9]{1,64})=(true|false)$', re.IGNORECASE)


class Layout(str, enum.Enum):  # noqa: UP042 (str() stays Enum-style)
    """Where the counter sets of a pool go.

    ``mixed``: each counter set in the slice of the devices that consume
    it (Kubernetes 1.34 resolves a ``counterSet`` only in the device's own
    slice); ``separate``: counter sets in slices of their own (1.35 and
    later refuse a slice with both devices and counter sets).
    """

    MIXED = 'mixed'
    SEPARATE = 'separate'


def layout_for(version: tuple[int, int]) -> Layout:
    """The layout an API server of ``(major, minor)`` accepts."""
    return Layout.SEPARATE if version >= SEPARATE_SINCE else Layout.MIXED


@dataclasses.dataclass(frozen=True)
class Served:
    """What one API server keeps of what the driver writes.

    :ivar counters: ``sharedCounters`` and ``consumesCounters``.
    :ivar consumable: ``allowMultipleAllocations`` and
        ``capacity.requestPolicy``.
    :ivar layout: where counter sets go.
    """

    counters: bool = True
    consumable: bool = True
    layout: Layout = Layout.SEPARATE

    def describe(self) -> str:
        """``counters, consumable capacity (separate layout)``."""
        kept = [name for name, on in (('shared counters', self.counters),
                                      ('consumable capacity',
                                       self.consumable)) if on]
        text = ', '.join(kept) or 'no gated field'
        if self.counters:
            text += ' (%s layout)' % self.layout.value
        return text


#: what a server that keeps everything (1.36 and later) keeps
FULL = Served()


def parse_release(text: str) -> tuple[int, int]:
    """``(1, 34)`` from ``1.34``, ``v1.34`` or ``1.34.2``.

    :raises UsageError: naming the text.
    """
    match = _RELEASE.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise exception.UsageError(
            option='--release', reason='%r is not a Kubernetes release '
            'such as 1.34' % (text,))
    return int(match.group(1)), int(match.group(2))


def parse_gates(text: str) -> dict[str, bool]:
    """``{'DRAPartitionableDevices': True}`` from kube-apiserver's
    ``--feature-gates`` syntax (``Name=true,Other=false``); only the gates
    of :data:`ON_BY_DEFAULT_SINCE` matter to the driver.

    :raises UsageError: naming the item at fault.
    """
    gates: dict[str, bool] = {}
    for item in filter(None, (i.strip() for i in text.split(','))):
        match = _GATE.match(item)
        if not match or match.group(1) not in ON_BY_DEFAULT_SINCE:
            raise exception.UsageError(
                option='--feature-gates', reason='%r is not <gate>=true|'
                'false with a gate of %s' % (item[:80], ', '.join(
                    sorted(ON_BY_DEFAULT_SINCE))))
        gates[match.group(1)] = match.group(2).lower() == 'true'
    return gates


def gate_defaults(version: tuple[int, int]) -> dict[str, bool]:
    """The driver's gates as ``version`` sets them by default."""
    return {gate: version >= since
            for gate, since in ON_BY_DEFAULT_SINCE.items()}


def for_release(version: tuple[int, int],
                gates: Mapping[str, bool] | None = None,
                layout: Layout | None = None) -> Served:
    """What an API server of ``version`` keeps with its default gates,
    changed by ``gates``.

    :param layout: a forced layout (``[dra] slice_layout``); None: the
        release's.
    """
    state = dict(gate_defaults(version), **dict(gates or {}))
    return Served(counters=state[PARTITIONABLE],
                  consumable=state[CONSUMABLE],
                  layout=layout or layout_for(version))


def probe_slice(node: str, driver: str, layout: Layout,
                prefix: str) -> dict[str, Any]:
    """A ResourceSlice holding every gated field the driver writes, to be
    created with ``dryRun=All`` (a name generated from ``prefix``, which
    the server cuts to 58 characters; nothing persisted).

    In the mixed layout its counter set is in the slice, in the separate
    one it is referred to only (1.35 and later check that a slice holds
    devices or counter sets, not where a counter set lives).
    """
    memory = {'value': '1Gi', 'requestPolicy': {
        'default': '1Gi', 'validRange': {'min': '1Gi'}}}
    spec: dict[str, Any] = {
        'driver': driver, 'nodeName': node,
        'pool': {'name': node, 'generation': 1, 'resourceSliceCount': 1},
        'devices': [{
            'name': 'probe', 'capacity': {'memory': memory},
            'allowMultipleAllocations': True,
            'consumesCounters': [{'counterSet': 'probe', 'counters': {
                'memory': {'value': '1Gi'}}}]}]}
    if layout is Layout.MIXED:
        spec['sharedCounters'] = [{'name': 'probe', 'counters': {
            'memory': {'value': '1Gi'}}}]
    return {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice',
            'metadata': {'generateName': '%s-probe-' % prefix},
            'spec': spec}


def kept(returned: Mapping[str, Any], layout: Layout) -> Served:
    """What the API server keeps, from its answer to :func:`probe_slice`."""
    spec = returned.get('spec')
    spec = spec if isinstance(spec, Mapping) else {}
    devices = spec.get('devices')
    device = devices[0] if isinstance(devices, list) and devices and \
        isinstance(devices[0], Mapping) else {}
    capacity = device.get('capacity')
    memory = capacity.get('memory') if isinstance(capacity,
                                                  Mapping) else None
    counters = bool(device.get('consumesCounters')) and (
        layout is Layout.SEPARATE or bool(spec.get('sharedCounters')))
    consumable = device.get('allowMultipleAllocations') is True and \
        isinstance(memory, Mapping) and bool(memory.get('requestPolicy'))
    return Served(counters=counters, consumable=consumable, layout=layout)


def dropped(sent: Mapping[str, Any], stored: Mapping[str, Any]
            ) -> set[str]:
    """The gates whose fields ``sent`` holds and ``stored`` lost."""
    have = _keys(stored, set())
    wanted = _keys(sent, set())
    return {gate for gate, fields in GATED_FIELDS.items()
            if any(f in wanted and f not in have for f in fields)}


def without(served: Served, gates: set[str]) -> Served:
    """``served`` without what ``gates`` keep."""
    return dataclasses.replace(
        served, counters=served.counters and PARTITIONABLE not in gates,
        consumable=served.consumable and CONSUMABLE not in gates)


def _keys(obj: Any, found: set[str]) -> set[str]:
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            found.add(key)
            _keys(value, found)
    elif isinstance(obj, list):
        for value in obj:
            _keys(value, found)
    return found


__all__ = ['CONSUMABLE', 'FULL', 'GATED_FIELDS', 'Layout', 'NEWEST',
           'OLDEST', 'ON_BY_DEFAULT_SINCE', 'PARTITIONABLE', 'Served',
           'dropped', 'for_release', 'gate_defaults', 'kept', 'layout_for',
           'parse_gates', 'parse_release', 'probe_slice', 'without']
