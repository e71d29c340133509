"""The decision engine: ordered filters, then weighers.

Filters judge each kind on each GPU model of the fleet (cached per
workload shape, so 20,000 workloads of a few shapes cost a few hundred
filter calls); weighers score concrete candidates found by the planner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt import plugins
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Workload
from amdgpu_virt.sharing import allocator as cu_allocator

STRATEGY_NAMESPACE = 'amdgpu_virt.sharing.strategies'
FILTER_NAMESPACE = 'amdgpu_virt.policy.filters'
WEIGHER_NAMESPACE = 'amdgpu_virt.policy.weighers'
KIND_ORDER = (Kind.DEDICATED, Kind.VF, Kind.CU)


@contextlib.contextmanager
def _naming_option(option: str) -> Iterator[None]:
    """Prefix a plugin loading error with the option that named it."""
    try:
        yield
    except exception.DriverNotFound as err:
        raise exception.DriverNotFound(
            '%s: %s' % (option, err), **err.kwargs) from None


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What the filters allow for one workload, and every verdict."""

    allowed: tuple[base.Option, ...]
    trail: tuple[Verdict, ...]

    def kinds(self) -> tuple[Kind, ...]:
        return tuple(k for k in KIND_ORDER
                     if any(o.kind is k for o in self.allowed))


@dataclasses.dataclass(frozen=True, slots=True)
class Scored:
    """A candidate with its total score and each weigher's part."""

    candidate: base.Candidate
    score: float
    parts: tuple[tuple[str, float, float], ...]

    def explain(self) -> str:
        return explain_parts(self.score, self.parts)


@functools.lru_cache(maxsize=4096)
def explain_parts(score: float, parts: tuple[tuple[str, float, float], ...]
                  ) -> str:
    """``score`` and each weigher's part of it, in words."""
    return '%.2f = %s' % (score, ' + '.join(
        '%s %.2f x %g' % (name, raw, mult)
        for name, raw, mult in parts) or 'no weighers')


class Engine:
    """Filters and weighers loaded from ``[policy]`` options, and the CU
    strategy of ``[sharing] cu_strategy`` (strategies keep no state, so
    one serves every plan).

    :raises DriverNotFound: an enabled filter, weigher or the strategy is
        unknown.
    """

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.conf = conf
        with _naming_option('[policy] enabled_filters'):
            self.filters: list[base.PolicyFilter] = plugins.load_ordered(
                FILTER_NAMESPACE, conf.policy.enabled_filters, conf)
        with _naming_option('[policy] enabled_weighers'):
            self.weighers: list[base.PolicyWeigher] = plugins.load_ordered(
                WEIGHER_NAMESPACE, conf.policy.enabled_weighers, conf)
        self._gpu_filters = [
            f for f in self.filters
            if type(f).gpu_refusal is not base.PolicyFilter.gpu_refusal]
        self._cache: dict[Any, Judgement] = {}
        #: checks_gpus_of per workload shape
        self._checks: dict[Any, bool] = {}
        #: scores per workload shape, then per candidate profile, when
        #: every weigher reads only those
        self._scores: dict[Any, dict[Any, tuple[float, Any]]] | None = (
            {} if all(w.by_profile for w in self.weighers) else None)
        with _naming_option('[sharing] cu_strategy'):
            self.cu_strategy: cu_allocator.CuStrategy = plugins.load_driver(
                STRATEGY_NAMESPACE, conf.sharing.cu_strategy)

    def vf_count_for(self, model: GpuModel) -> int | None:
        """VFs per GPU for a GPU of ``model`` turned into ``nova-vf``."""
        if model.vf_device_id is None or not model.vf_counts:
            return None
        wanted = int(self.conf.policy.vf_count)
        return wanted if wanted in model.vf_counts else max(model.vf_counts)

    def options(self, models: Iterable[GpuModel],
                vf_counts: dict[str, Sequence[int]] | None = None
                ) -> tuple[base.Option, ...]:
        """Every (kind, model[, VF count]) to judge for a fleet.

        :param vf_counts: VF counts per model name that exist or may be
            made in the fleet; a model missing or with none gets one VF
            option without a count (judged as offering no VF). Without
            this mapping, the count :meth:`vf_count_for` gives.
        """
        result = []
        for model in sorted(set(models), key=lambda m: m.name):
            result.append(base.Option(Kind.DEDICATED, model))
            counts: Sequence[int | None]
            if vf_counts is None:
                counts = (self.vf_count_for(model),)
            else:
                counts = vf_counts.get(model.name) or (None,)
            result.extend(base.Option(Kind.VF, model, c) for c in counts)
            result.append(base.Option(Kind.CU, model))
        return tuple(result)

    def judge(self, workload: Workload, options: Sequence[base.Option],
              shape: Any = None) -> Judgement:
        """Run every filter on every option.

        Verdicts that read the same for all models of a kind are given
        once; a rule's verdict per model otherwise.

        :param shape: ``workload.shape()``, when the caller has it.
        """
        key = (workload.shape() if shape is None else shape, tuple(options))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        allowed: list[base.Option] = []
        trail: list[Verdict] = []
        for kind in KIND_ORDER:
            kind_options = [o for o in options if o.kind is kind]
            if not kind_options:
                continue
            ok = dict.fromkeys(kind_options, True)
            for rule in self.filters:
                verdicts = []
                for option in kind_options:
                    verdict = rule.check(workload, option)
                    if not verdict.passed:
                        ok[option] = False
                    verdicts.append(verdict)
                unique: list[Verdict] = []
                for verdict in verdicts:
                    if verdict not in unique:
                        unique.append(verdict)
                trail.extend(unique)
            allowed.extend(o for o in kind_options if ok[o])
        judgement = Judgement(tuple(allowed), tuple(trail))
        self._cache[key] = judgement
        return judgement

    @property
    def checks_gpus(self) -> bool:
        return bool(self._gpu_filters)

    def checks_gpus_of(self, workload: Workload, shape: Any = None) -> bool:
        """Whether a filter may refuse a GPU for ``workload`` (see
        :meth:`gpu_refusal`); kept per workload shape, as the filters'
        verdicts are (:meth:`judge`).

        :param shape: ``workload.shape()``, when the caller has it.
        """
        if shape is None:
            shape = workload.shape()
        checks = self._checks.get(shape)
        if checks is None:
            checks = self._checks[shape] = any(
                rule.refuses_gpus(workload) for rule in self._gpu_filters)
        return checks

    @property
    def ranks_by_profile(self) -> bool:
        """Every weigher reads only the workload's shape and the
        candidates' profiles, so :meth:`rank` orders candidates of the
        same profiles alike (by their position on ties)."""
        return self._scores is not None

    def gpu_refusal(self, workload: Workload, kind: Kind,
                    gpu: Gpu) -> str | None:
        """The first filter's reason to refuse ``gpu``, or None."""
        for rule in self._gpu_filters:
            reason = rule.gpu_refusal(workload, kind, gpu)
            if reason is not None:
                return reason
        return None

    def score(self, workload: Workload,
              candidate: base.Candidate) -> Scored:
        cache = None
        if self._scores is not None:
            cache = self._scores.setdefault(workload.shape(), {})
            key = candidate.profile()
            hit = cache.get(key)
            if hit is not None:
                return Scored(candidate, hit[0], hit[1])
        parts = tuple((w.name, w.score(workload, candidate), w.multiplier)
                      for w in self.weighers)
        total = sum(raw * mult for _n, raw, mult in parts)
        if cache is not None:
            cache[key] = (total, parts)
        return Scored(candidate, total, parts)

    def rank(self, workload: Workload,
             candidates: Sequence[base.Candidate]) -> list[Scored]:
        """Candidates best first.

        Ties go to the candidate granting less (GPU shares), then to the
        earlier one.
        """
        if self._scores is None:
            scored = [self.score(workload, c) for c in candidates]
        else:
            cache = self._scores.get(workload.shape(), {})
            scored = []
            for c in candidates:
                hit = cache.get(c.profile())
                scored.append(self.score(workload, c) if hit is None
                              else Scored(c, hit[0], hit[1]))
        if len(scored) == 1:
            return scored

        def granted(c: base.Candidate) -> float:
            return len(c.addresses) * max(
                c.unit_cus / (c.model.compute_units or 1),
                c.unit_mib / (c.model.vram_mib or 1))

        order = sorted(range(len(scored)), key=lambda i: (
            -round(scored[i].score, 9), granted(candidates[i]), i))
        return [scored[i] for i in order]
