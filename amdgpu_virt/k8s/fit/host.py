"""What a pod asks of its node's host, and what a node offers: CPU and
memory, as kube-scheduler counts them.

A pod's request (:func:`pod_request`) is what kube-scheduler's
``NodeResourcesFit`` adds to a node (``resourcehelper.PodRequests``): the
sum of its containers and restartable init containers (sidecars), or the
largest init container (with the sidecars started before it) when that
is more, resource by resource; a resource the pod-level
``spec.resources.requests`` gives replaces that sum; plus
``spec.overhead``. A node offers ``status.allocatable``
(:func:`node_allocatable`). CPU is in millicores, memory in bytes, both
rounded up as Kubernetes rounds a quantity to its unit.

Quantities are read strictly (:func:`quantity`): what the API serves is
always valid, so an unreadable value makes the amount unknown (None), and
the extender then leaves that node's host out of its score (kube-scheduler
still checks the node's CPU and memory itself). Bounded work: at most
:data:`MAX_CONTAINERS` containers of a pod are read, and a quantity is at
most 64 characters.

Pure: plain dicts in, frozen dataclasses out.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import quantity as k8s_quantity

#: containers of one kind read per pod, at most (the API allows fewer)
MAX_CONTAINERS = 256
_LIMIT = 1 << 62
#: quantity texts whose value is kept (pods repeat a few)
_SEEN_ENTRIES = 4096


@dataclasses.dataclass(frozen=True, order=True)
class HostAmount:
    """CPU (millicores) and memory (bytes)."""

    cpu: int = 0
    memory: int = 0

    def __add__(self, other: HostAmount) -> HostAmount:
        return HostAmount(self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: HostAmount) -> HostAmount:
        return HostAmount(self.cpu - other.cpu, self.memory - other.memory)

    def holds(self, other: HostAmount) -> bool:
        """Both of ``other`` fit in this."""
        return other.cpu <= self.cpu and other.memory <= self.memory

    def describe(self) -> str:
        return '%gm CPU, %d MiB' % (self.cpu, self.memory >> 20)


NOTHING = HostAmount()


def quantity(value: Any, scale: int = 1) -> int | None:
    """A Kubernetes quantity times ``scale``, rounded up (None: not a
    quantity, negative, or beyond 2**62). Read by the one quantity
    reader, :mod:`amdgpu_virt.k8s.api.quantity`.

    :param scale: 1000 for CPU in millicores, 1 for bytes.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        amount = value * scale
        return amount if 0 <= amount < _LIMIT else None
    if not isinstance(value, str) or len(value) > 64:
        return None
    return _parse(value, scale)


@functools.lru_cache(maxsize=_SEEN_ENTRIES)
def _parse(value: str, scale: int) -> int | None:
    try:
        amount = k8s_quantity.value(value) * scale
    except exception.InvalidQuantity:
        return None
    if amount < 0:
        return None
    result = math.ceil(amount)
    return result if result < _LIMIT else None


def _amount(resources: Any) -> HostAmount | None:
    """CPU and memory of a ``requests`` (or ``allocatable``) map; absent
    ones are 0; None when one cannot be read."""
    if resources is None:
        return NOTHING
    if not isinstance(resources, Mapping):
        return None
    cpu = resources.get('cpu')
    memory = resources.get('memory')
    cpu_value = 0 if cpu is None else quantity(cpu, 1000)
    memory_value = 0 if memory is None else quantity(memory)
    if cpu_value is None or memory_value is None:
        return None
    return HostAmount(cpu_value, memory_value)


def _requests(container: Any) -> HostAmount | None:
    if not isinstance(container, Mapping):
        return None
    resources = container.get('resources')
    if resources is None:
        return NOTHING
    if not isinstance(resources, Mapping):
        return None
    return _amount(resources.get('requests'))


def _most(one: HostAmount, other: HostAmount) -> HostAmount:
    return HostAmount(max(one.cpu, other.cpu), max(one.memory, other.memory))


def pod_request(spec: Any) -> HostAmount | None:
    """What a pod's ``spec`` asks of its node (see the module's
    documentation), or None when it cannot be read."""
    if not isinstance(spec, Mapping):
        return None
    overhead = _amount(spec.get('overhead'))
    if overhead is None:
        return None
    containers = spec.get('containers') or []
    inits = spec.get('initContainers') or []
    if not isinstance(containers, list) or not isinstance(inits, list) or \
            len(containers) > MAX_CONTAINERS or len(inits) > MAX_CONTAINERS:
        return None
    running = NOTHING
    for container in containers:
        asked = _requests(container)
        if asked is None:
            return None
        running = running + asked
    # init containers run one after the other, each beside the sidecars
    # started before it; sidecars keep running beside the containers
    sidecars = NOTHING
    peak = NOTHING
    for container in inits:
        asked = _requests(container)
        if asked is None:
            return None
        if container.get('restartPolicy') == 'Always':
            sidecars = sidecars + asked
            peak = _most(peak, sidecars)
        else:
            peak = _most(peak, sidecars + asked)
    total = _most(running + sidecars, peak)
    # pod-level requests replace what the containers sum to, resource by
    # resource
    pod_level = spec.get('resources')
    if isinstance(pod_level, Mapping) and isinstance(
            pod_level.get('requests'), Mapping):
        asked = pod_level['requests']
        level = _amount(asked)
        if level is None:
            return None
        total = HostAmount(level.cpu if 'cpu' in asked else total.cpu,
                           level.memory if 'memory' in asked
                           else total.memory)
    return total + overhead


def node_allocatable(status: Any) -> HostAmount | None:
    """What a node's ``status`` offers pods (None: not reported or
    unreadable)."""
    if not isinstance(status, Mapping):
        return None
    allocatable = status.get('allocatable')
    if not isinstance(allocatable, Mapping) or 'cpu' not in allocatable \
            or 'memory' not in allocatable:
        return None
    return _amount(allocatable)
