"""The admission rules for GPU pods, pure functions over plain dicts.

:mod:`amdgpu_virt.k8s.admission.webhook` applies them to each AdmissionReview:
the checks of one container's resources, environment and security context; of
the ephemeral containers ``kubectl debug`` adds; the annotations and labels
only the project may write and how an UPDATE changed them; and what turns a
pod's stated needs into resources (:class:`IntentPolicy`, applied by
:mod:`amdgpu_virt.k8s.admission.stated`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.admission import intent as pod_intent
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.model import GpuModel
from amdgpu_virt.policy import engine as policy_engine
from amdgpu_virt.policy.filters import isolation
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

#: Pod annotations only the project writes: HAMi's allocation record and
#: the webhook's own decision (the intent itself is fixed at creation);
#: the per-container forms
#: (:data:`amdgpu_virt.k8s.admission.intent.PREFIXES`) too.
PROTECTED_ANNOTATIONS = (hami.ALLOCATION_ANNOTATIONS
                         + pod_intent.WEBHOOK_ANNOTATIONS
                         + (pod_intent.ANNOTATION,
                            pod_intent.CONTAINER_ANNOTATION))


@dataclasses.dataclass(frozen=True)
class IntentPolicy:
    """What turns stated needs into resources.

    :param engine: the planner's policy engine (filters from ``[policy]``).
    :param models: the GPU shapes the cluster registers, now.
    :param dra: when True, the pod gets a claim of the matching DeviceClass
        (:func:`amdgpu_virt.k8s.admission.intent.claim_template`) instead of
        ``amd.com/*`` limits.
    """

    engine: policy_engine.Engine
    models: Callable[[], Sequence[GpuModel]]
    #: ask the DRA driver (a ResourceClaimTemplate) instead of HAMi
    #: resources
    dra: bool = False
    #: (namespace, template): makes sure the ResourceClaimTemplate exists
    #: (raises AmdgpuVirtError when it cannot)
    templates: Callable[[str, dict[str, Any]], None] | None = None
    #: model name -> the memory enforcement levels its GPUs register, now
    #: (for namespaces that require one); None: not known
    levels: Callable[[], Mapping[str, frozenset[enforcement.Level]]] \
        | None = None
    #: per model, the most GPUs of it one node registers (the bound of a
    #: statement's ``gpus``); None: not bounded
    most: Callable[[], Mapping[GpuModel, int]] | None = None
    #: most statements of needs one pod may carry (the pod-level form and
    #: the per-container ones), counted before any is read
    max_statements: int = 32


@dataclasses.dataclass(frozen=True)
class Budget:
    """The time a review may take: it ends at ``deadline`` (monotonic
    seconds), ``seconds`` after its request arrived."""

    deadline: float
    seconds: float

    @classmethod
    def starting(cls, start: float, seconds: float) -> Budget:
        return cls(start + seconds, seconds)

    def check(self, where: str) -> None:
        """:raises ReviewBudgetExceeded: the budget is spent (``where``
        says what the review was doing)."""
        if time.monotonic() > self.deadline:
            raise exception.ReviewBudgetExceeded(seconds=self.seconds,
                                                 where=where)


#: a review without a time bound (direct calls, tests)
UNBOUNDED = Budget(float('inf'), float('inf'))


def containers(spec: Mapping[str, Any],
               fields: Sequence[str] = ('initContainers', 'containers')
               ) -> list[tuple[str, dict[str, Any]]]:
    """(JSON path, container) of init containers then containers (or of
    ``fields``)."""
    found: list[tuple[str, dict[str, Any]]] = []
    for field in fields:
        items = spec.get(field) or []
        if isinstance(items, list):
            found.extend(('spec.%s[%d]' % (field, n), c)
                         for n, c in enumerate(items) if isinstance(c, dict))
    return found


def resources(container: Mapping[str, Any], kind: str
               ) -> dict[str, tuple[str, Any]]:
    """resource -> (field path, value) of ``limits`` or ``requests``."""
    found: dict[str, tuple[str, Any]] = {}
    resources = container.get('resources') or {}
    if not isinstance(resources, dict):
        return found
    values = resources.get(kind) or {}
    if isinstance(values, dict):
        for name, value in values.items():
            found[name] = ('resources.%s[%s]' % (kind, name), value)
    return found


#: ``amd.com/gpumem`` counts MiB: above this (16 TiB) a value is a unit
#: mistake (``4Gi`` is 4,294,967,296 MiB), not a GPU
MAX_GPUMEM = 1 << 24
#: the extender reads limits as 32-bit counts, as HAMi does
MAX_GPUS = (1 << 31) - 1


def integer(value: Any) -> int | None:
    """A whole-number limit as the API serves it (``10000`` comes back as
    ``10k``), or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        amount = quantity.value(value.strip() if isinstance(value, str)
                                else value)
    except exception.InvalidQuantity:
        return None
    if amount.denominator != 1 or amount < 0:
        return None
    return int(amount)


def env_problems(label: str, container: Mapping[str, Any]) -> list[str]:
    problems = []
    env = container.get('env') or []
    if isinstance(env, list):
        for n, var in enumerate(env):
            var_name = str(var.get('name', '')) if isinstance(
                var, dict) else ''
            if hami.is_plugin_env(var_name):
                problems.append('%s: env[%d] (%s): set by the GPU device '
                                'plugin, a pod may not set it itself'
                                % (label, n, var_name))
    sources = container.get('envFrom') or []
    if isinstance(sources, list):
        for n, source in enumerate(sources):
            prefix = source.get('prefix') if isinstance(source, dict) \
                else None
            clash = hami.plugin_env_clash(prefix if isinstance(
                prefix, str) else '')
            if clash is not None:
                problems.append(
                    '%s: envFrom[%d] (prefix %r): its keys could set %s, '
                    'which the GPU device plugin sets; give a prefix that '
                    'cannot, or name each variable in env' % (
                        label, n, prefix or '', clash))
    return problems


def container_problems(where: str, container: Mapping[str, Any],
                        limits: dict[str, tuple[str, Any]],
                        requests: dict[str, tuple[str, Any]],
                        isolated: str | None) -> list[str]:
    name = container.get('name', '?')
    label = 'container %r (%s)' % (name, where)
    problems = []
    for resource, (field, _value) in sorted(requests.items()):
        if resource not in limits:
            problems.append('%s: %s without a limit: give %s in '
                            'resources.limits (Kubernetes requires a limit '
                            'equal to the request for extended resources)'
                            % (label, field, resource))
    requested = limits
    if not requested:
        return problems
    security = container.get('securityContext') or {}
    if isinstance(security, dict) and security.get('privileged') is True:
        problems.append(
            '%s: securityContext.privileged: a privileged container sees '
            'every GPU of the node, so it may not request %s'
            % (label, ', '.join(sorted(requested))))
    for resource in (hami.RESOURCE_GPU, hami.RESOURCE_GPUMEM):
        if resource in requested:
            field, value = requested[resource]
            number = integer(value)
            if number is None or number < 0:
                problems.append('%s: %s: %r is not a non-negative integer'
                                % (label, field, value))
            elif resource == hami.RESOURCE_GPUMEM and number > MAX_GPUMEM:
                problems.append(
                    '%s: %s: %r is %d MiB, more than any GPU has (%s '
                    'counts MiB: write 4096 for 4 GiB)'
                    % (label, field, value, number, resource))
            elif number > MAX_GPUS:
                problems.append('%s: %s: %r is too large'
                                % (label, field, value))
    cores = None
    if hami.RESOURCE_GPUCORES in requested:
        field, value = requested[hami.RESOURCE_GPUCORES]
        try:
            cores = hami.parse_percent(value, field)
        except exception.HamiProtocolError:
            problems.append('%s: %s: %r is not an integer percentage in '
                            '1..100' % (label, field, value))
    if isolated is not None:
        refusal = isolation.cu_slice_refusal(Tenancy.ISOLATED)
        if cores is not None and cores < 100:
            problems.append('%s: %s: %d%% of a GPU, but %s only gets '
                            'whole GPUs: %s' % (
                                label, requested[hami.RESOURCE_GPUCORES][0],
                                cores, isolated, refusal))
        if hami.RESOURCE_GPUMEM in requested and \
                integer(requested[hami.RESOURCE_GPUMEM][1]) != 0:
            problems.append('%s: %s: a memory share, but %s only gets '
                            'whole GPUs: %s' % (
                                label, requested[hami.RESOURCE_GPUMEM][0],
                                isolated, refusal))
    problems.extend(env_problems(label, container))
    return problems


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise exception.AdmissionReviewError(field=field,
                                             reason='not an object')
    return value


def protected_changes(old: Mapping[str, Any], new: Mapping[str, Any]
                       ) -> list[str]:
    """The protected annotations (and labels) that differ."""
    old_meta = mapping(old.get('metadata'), 'request.oldObject.metadata')
    new_meta = mapping(new.get('metadata'), 'request.object.metadata')
    changed: list[str] = []
    for field in ('annotations', 'labels'):
        before = mapping(old_meta.get(field), 'metadata.%s' % field)
        after = mapping(new_meta.get(field), 'metadata.%s' % field)
        if field == 'annotations':
            keys = list(PROTECTED_ANNOTATIONS) + sorted(
                {k for k in (*before, *after) if isinstance(k, str) and
                 k.startswith(pod_intent.PREFIXES)})
        else:
            keys = list(hami.ALLOCATION_LABELS)
        changed.extend('metadata.%s[%s]' % (field, key) for key in keys
                       if before.get(key) != after.get(key))
    return changed


def is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` asks for or holds AMD GPUs: a container or init
    container with an ``amd.com/*`` resource, stated needs, or HAMi
    allocation state (what the webhook's matchConditions select)."""
    meta = pod.get('metadata')
    annotations = meta.get('annotations') if isinstance(meta, Mapping) \
        else None
    if isinstance(annotations, Mapping) and any(
            isinstance(k, str) and (k in hami.ALLOCATION_ANNOTATIONS or
                                    pod_intent.is_intent_key(k))
            for k in annotations):
        return True
    spec = pod.get('spec')
    if not isinstance(spec, Mapping):
        return False
    return any(name.startswith(hami.VENDOR)
               for _where, c in containers(spec)
               for kind in ('limits', 'requests')
               for name in resources(c, kind) if isinstance(name, str))


def ephemeral_problems(pod: Mapping[str, Any],
                       old: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with the ephemeral containers ``pod`` adds to
    ``old`` (all of them when ``old`` is None): ``kubectl debug`` adds
    them through ``pods/ephemeralcontainers``. None may ask for an
    ``amd.com/*`` resource; on a GPU pod none may set the device plugin's
    variables or run privileged (it would see every GPU of the node).
    """
    spec = pod.get('spec')
    if not isinstance(spec, Mapping):
        return []
    before: dict[Any, Any] = {}
    if old is not None and isinstance(old.get('spec'), Mapping):
        before = {c.get('name'): c for _w, c in containers(
            old['spec'], ('ephemeralContainers',))}
    gpu_pod = is_gpu_pod(pod) or (old is not None and is_gpu_pod(old))
    problems = []
    for where, container in containers(spec, ('ephemeralContainers',)):
        if before.get(container.get('name')) == container:
            continue
        label = 'ephemeral container %r (%s)' % (container.get('name', '?'),
                                                 where)
        for kind in ('limits', 'requests'):
            for resource, (field, _value) in sorted(
                    resources(container, kind).items()):
                if isinstance(resource, str) and \
                        resource.startswith(hami.VENDOR):
                    problems.append('%s: %s: an ephemeral container gets '
                                    'no GPU' % (label, field))
        if not gpu_pod:
            continue
        problems.extend(env_problems(label, container))
        security = container.get('securityContext') or {}
        if isinstance(security, dict) and \
                security.get('privileged') is True:
            problems.append('%s: securityContext.privileged: a privileged '
                            'container sees every GPU of the node, so it '
                            'may not join a GPU pod' % label)
    return problems


def username(request: Mapping[str, Any]) -> str:
    info = request.get('userInfo')
    name = info.get('username') if isinstance(info, Mapping) else None
    return name if isinstance(name, str) else ''
