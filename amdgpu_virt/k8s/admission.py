"""The admission rules for GPU pods, pure functions over plain dicts.

:mod:`amdgpu_virt.k8s.webhook` applies them to each AdmissionReview: the
checks of one container's resources, environment and security context;
the annotations only the project may write and how an UPDATE changed
them; and the translation of a pod's stated needs
(:mod:`amdgpu_virt.k8s.intent`) into container limits.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import intent as pod_intent
from amdgpu_virt.model import GpuModel
from amdgpu_virt.policy import engine as policy_engine
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.filters import isolation
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.sharing import hami

_INTEGER = re.compile(r'^\+?[0-9]+$')
#: Pod annotations only the project writes: HAMi's allocation record and
#: the webhook's own decision (the intent itself is fixed at creation).
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
        (:func:`amdgpu_virt.k8s.intent.claim_template`) instead of
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


def containers(spec: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(JSON path, container) of init containers then containers."""
    found: list[tuple[str, dict[str, Any]]] = []
    for field in ('initContainers', 'containers'):
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


def integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    return None


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
    """The protected annotations (and label) that differ."""
    old_meta = mapping(old.get('metadata'), 'request.oldObject.metadata')
    new_meta = mapping(new.get('metadata'), 'request.object.metadata')
    changed: list[str] = []
    for field in ('annotations', 'labels'):
        before = mapping(old_meta.get(field), 'metadata.%s' % field)
        after = mapping(new_meta.get(field), 'metadata.%s' % field)
        keys = PROTECTED_ANNOTATIONS if field == 'annotations' \
            else (hami.VGPU_NODE,)
        changed.extend('metadata.%s[%s]' % (field, key) for key in keys
                       if before.get(key) != after.get(key))
    return changed


def username(request: Mapping[str, Any]) -> str:
    info = request.get('userInfo')
    name = info.get('username') if isinstance(info, Mapping) else None
    return name if isinstance(name, str) else ''


def _add_claim(pod: dict[str, Any], target: dict[str, Any],
               decision: pod_intent.IntentDecision,
               problems: list[str]) -> bool:
    """Reference the decision's ResourceClaimTemplate from the pod and
    its container (in place); False with the reason in ``problems``."""
    template = pod_intent.claim_template(decision)['metadata']['name']
    spec = pod['spec']
    claims = spec.setdefault('resourceClaims', [])
    if not isinstance(claims, list):
        problems.append('spec.resourceClaims: not a list')
        return False
    mine = [c for c in claims if isinstance(c, dict)
            and c.get('name') == pod_intent.CLAIM_NAME]
    if mine and mine[0].get('resourceClaimTemplateName') != template:
        problems.append('spec.resourceClaims[%s]: set by the pod, but the '
                        'policy chose template %s' % (pod_intent.CLAIM_NAME,
                                                      template))
        return False
    if not mine:
        claims.append({'name': pod_intent.CLAIM_NAME,
                       'resourceClaimTemplateName': template})
    uses = target['resources'].setdefault('claims', [])
    if not isinstance(uses, list):
        problems.append('container %r: resources.claims is not a list'
                        % target.get('name'))
        return False
    if not any(isinstance(u, dict) and u.get('name') ==
               pod_intent.CLAIM_NAME for u in uses):
        uses.append({'name': pod_intent.CLAIM_NAME})
    return True


def apply_intent(pod: dict[str, Any], namespace: str, name: str,
                  isolated: str | None, intent: IntentPolicy | None,
                  problems: list[str]) -> pod_intent.IntentDecision | None:
    """Set the limits the policy chooses for the stated needs (in place).

    :returns: the decision, or None (no intent, or refused: the reason is
        in ``problems``).
    """
    annotations = (pod.get('metadata') or {}).get('annotations') or {}
    where = 'pod %s/%s' % (namespace, name)
    if pod_intent.ANNOTATION not in annotations:
        present = [k for k in pod_intent.WEBHOOK_ANNOTATIONS
                   if k in annotations]
        if present:
            problems.append('metadata.annotations[%s]: written by the '
                            'webhook only, for pods that state %s' % (
                                ', '.join(present), pod_intent.ANNOTATION))
        return None
    if intent is None:
        problems.append('metadata.annotations[%s]: this webhook does not '
                        'translate stated needs (no policy engine)'
                        % pod_intent.ANNOTATION)
        return None
    try:
        raw = pod_intent.parse(annotations[pod_intent.ANNOTATION], where)
        workload = pod_intent.workload(raw, 'pod', isolated)
    except exception.WorkloadSpecError as err:
        problems.append('metadata.annotations[%s]: %s' % (
            pod_intent.ANNOTATION, '; '.join(err.problems)))
        return None
    decision = pod_intent.decide(workload, intent.models(), intent.engine)
    if decision.code is not Code.PLACED:
        problems.append('metadata.annotations[%s]: %s' % (
            pod_intent.ANNOTATION, decision.reason))
        return None
    spec = pod.get('spec') or {}
    containers = [c for c in spec.get('containers') or []
                  if isinstance(c, dict)]
    target_name = annotations.get(pod_intent.CONTAINER_ANNOTATION)
    target = None
    for container in containers:
        if target_name is None or container.get('name') == target_name:
            target = container
            break
    if target is None:
        problems.append('metadata.annotations[%s]: no container %r' % (
            pod_intent.CONTAINER_ANNOTATION, target_name) if target_name
            else 'spec.containers: none to give the GPUs to')
        return None
    resources = target.setdefault('resources', {})
    if not isinstance(resources, dict):
        problems.append('container %r: resources is not an object'
                        % target.get('name'))
        return None
    limits = resources.get('limits') or {}
    if not isinstance(limits, dict):
        problems.append('container %r: resources.limits is not an object'
                        % target.get('name'))
        return None
    stated = {k: str(v) for k, v in limits.items() if k in hami.RESOURCES}
    wanted = {} if intent.dra else dict(decision.limits)
    if stated and stated != wanted:
        problems.append('container %r: resources.limits[%s]: state either '
                        '%s or raw %s resources, not both (the policy '
                        'chose %s)' % (
                            target.get('name'), ', '.join(sorted(stated)),
                            pod_intent.ANNOTATION, hami.RESOURCE_GPU,
                            ', '.join('%s=%s' % i for i in sorted(
                                decision.limits.items()))))
        return None
    if intent.dra:
        if not _add_claim(pod, target, decision, problems):
            return None
    else:
        resources['limits'] = {**limits, **decision.limits}
    meta = pod['metadata']
    new_annotations = dict(annotations)
    new_annotations[pod_intent.DECISION_ANNOTATION] = decision.label
    new_annotations[pod_intent.REASON_ANNOTATION] = decision.reason
    if decision.use_types and not intent.dra:
        new_annotations[hami.USE_GPUTYPE] = ','.join(decision.use_types)
    meta['annotations'] = new_annotations
    return decision


