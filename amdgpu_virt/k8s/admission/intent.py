"""A pod's stated GPU needs, turned into resources by the policy engine.

Instead of raw ``amd.com/*`` resources, a pod may state what it needs in
the annotation ``gpu.amd.com/workload``, with the fields and units of a
workload spec (:mod:`amdgpu_virt.policy.workload`)::

    metadata:
      annotations:
        gpu.amd.com/workload: "memory: 20GiB, compute: 25%"

(YAML or JSON; the outer braces of a flow mapping may be left out). The
fields a pod may state are ``gpus``, ``memory``, ``compute``, ``tenancy``,
``sensitivity`` and ``p2p``. The namespace decides the tenancy: a pod in
an isolated namespace is isolated whatever it says (saying ``trusted``
there is refused); elsewhere a pod is trusted unless it says
``tenancy: isolated``.

That pod-level form gives GPUs to one container (the first of
``spec.containers``, or the one named by ``gpu.amd.com/workload-container``).
Each container (or init container) may instead state its own needs, in
an annotation keyed by its name, as Kubernetes keys per-container
annotations (``container.apparmor.security.beta.kubernetes.io/<name>``)::

    metadata:
      annotations:
        workload.gpu.amd.com/train: "memory: 20GiB, compute: 25%"
        workload.gpu.amd.com/prep: "gpus: 1"

Each statement is judged on its own, and its decision is written into
``decision.gpu.amd.com/<name>`` and ``decision-reason.gpu.amd.com/<name>``.

:func:`decide` judges the workload with the planner's own
:class:`~amdgpu_virt.policy.engine.Engine` (the same filters: platform,
isolation, P2P, size, interference) on the GPU shapes the cluster
registers, and answers with the container limits to set: a CU slice
(``amd.com/gpu``, ``amd.com/gpucores`` and ``amd.com/gpumem``) where a CU
slice is allowed on every GPU shape the workload fits, else whole GPUs
(``amd.com/gpu``, with ``amd.com/use-gputype`` naming the shapes that fit
when not all do), or, when nothing is allowed anywhere, a refusal with
the tightest reason. Nothing here talks to Kubernetes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from amdgpu_virt import exception
from amdgpu_virt import yamlutil
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy import engine as policy_engine
from amdgpu_virt.policy import workload as policy_workload
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

#: The pod's stated needs (a workload spec without name and platform).
ANNOTATION = 'gpu.amd.com/workload'
#: Which container gets the GPUs (default: the first of spec.containers).
CONTAINER_ANNOTATION = 'gpu.amd.com/workload-container'
#: What the webhook decided: ``cu-slice`` or ``whole`` (written by it).
DECISION_ANNOTATION = 'gpu.amd.com/decision'
#: Why, in one sentence with the numbers (written by the webhook).
REASON_ANNOTATION = 'gpu.amd.com/decision-reason'
#: Annotations only the webhook writes.
WEBHOOK_ANNOTATIONS = (DECISION_ANNOTATION, REASON_ANNOTATION)
#: Per-container forms: the prefix, then the container's name (a DNS
#: label of at most 63 characters, which is what an annotation key's name
#: part may hold).
CONTAINER_PREFIX = 'workload.gpu.amd.com/'
DECISION_PREFIX = 'decision.gpu.amd.com/'
REASON_PREFIX = 'decision-reason.gpu.amd.com/'
#: Prefixes of per-container annotations only the webhook writes.
WEBHOOK_PREFIXES = (DECISION_PREFIX, REASON_PREFIX)
#: Prefixes of every per-container annotation of stated needs.
PREFIXES = (CONTAINER_PREFIX,) + WEBHOOK_PREFIXES

FIELDS = ('gpus', 'memory', 'compute', 'tenancy', 'sensitivity', 'p2p')
#: Longest statement read, in characters (the longest sensible one, every
#: field given, is about a hundred); checked before it is parsed.
MAX_LENGTH = 512
#: Flow collections (``{...}``, ``[...]``) a statement may hold: its own
#: braces, nothing nested (a statement is one mapping of scalars);
#: checked on the text before it is parsed.
MAX_FLOW = 1
SLICE = 'cu-slice'
WHOLE = 'whole'
#: DeviceClasses of the DRA driver: whole GPUs, and CU shares.
DRA_WHOLE_CLASS = 'gpu.amd.com'
DRA_SHARE_CLASS = 'share.gpu.amd.com'
#: Name of the pod's claim entry (``spec.resourceClaims[].name``) for
#: the pod-level form; per-container forms get :func:`claim_name`.
CLAIM_NAME = 'amd-gpu'
#: Longest DNS label (a claim entry's name).
_DNS_LABEL = 63


@dataclasses.dataclass(frozen=True)
class IntentDecision:
    """The webhook's answer for a pod's stated needs.

    :ivar code: ``placed`` (resources chosen) or ``never-fits``.
    :ivar kind: DEDICATED or CU when placed.
    :ivar limits: container limits to set (resource -> quantity).
    :ivar use_types: GPU types the pod must land on (empty: any).
    :ivar reason: a sentence with the numbers behind the choice.
    :ivar trail: every filter verdict.
    """

    code: Code
    reason: str
    kind: Kind | None = None
    limits: Mapping[str, str] = dataclasses.field(default_factory=dict)
    use_types: tuple[str, ...] = ()
    trail: tuple[Verdict, ...] = ()
    #: GPUs, and per GPU of a slice the CUs (the most any fitting shape
    #: needs) and MiB, for a DRA claim
    gpus: int = 0
    cus: int | None = None
    memory_mib: int | None = None

    @property
    def label(self) -> str:
        """The value of :data:`DECISION_ANNOTATION`."""
        return SLICE if self.kind is Kind.CU else WHOLE


def claim_template(decision: IntentDecision) -> dict[str, Any]:
    """The ResourceClaimTemplate (``resource.k8s.io/v1``, without its
    namespace) asking the DRA driver for what ``decision`` chose: whole
    GPUs of DeviceClass :data:`DRA_WHOLE_CLASS`, or CU shares of
    :data:`DRA_SHARE_CLASS` with the consumable capacities
    ``computeUnits`` and ``memory``. Its name is derived from its content,
    so every pod that needs the same gets the same template.
    """
    request: dict[str, Any] = {'allocationMode': 'ExactCount',
                               'count': decision.gpus}
    if decision.kind is Kind.CU:
        request['deviceClassName'] = DRA_SHARE_CLASS
        capacity = {'computeUnits': quantity.decimal(decision.cus or 1)}
        if decision.memory_mib is not None:
            capacity['memory'] = quantity.mebibytes(decision.memory_mib)
        request['capacity'] = {'requests': capacity}
    else:
        request['deviceClassName'] = DRA_WHOLE_CLASS
    spec = {'spec': {'devices': {'requests': [
        {'name': 'gpu', 'exactly': request}]}}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()
                            ).hexdigest()[:12]
    return {'apiVersion': 'resource.k8s.io/v1',
            'kind': 'ResourceClaimTemplate',
            'metadata': {'name': 'amdgpu-virt-%s-%s' % (
                decision.label, digest), 'labels': {
                'app.kubernetes.io/managed-by': 'amdgpu-virt'}},
            'spec': spec}


@dataclasses.dataclass(frozen=True)
class Statement:
    """One statement of needs found in a pod's annotations.

    :ivar key: the annotation that holds it.
    :ivar value: its value, as the pod gives it (not yet read).
    :ivar container: the container it names (None: the pod-level form,
        whose container the caller finds).
    """

    key: str
    value: Any
    container: str | None = None


def statements(annotations: Mapping[str, Any]) -> list[Statement]:
    """The pod-level statement (first) and the per-container ones (in key
    order) of a pod's annotations."""
    found = []
    if ANNOTATION in annotations:
        found.append(Statement(ANNOTATION, annotations[ANNOTATION]))
    found.extend(Statement(key, annotations[key],
                           key[len(CONTAINER_PREFIX):])
                 for key in sorted(k for k in annotations
                                   if isinstance(k, str) and
                                   k.startswith(CONTAINER_PREFIX)))
    return found


def decision_keys(container: str | None) -> tuple[str, str]:
    """The annotations (decision, reason) written for the statement of
    ``container`` (None: the pod-level form)."""
    if container is None:
        return DECISION_ANNOTATION, REASON_ANNOTATION
    return DECISION_PREFIX + container, REASON_PREFIX + container


def stated_by(key: str) -> str | None:
    """The statement annotation a webhook-written annotation ``key``
    belongs to (None: ``key`` is not one the webhook writes)."""
    if key in WEBHOOK_ANNOTATIONS:
        return ANNOTATION
    for prefix in WEBHOOK_PREFIXES:
        if key.startswith(prefix):
            return CONTAINER_PREFIX + key[len(prefix):]
    return None


def is_intent_key(key: str) -> bool:
    """Whether ``key`` states needs or records their decision (fixed once
    the pod exists)."""
    return key in (ANNOTATION, CONTAINER_ANNOTATION) + WEBHOOK_ANNOTATIONS \
        or key.startswith(PREFIXES)


def claim_name(container: str | None) -> str:
    """The pod's claim entry for the statement of ``container``:
    ``amd-gpu`` for the pod-level form, ``amd-gpu-<container>`` (a digest
    of the name when that is longer than a DNS label) otherwise."""
    if container is None:
        return CLAIM_NAME
    name = '%s-%s' % (CLAIM_NAME, container)
    if len(name) <= _DNS_LABEL:
        return name
    return '%s-%s' % (CLAIM_NAME, hashlib.sha256(
        container.encode('utf-8', 'replace')).hexdigest()[:16])


def _text(value: Any, where: str, key: str) -> str:
    """The statement's text, within its bounds, ready to parse.

    :raises WorkloadSpecError: not a string, longer than
        :data:`MAX_LENGTH`, or nesting flow collections (counted on the
        text: nothing is parsed yet).
    """
    if not isinstance(value, str):
        raise exception.WorkloadSpecError(where, [
            '%s: %.80r is not a string' % (key, value)])
    if len(value) > MAX_LENGTH:
        raise exception.WorkloadSpecError(where, [
            '%s: %d characters, at most %d are read' % (
                key, len(value), MAX_LENGTH)])
    text = value.strip()
    if not text.startswith(('{', '[')) and ':' in text and \
            '\n' not in text:
        text = '{%s}' % text
    flow = max(text.count('{'), text.count('}')) + text.count('[') + \
        text.count(']')
    if flow > MAX_FLOW:
        raise exception.WorkloadSpecError(where, [
            '%s: nested: a statement is one mapping of plain values such '
            'as "memory: 20GiB, compute: 25%%", without lists or inner '
            'mappings' % key])
    return text


def parse(value: Any, where: str, key: str = ANNOTATION) -> dict[str, Any]:
    """The fields of an intent annotation value.

    Its size and nesting are bounded before it is parsed (see
    :func:`_text`), so a crafted statement costs no more than a plain one.

    :param where: names the pod in errors.
    :param key: the annotation that holds ``value`` (named in errors).
    :raises WorkloadSpecError: not a string, too long, nested, not a
        mapping of plain values, an alias (YAML anchors are refused: no
        alias bombs) or unknown fields.
    """
    text = _text(value, where, key)
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise exception.WorkloadSpecError(where, [
                    '%s: YAML aliases are not accepted' % key])
        raw = yamlutil.load(text, '%s of %s' % (key, where))
    except yaml.YAMLError as err:
        raise exception.WorkloadSpecError(where, [
            '%s: not YAML or JSON: %s' % (key, err)]) from None
    except exception.WorkloadSpecError:
        raise
    except exception.AmdgpuVirtError as err:
        raise exception.WorkloadSpecError(where, [str(err)]) from None
    if not isinstance(raw, Mapping):
        raise exception.WorkloadSpecError(where, [
            '%s: expected a mapping such as "memory: 20GiB, compute: 25%%"'
            % key])
    unknown = sorted(str(k)[:64] for k in raw if k not in FIELDS)
    if unknown:
        raise exception.WorkloadSpecError(where, [
            '%s: unknown field(s) %s; a pod may state: %s' % (
                key, ', '.join(unknown[:8]), ', '.join(FIELDS))])
    nested = sorted(str(k) for k, v in raw.items()
                    if isinstance(v, (Mapping, list)))
    if nested:
        raise exception.WorkloadSpecError(where, [
            '%s: %s: a plain value is expected, not a list or a mapping'
            % (key, ', '.join(nested))])
    return dict(raw)


@dataclasses.dataclass(frozen=True)
class MemoryRule:
    """What a namespace requires of its slices' memory enforcement.

    :ivar why: who requires it (the namespace label), for reasons.
    """

    requirement: enforcement.Requirement
    why: str


def memory_rule(namespace: str, labels: Mapping[str, Any] | None
                ) -> MemoryRule | None:
    """The rule of a namespace's labels (None: none, or a value that is
    no requirement, which the extender refuses)."""
    wanted, _problem = enforcement.namespace_requirement(labels)
    if wanted is None:
        return None
    return MemoryRule(wanted, 'namespace %r (label %s=%s)' % (
        namespace, enforcement.NAMESPACE_LABEL, wanted.value))


def levels_from_registrations(devices: Iterable[hami.DeviceInfo]
                              ) -> dict[str, frozenset[enforcement.Level]]:
    """Model name (as :func:`models_from_registrations` names it) -> the
    memory enforcement levels its GPUs register (unknown: ``none``)."""
    levels: dict[str, set[enforcement.Level]] = {}
    for device in devices:
        level = enforcement.registered_level(device.custominfo)
        levels.setdefault(device.type or 'unnamed', set()).add(
            level or enforcement.Level.NONE)
    return {name: frozenset(found) for name, found in levels.items()}


#: (type, CUs, MiB, CU allocation unit) of a GPU shape
ShapeKey = tuple[str, int, int, int]


def shape_key(device: hami.DeviceInfo) -> ShapeKey | None:
    """The shape of a registered device (None: it registers no CUs or no
    memory, so nothing can be placed on it)."""
    if device.devcore <= 0 or device.devmem <= 0:
        return None
    return device.type, device.devcore, device.devmem, device.cu_unit


def model_of(key: ShapeKey) -> GpuModel:
    """The model the policy engine judges for a shape."""
    kind, cores, mib, unit = key
    return GpuModel(name=kind or 'unnamed', product_name=kind,
                    pf_device_id=0, compute_units=cores, vram_mib=mib,
                    cu_alloc_unit=unit, known=False)


def models_from_registrations(devices: Iterable[hami.DeviceInfo]
                              ) -> tuple[GpuModel, ...]:
    """One model per GPU shape the cluster registers (type, CUs, MiB,
    allocation unit): what the extender can hand out, partitions
    included."""
    keys = {key for key in map(shape_key, devices) if key is not None}
    return tuple(model_of(key) for key in sorted(keys))


def most_per_node(nodes: Iterable[Mapping[ShapeKey, int]]
                  ) -> dict[GpuModel, int]:
    """Per model, the most GPUs of its shape one node registers (from
    each node's count of GPUs by shape): the most one pod can be given."""
    most: dict[ShapeKey, int] = {}
    for counts in nodes:
        for key, count in counts.items():
            most[key] = max(most.get(key, 0), count)
    return {model_of(key): count for key, count in most.items()}


def workload(raw: Mapping[str, Any], name: str, isolated: str | None,
             key: str = ANNOTATION) -> Workload:
    """The pod's :class:`Workload` (platform pod).

    :param isolated: why the namespace is isolated (None: it is not).
    :param key: the annotation the needs come from (named in errors).
    :raises WorkloadSpecError: naming every bad field, and a pod claiming
        ``tenancy: trusted`` in an isolated namespace.
    """
    spec = dict(raw)
    stated = spec.get('tenancy')
    if isolated is not None:
        if stated not in (None, Tenancy.ISOLATED.value):
            raise exception.WorkloadSpecError(name, [
                'tenancy: %r is not allowed: %s' % (stated, isolated)])
        spec['tenancy'] = Tenancy.ISOLATED.value
    elif stated is None:
        spec['tenancy'] = Tenancy.TRUSTED.value
    spec['name'] = name
    spec['platform'] = Platform.POD.value
    return policy_workload.from_dict(spec, key)


def _tightest(trail: Sequence[Verdict], options: Sequence[base.Option]
              ) -> str:
    """The tightest refusal: a rule that alone refuses every option (the
    first such), else the first refusal of each kind (a rule refusing all
    models of the kind before the per-model ones)."""
    judged: set[tuple[Kind | None, str]] = {(o.kind, o.model.name)
                                            for o in options}
    by_rule: dict[str, set[tuple[Kind | None, str]]] = {}
    first: dict[str, Verdict] = {}
    for verdict in trail:
        if verdict.passed:
            continue
        covered = {(k, m) for k, m in judged if k is verdict.kind and
                   (verdict.model is None or verdict.model == m)}
        by_rule.setdefault(verdict.rule, set()).update(covered)
        first.setdefault(verdict.rule, verdict)
    for rule, covered in by_rule.items():
        if covered == judged:
            return '[%s] %s' % (rule, first[rule].message)
    refusals: dict[Kind | None, list[Verdict]] = {}
    for verdict in trail:
        if not verdict.passed:
            refusals.setdefault(verdict.kind, []).append(verdict)
    parts = []
    for kind, verdicts in refusals.items():
        verdicts.sort(key=lambda v: v.model is not None)
        parts.append('%s: [%s] %s' % (kind.value if kind else '-',
                                      verdicts[0].rule, verdicts[0].message))
    return '; '.join(parts)


def _too_few(w: Workload, models: Sequence[GpuModel],
             most: Mapping[GpuModel, int]) -> str | None:
    """Why no node holds the ``gpus`` ``w`` asks for, on any of
    ``models`` (None: some node may)."""
    if any(most.get(m, w.gpus) >= w.gpus for m in models):
        return None
    counts = sorted({(m.name, most[m]) for m in models},
                    key=lambda item: (-item[1], item[0]))
    return ('[gpus] requested %d GPUs for one pod, but no node registers '
            'more than %d GPUs of one shape (%s); a pod\'s GPUs are all on '
            'its node' % (w.gpus, counts[0][1], ', '.join(
                '%s: %d' % item for item in counts[:4])))


def decide(w: Workload, models: Sequence[GpuModel],
           engine: policy_engine.Engine, memory: MemoryRule | None = None,
           levels: Mapping[str, frozenset[enforcement.Level]] | None = None,
           most: Mapping[GpuModel, int] | None = None) -> IntentDecision:
    """Whole GPUs or a CU slice for ``w`` on a cluster of ``models``.

    :param memory: what the pod's namespace requires of a slice's memory
        enforcement: a slice only on the models some GPU of which
        registers a level that meets it (``levels``, by model name).
    :param most: per model, the most GPUs of it one node registers; a
        model with fewer than the ``gpus`` ``w`` asks for cannot hold it,
        as one whose GPUs are too small cannot (absent: not bounded).
    :returns: a placed decision with the limits to set, or never-fits
        with the tightest reason.
    """
    if not models:
        return IntentDecision(Code.NEVER, 'the cluster registers no AMD '
                              'GPU in %s' % hami.NODE_REGISTER)
    named = {m.name for m in models}
    if most:
        refusal = _too_few(w, models, most)
        if refusal is not None:
            return IntentDecision(Code.NEVER, 'fits no node of the '
                                  'cluster: %s' % refusal)
        models = [m for m in models if most.get(m, w.gpus) >= w.gpus]
    options = [base.Option(kind, model) for model in models
               for kind in (Kind.DEDICATED, Kind.CU)]
    judgement = engine.judge(w, options)
    trail = judgement.trail
    allowed = {kind: [o.model for o in judgement.allowed if o.kind is kind]
               for kind in (Kind.DEDICATED, Kind.CU)}
    fitting = {m.name for ms in allowed.values() for m in ms}
    if not fitting:
        return IntentDecision(Code.NEVER, 'fits no GPU of the cluster: %s'
                              % _tightest(trail, options), trail=trail)
    slice_models = allowed[Kind.CU]
    weak = ''
    if memory is not None and slice_models:
        kept = [m for m in slice_models if any(
            memory.requirement.met_by(level)
            for level in (levels or {}).get(m.name, ()))]
        dropped = sorted(m.name for m in slice_models if m not in kept)
        if dropped:
            weak = '%s requires %s for a slice\'s memory, and no GPU of %s ' \
                'registers it (%s)' % (
                    memory.why, memory.requirement.describe(),
                    ', '.join(dropped), '; '.join(
                        '%s: %s' % (name, ', '.join(sorted(
                            level.value for level in (levels or {}).get(
                                name, ())) or 'none'))
                        for name in dropped))
            trail = trail + (Verdict('memory', Kind.CU, False, weak),)
        slice_models = kept
    everywhere = {m.name for m in slice_models} == fitting
    use_types = () if fitting == named else \
        tuple(sorted(fitting))
    limits = {hami.RESOURCE_GPU: str(w.gpus)}
    if slice_models and everywhere:
        if w.percent is not None:
            percent = w.percent
        elif w.cus is not None:
            percent = max(hami.cus_to_percent(w.cus, m.compute_units or 1,
                                              m.cu_alloc_unit)
                          for m in slice_models)
        else:
            percent = 100
        limits[hami.RESOURCE_GPUCORES] = str(percent)
        if w.memory_mib is not None:
            limits[hami.RESOURCE_GPUMEM] = str(w.memory_mib)
        passed = [v for v in trail if v.passed and v.kind is Kind.CU
                  and v.rule in ('isolation', 'size', 'interference')]
        if memory is not None:
            passed.append(Verdict(
                'memory', Kind.CU, True, 'its memory is capped as %s '
                'requires (%s)' % (memory.why,
                                   memory.requirement.describe())))
        reason = 'CU slice of %d%% of the CUs and %s per GPU on %d GPU%s: ' \
            '%s' % (percent, w.describe_memory(), w.gpus,
                    '' if w.gpus == 1 else 's',
                    '; '.join(dict.fromkeys(v.message for v in passed)))
        cus = max(hami.percent_to_cus(percent, m.compute_units or 1,
                                      m.cu_alloc_unit)
                  for m in slice_models)
        return IntentDecision(Code.PLACED, reason, Kind.CU, limits,
                              use_types, trail, w.gpus, cus, w.memory_mib)
    refused = [v for v in trail if not v.passed and v.kind is Kind.CU]
    why = (weak or (refused[0].message if refused else
           'a CU slice is not allowed on every GPU shape it fits: %s'
           % ', '.join(sorted(fitting - {m.name for m in slice_models}))))
    reason = 'whole GPU%s (%d): no CU slice because %s' % (
        '' if w.gpus == 1 else 's', w.gpus, why)
    return IntentDecision(Code.PLACED, reason, Kind.DEDICATED, limits,
                          use_types, trail, w.gpus)
