"""Stated needs applied to a pod's containers, pure functions over plain
dicts.

A pod states its needs in the pod-level annotation ``gpu.amd.com/workload``
(for one container) or per container in ``workload.gpu.amd.com/<name>``
(see :mod:`amdgpu_virt.k8s.admission.intent`). :func:`apply_intent` finds the
container each statement is for, judges it with the planner's policy
engine, and writes the limits (or, on the DRA path, the claim) into that
container and the decision into the pod's annotations. Anything it
refuses is named with its container.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.admission import intent as pod_intent
from amdgpu_virt.k8s.admission import rules as admission
from amdgpu_virt.model import GpuModel
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami


@dataclasses.dataclass(frozen=True)
class ContainerDecision:
    """The policy's decision on the needs one container states.

    :ivar key: the annotation stating them.
    :ivar container: the container's name.
    :ivar field_path: the container as an Event names it
        (``spec.containers{name}``).
    :ivar claim: the pod's claim entry for it (the DRA path).
    """

    key: str
    container: str
    field_path: str
    claim: str
    decision: pod_intent.IntentDecision

    @property
    def pod_level(self) -> bool:
        """Stated in the pod-level form (``gpu.amd.com/workload``)."""
        return self.key == pod_intent.ANNOTATION

    @property
    def message(self) -> str:
        """The reason, naming the container."""
        return 'container %r: %s' % (self.container, self.decision.reason)


def _add_claim(pod: dict[str, Any], target: dict[str, Any],
               chosen: ContainerDecision, problems: list[str]) -> bool:
    """Reference the decision's ResourceClaimTemplate from the pod and
    its container (in place); False with the reason in ``problems``."""
    template = pod_intent.claim_template(chosen.decision)['metadata'][
        'name']
    spec = pod['spec']
    claims = spec.setdefault('resourceClaims', [])
    if not isinstance(claims, list):
        problems.append('spec.resourceClaims: not a list')
        return False
    mine = [c for c in claims if isinstance(c, dict)
            and c.get('name') == chosen.claim]
    if mine and mine[0].get('resourceClaimTemplateName') != template:
        problems.append('container %r: spec.resourceClaims[%s]: set by the '
                        'pod, but the policy chose template %s' % (
                            chosen.container, chosen.claim, template))
        return False
    if not mine:
        claims.append({'name': chosen.claim,
                       'resourceClaimTemplateName': template})
    uses = target['resources'].setdefault('claims', [])
    if not isinstance(uses, list):
        problems.append('container %r: resources.claims is not a list'
                        % chosen.container)
        return False
    if not any(isinstance(u, dict) and u.get('name') == chosen.claim
               for u in uses):
        uses.append({'name': chosen.claim})
    return True


@dataclasses.dataclass(frozen=True)
class DecisionEvent:
    """One Event recording a pod's decision.

    :ivar key: what makes a retried request write it once.
    :ivar field_path: the container it is for (None: several, or the
        pod).
    """

    key: str
    message: str
    field_path: str | None


def decision_events(decisions: Sequence[ContainerDecision], uid: str
                    ) -> list[DecisionEvent]:
    """One Event per distinct decision of a pod (containers with the same
    needs share one), keyed by the admission request's ``uid``."""
    groups: dict[str, list[ContainerDecision]] = {}
    for one in decisions:
        groups.setdefault(one.decision.reason, []).append(one)
    events = []
    for reason, group in groups.items():
        first = group[0]
        if len(group) == 1 and first.pod_level:
            events.append(DecisionEvent(uid, reason, first.field_path))
        elif len(group) == 1:
            events.append(DecisionEvent('%s/%s' % (uid, first.container),
                                        first.message, first.field_path))
        else:
            names = [one.container for one in group]
            events.append(DecisionEvent(
                '%s/%s' % (uid, ','.join(names)), 'containers %s: %s' % (
                    _few([repr(n) for n in names]), reason), None))
    return events


def _targets(spec: Mapping[str, Any], annotations: Mapping[str, Any],
             stated: Sequence[pod_intent.Statement], problems: list[str]
             ) -> list[tuple[pod_intent.Statement, str, dict[str, Any]]]:
    """(statement, field path, container) for each statement whose
    container exists; the others are named in ``problems``."""
    named: dict[str, tuple[str, dict[str, Any]]] = {}
    for where, container in admission.containers(spec):
        field = where.split('[')[0]
        if isinstance(container.get('name'), str):
            named.setdefault(container['name'], ('%s{%s}' % (
                field, container['name']), container))
    ephemeral = {c.get('name') for _w, c in admission.containers(
        spec, ('ephemeralContainers',))}
    found = []
    taken: dict[str, str] = {}
    unknown: list[pod_intent.Statement] = []
    for statement in stated:
        if statement.container is None:
            target_name = annotations.get(pod_intent.CONTAINER_ANNOTATION)
            target = next((c for _w, c in admission.containers(
                spec, ('containers',)) if target_name is None or
                c.get('name') == target_name), None)
            if target is None:
                problems.append(
                    'metadata.annotations[%s]: no container %r' % (
                        pod_intent.CONTAINER_ANNOTATION, target_name)
                    if target_name else
                    'spec.containers: none to give the GPUs to')
                continue
            name = str(target.get('name', '?'))
            path = 'spec.containers{%s}' % name
        else:
            name = statement.container
            if name not in named:
                unknown.append(statement)
                continue
            path, target = named[name]
        if name in taken:
            problems.append('container %r: needs stated twice, in %s and '
                            '%s; state them once' % (name, taken[name],
                                                     statement.key))
            continue
        taken[name] = statement.key
        found.append((statement, path, target))
    if unknown:
        problems.append(
            'metadata.annotations[%s]: the pod has no container or init '
            'container %s%s (it has: %s)' % (
                _few([s.key for s in unknown]),
                _few([repr(s.container) for s in unknown]),
                ', and an ephemeral container cannot be given GPUs'
                if any(s.container in ephemeral for s in unknown) else '',
                _few(sorted(named)) or 'none'))
    return found


def _few(items: Sequence[str], most: int = 8, width: int = 80) -> str:
    """``items`` for a message: at most ``most``, each cut to ``width``
    (a hostile pod may carry thousands of long names)."""
    shown = [i if len(i) <= width else i[:width] + '...'
             for i in items[:most]]
    if len(items) > most:
        shown.append('and %d more' % (len(items) - most))
    return ', '.join(shown)


@dataclasses.dataclass
class _Judge:
    """Judges the statements of one pod: the cluster's shapes (and the
    levels its GPUs enforce, for a namespace that requires one) are read
    once, and the same needs stated for several containers are judged
    once."""

    intent: admission.IntentPolicy
    where: str
    isolated: str | None
    memory: pod_intent.MemoryRule | None = None
    memo: dict[str, pod_intent.IntentDecision] = dataclasses.field(
        default_factory=dict)
    shapes: tuple[Sequence[GpuModel], Mapping[GpuModel, int],
                  Mapping[str, frozenset[enforcement.Level]] | None] \
        | None = None

    def _shapes(self) -> tuple[Sequence[GpuModel], Mapping[GpuModel, int],
                               Mapping[str, frozenset[enforcement.Level]]
                               | None]:
        if self.shapes is None:
            most = self.intent.most() if self.intent.most is not None \
                else {}
            levels = self.intent.levels() if self.memory is not None and \
                self.intent.levels is not None else None
            self.shapes = (self.intent.models(), most, levels)
        return self.shapes

    def __call__(self, statement: pod_intent.Statement
                 ) -> pod_intent.IntentDecision | str:
        """The decision on one statement, or the reason it is refused.

        :raises ClusterShapesUnknown: the cluster's GPU shapes cannot be
            read.
        """
        try:
            raw = pod_intent.parse(statement.value, self.where,
                                   statement.key)
            workload = pod_intent.workload(raw, 'pod', self.isolated,
                                           statement.key)
        except exception.WorkloadSpecError as err:
            return '; '.join(err.problems)
        key = json.dumps(raw, sort_keys=True, default=str)
        if key not in self.memo:
            models, most, levels = self._shapes()
            self.memo[key] = pod_intent.decide(
                workload, models, self.intent.engine, memory=self.memory,
                levels=levels, most=most)
        decision = self.memo[key]
        return decision if decision.code is Code.PLACED else \
            decision.reason


def _use_types(chosen: Sequence[ContainerDecision], problems: list[str]
               ) -> tuple[str, ...]:
    """The GPU types every container's decision allows (one
    ``amd.com/use-gputype`` holds for the whole pod)."""
    allowed: set[str] | None = None
    for one in chosen:
        if one.decision.use_types:
            types = set(one.decision.use_types)
            allowed = types if allowed is None else allowed & types
    if allowed is None:
        return ()
    if not allowed:
        problems.append('%s: the GPU types these containers fit have none '
                        'in common, and %s holds for the whole pod' % (
                            '; '.join('container %r fits only %s' % (
                                one.container, ', '.join(
                                    one.decision.use_types))
                                for one in chosen if one.decision.use_types),
                            hami.USE_GPUTYPE))
    return tuple(sorted(allowed))


def apply_intent(pod: dict[str, Any], namespace: str, name: str,
                 isolated: str | None, intent: admission.IntentPolicy | None,
                 problems: list[str],
                 memory: pod_intent.MemoryRule | None = None,
                 budget: admission.Budget = admission.UNBOUNDED
                 ) -> list[ContainerDecision]:
    """Set the limits the policy chooses for the stated needs (in place):
    the pod-level form for its one container, and each per-container
    form for the container it names.

    At most ``intent.max_statements`` statements are read: a pod with
    more is refused before any is parsed.

    :param memory: what the namespace requires of a slice's memory
        enforcement (its label).
    :returns: the decisions (empty: no needs stated, or refused; the
        reasons, each naming its container, are in ``problems``).
    :raises ReviewBudgetExceeded: ``budget`` ran out.
    """
    annotations = (pod.get('metadata') or {}).get('annotations') or {}
    where = 'pod %s/%s' % (namespace, name)
    stated = pod_intent.statements(annotations)
    keys = {s.key for s in stated}
    stray = sorted(k for k in annotations if isinstance(k, str) and
                   pod_intent.stated_by(k) not in (None, *keys))
    if stray:
        problems.append('metadata.annotations[%s]: written by the webhook '
                        'only, for the needs a pod states in %s or %s<name>'
                        % (_few(stray), pod_intent.ANNOTATION,
                           pod_intent.CONTAINER_PREFIX))
    if not stated:
        return []
    if intent is None:
        problems.append('metadata.annotations[%s]: this webhook does not '
                        'translate stated needs (no policy engine)'
                        % _few(sorted(keys)))
        return []
    if len(stated) > intent.max_statements:
        problems.append('metadata.annotations[%s]: %d statements of needs; '
                        'a pod may carry at most %d (one per container '
                        'that gets GPUs)' % (_few([s.key for s in stated]),
                                             len(stated),
                                             intent.max_statements))
        return []
    spec = pod.get('spec') or {}
    failed = len(problems)
    targets = _targets(spec, annotations, stated, problems)
    chosen: list[ContainerDecision] = []
    judge = _Judge(intent, where, isolated, memory)
    for statement, path, target in targets:
        budget.check('judging %s' % statement.key)
        container = str(target.get('name', '?'))
        try:
            judged = judge(statement)
        except exception.ClusterShapesUnknown as err:
            problems.append('metadata.annotations[%s]: cannot be judged: %s'
                            % (statement.key, err))
            return []
        if isinstance(judged, str):
            problems.append('container %r: metadata.annotations[%s]: %s' % (
                container, statement.key, judged))
            continue
        resources = target.setdefault('resources', {})
        if not isinstance(resources, dict):
            problems.append('container %r: resources is not an object'
                            % container)
            continue
        limits = resources.get('limits') or {}
        if not isinstance(limits, dict):
            problems.append('container %r: resources.limits is not an '
                            'object' % container)
            continue
        given = {k: str(v) for k, v in limits.items() if k in hami.RESOURCES}
        wanted = {} if intent.dra else dict(judged.limits)
        if given and given != wanted:
            problems.append('container %r: resources.limits[%s]: state '
                            'either %s or raw %s resources, not both (the '
                            'policy chose %s)' % (
                                container, ', '.join(sorted(given)),
                                statement.key, hami.RESOURCE_GPU,
                                ', '.join('%s=%s' % i for i in sorted(
                                    judged.limits.items()))))
            continue
        one = ContainerDecision(statement.key, container, path,
                                pod_intent.claim_name(statement.container),
                                judged)
        if intent.dra:
            if not _add_claim(pod, target, one, problems):
                continue
        else:
            resources['limits'] = {**limits, **judged.limits}
        chosen.append(one)
    use_types = () if intent.dra else _use_types(chosen, problems)
    if len(problems) > failed:
        return []
    meta = pod['metadata']
    new_annotations = dict(annotations)
    for one in chosen:
        decision_key, reason_key = pod_intent.decision_keys(
            None if one.pod_level else one.container)
        new_annotations[decision_key] = one.decision.label
        new_annotations[reason_key] = one.decision.reason
    if use_types:
        new_annotations[hami.USE_GPUTYPE] = ','.join(use_types)
    meta['annotations'] = new_annotations
    return chosen
