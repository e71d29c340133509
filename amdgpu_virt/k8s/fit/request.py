"""What a pod asks for: the AMD GPU request of a pod, decoded with
HAMi's semantics (see :mod:`amdgpu_virt.k8s.fit`, which re-exports every
name here).

Pure: plain pod dicts in, frozen dataclasses out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.k8s.fit import host as fithost
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

MANAGED_RESOURCES = hami.RESOURCES


@dataclasses.dataclass(frozen=True)
class ContainerRequest:
    """What one container asks of each of its GPUs.

    :ivar name: container name (for reasons).
    :ivar nums: GPUs (0: the container asks for none).
    :ivar mem: MiB per GPU; 0 means the whole card's memory.
    :ivar percent: percent of each GPU's CUs, 1..100.
    """

    name: str
    nums: int = 0
    mem: int = 0
    percent: int = 100

    @property
    def exclusive(self) -> bool:
        """A whole GPU: all CUs and no memory limit."""
        return self.percent == 100 and not self.mem

    def describe(self) -> str:
        what = '%d GPU%s' % (self.nums, '' if self.nums == 1 else 's')
        if self.exclusive:
            return '%s, whole' % what
        return '%s, %d%% of CUs, %s' % (
            what, self.percent, '%d MiB' % self.mem if self.mem
            else 'all memory')


@dataclasses.dataclass(frozen=True)
class PodRequest:
    """The AMD GPU request of a pod, init containers first."""

    containers: tuple[ContainerRequest, ...]
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    node_policy: str = hami.DEFAULT_NODE_SCHEDULER_POLICY
    gpu_policy: str = hami.DEFAULT_GPU_SCHEDULER_POLICY
    #: the pod names its GPU policy (else it is the default)
    gpu_policy_set: bool = False
    #: what must enforce the memory limit of the pod's slices (its
    #: namespace's label; None: the node's own requirement is enough)
    memory_enforcement: enforcement.Requirement | None = None
    #: who requires it, for reasons (the namespace label)
    memory_enforcement_why: str = ''
    #: what the pod asks of its node's host (None: unreadable)
    host: fithost.HostAmount | None = fithost.NOTHING

    @property
    def wants_gpus(self) -> bool:
        return any(c.nums for c in self.containers)

    @property
    def filtered(self) -> bool:
        """The pod restricts which GPUs it takes (types, uuids or their
        memory enforcement)."""
        return bool(self.use_types or self.nouse_types or self.use_uuids
                    or self.nouse_uuids
                    or self.memory_enforcement is not None)

    def memory_refusal(self, info: hami.DeviceInfo,
                       want: ContainerRequest) -> str | None:
        """Why GPU ``info`` may not take ``want`` under the pod's memory
        enforcement requirement (whole GPUs are never shared: any level
        will do)."""
        if self.memory_enforcement is None or want.exclusive:
            return None
        return enforcement.refusal(
            self.memory_enforcement,
            enforcement.registered_level(info.custominfo),
            self.memory_enforcement_why or 'the pod')

    def shapes(self, reference_mem: int) -> tuple[packing.Shape, ...]:
        """The containers' shapes for the request mix; memory as a
        fraction of ``reference_mem`` MiB."""
        result = []
        for want in self.containers:
            if not want.nums:
                continue
            if want.exclusive:
                result.append(packing.Shape.whole_gpus(want.nums))
            else:
                result.append(packing.Shape.share(
                    want.percent / 100,
                    want.mem / reference_mem if want.mem and reference_mem
                    else 1.0, want.nums, want.mem))
        return tuple(result)


def _quantity(field: str, value: Any) -> int:
    """A whole-number resource limit as the API serves it: an integer or
    a quantity text (kube-apiserver returns ``10000`` as ``10k``)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise exception.ExtenderRequestError(
            field=field, reason='%r is not a whole number' % (value,))
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, int) or (text.isdigit() and text.isascii()
                                 and len(text) <= 10):
        amount = Fraction(int(text))   # the common case, without a parse
    else:
        try:
            amount = quantity.value(text)
        except exception.InvalidQuantity as err:
            raise exception.ExtenderRequestError(
                field=field, reason=str(err)) from None
    if amount.denominator != 1 or amount < 0:
        raise exception.ExtenderRequestError(
            field=field, reason='%r is not a whole number' % (value,))
    if amount > (1 << 31) - 1:
        raise exception.ExtenderRequestError(
            field=field, reason='%s is too large' % (value,))
    return int(amount)


def _words(annotations: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = annotations.get(key)
    if not isinstance(value, str):
        return ()
    return tuple(w.strip().lower() for w in value.split(',') if w.strip())


def pod_request(pod: Mapping[str, Any],
                default_node_policy: str = hami.DEFAULT_NODE_SCHEDULER_POLICY,
                default_gpu_policy: str = hami.DEFAULT_GPU_SCHEDULER_POLICY
                ) -> PodRequest:
    """Decode a pod's AMD GPU request (``Pod`` as the API serves it).

    :raises ExtenderRequestError: a non-integer or out-of-range resource,
        or an unknown scheduling policy, naming the container and field.
    """
    if not isinstance(pod, Mapping):
        raise exception.ExtenderRequestError(field='Pod',
                                             reason='not an object')
    spec = pod.get('spec') or {}
    meta = pod.get('metadata') or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        raise exception.ExtenderRequestError(
            field='Pod.spec', reason='spec and metadata must be objects')
    containers = []
    for kind in ('initContainers', 'containers'):
        items = spec.get(kind) or []
        if not isinstance(items, list):
            raise exception.ExtenderRequestError(
                field='Pod.spec.%s' % kind, reason='not a list')
        for number, container in enumerate(items):
            if not isinstance(container, Mapping):
                raise exception.ExtenderRequestError(
                    field='Pod.spec.%s[%d]' % (kind, number),
                    reason='not an object')
            name = str(container.get('name') or '#%d' % number)
            resources = container.get('resources') or {}
            limits = (resources.get('limits') or {}) \
                if isinstance(resources, Mapping) else {}
            if not isinstance(limits, Mapping):
                limits = {}
            where = 'Pod.spec.%s[%s].resources.limits' % (kind, name)
            present = [r for r in MANAGED_RESOURCES if r in limits]
            if not present:
                containers.append(ContainerRequest(name))
                continue
            nums = _quantity('%s[%s]' % (where, hami.RESOURCE_GPU),
                             limits[hami.RESOURCE_GPU]) \
                if hami.RESOURCE_GPU in limits else 1
            mem = _quantity('%s[%s]' % (where, hami.RESOURCE_GPUMEM),
                            limits.get(hami.RESOURCE_GPUMEM, 0))
            field = '%s[%s]' % (where, hami.RESOURCE_GPUCORES)
            try:
                percent = hami.parse_percent(
                    limits.get(hami.RESOURCE_GPUCORES, 100), field)
            except exception.HamiProtocolError as err:
                raise exception.ExtenderRequestError(
                    field=field, reason=err.kwargs['reason']) from None
            containers.append(ContainerRequest(name, nums, mem, percent))
    annotations = meta.get('annotations') or {}
    if not isinstance(annotations, Mapping):
        annotations = {}
    policies = []
    for key, default, allowed in (
            (hami.NODE_SCHEDULER_POLICY, default_node_policy,
             hami.NODE_SCHEDULER_POLICIES),
            (hami.GPU_SCHEDULER_POLICY, default_gpu_policy,
             hami.GPU_SCHEDULER_POLICIES)):
        value = annotations.get(key) or default
        if value not in allowed:
            raise exception.ExtenderRequestError(
                field='Pod.metadata.annotations[%s]' % key,
                reason='%r is none of %s' % (value, ', '.join(allowed)))
        policies.append(str(value))
    return PodRequest(
        containers=tuple(containers),
        use_types=_words(annotations, hami.USE_GPUTYPE),
        nouse_types=_words(annotations, hami.NOUSE_GPUTYPE),
        use_uuids=frozenset(_words(annotations, hami.USE_GPU_UUID)),
        nouse_uuids=frozenset(_words(annotations, hami.NOUSE_GPU_UUID)),
        node_policy=policies[0], gpu_policy=policies[1],
        gpu_policy_set=bool(annotations.get(hami.GPU_SCHEDULER_POLICY)),
        host=fithost.pod_request(spec))
