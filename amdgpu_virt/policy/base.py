"""The contracts of policy filters and weighers.

Filters (stevedore namespace ``amdgpu_virt.policy.filters``) say whether a
kind of GPU use (dedicated, VF, CU slice) is allowed for a workload on a GPU
model, and why, with numbers. Weighers (namespace
``amdgpu_virt.policy.weighers``) score a concrete candidate placement in
[0, 1]; the engine multiplies each score by the weigher's configured
multiplier and adds them up.
"""

from __future__ import annotations

import abc
import dataclasses

from oslo_config import cfg

from amdgpu_virt.model import Gpu
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import Kind
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Workload


@dataclasses.dataclass(frozen=True, eq=False)
class Option:
    """A kind on a model, as the filters judge it.

    :param vf_count: VFs per GPU the planner would use on this model (None
        when the model has no SR-IOV).

    Options compare by identity (cheap to hash as cache keys); the planner
    makes each once.
    """

    kind: Kind
    model: GpuModel
    vf_count: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A concrete placement the weighers score.

    :param unit_cus: CUs of the unit granted per GPU (a VF's CUs, the
        GPU's CUs for dedicated, the requested CUs for a slice).
    :param unit_mib: memory of the granted unit per GPU, likewise.
    :param in_role: how many of the GPUs already play the role the kind
        needs (the rest would be converted from unassigned).
    """

    kind: Kind
    model: GpuModel
    host: str
    addresses: tuple[str, ...]
    numa_nodes: tuple[int | None, ...]
    unit_cus: int
    unit_mib: int
    in_role: int
    unverified: bool = False

    def profile(self) -> tuple[object, ...]:
        """What a weigher with :attr:`PolicyWeigher.by_profile` may read:
        everything but the host's name and the GPUs' addresses (their
        number stays)."""
        # the kind's value: a str hashes faster than an enum member
        return (self.kind.value, self.model.name, len(self.addresses),
                self.numa_nodes, self.unit_cus, self.unit_mib, self.in_role,
                self.unverified)


_new = object.__new__
(_set_kind, _set_model, _set_host, _set_addresses, _set_numa_nodes,
 _set_unit_cus, _set_unit_mib, _set_in_role, _set_unverified) = (
    Candidate.__dict__[f.name].__set__ for f in dataclasses.fields(Candidate))


def candidate(kind: Kind, model: GpuModel, host: str,
              addresses: tuple[str, ...],
              numa_nodes: tuple[int | None, ...], unit_cus: int,
              unit_mib: int, in_role: int, unverified: bool) -> Candidate:
    """``Candidate(kind, model, host, addresses, numa_nodes, unit_cus,
    unit_mib, in_role, unverified)``, made without the frozen
    dataclass's ``object.__setattr__`` per field (the planner makes one
    per candidate found): the same instance, field for field (a test
    checks)."""
    made = _new(Candidate)
    _set_kind(made, kind)
    _set_model(made, model)
    _set_host(made, host)
    _set_addresses(made, addresses)
    _set_numa_nodes(made, numa_nodes)
    _set_unit_cus(made, unit_cus)
    _set_unit_mib(made, unit_mib)
    _set_in_role(made, in_role)
    _set_unverified(made, unverified)
    return made


class PolicyFilter(abc.ABC):
    """Allows or excludes a kind for a workload.

    What :meth:`check` and :meth:`refuses_gpus` answer may depend on the
    workload's shape only (:meth:`~.workload.Workload.shape`: everything
    but its name and priority): the engine keeps their answers per shape.

    :param conf: the configuration; read options here, at construction.
    """

    #: entry point name
    name = ''

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.conf = conf

    @abc.abstractmethod
    def check(self, workload: Workload, option: Option) -> Verdict:
        """Judge ``option`` for ``workload``.

        :param workload: a valid workload.
        :param option: the kind and model judged.
        :returns: a verdict (``passed`` False excludes the kind on that
            model) whose message gives the numbers behind it.
        :raises: nothing; a rule that cannot judge passes with a message.
        """

    def gpu_refusal(self, workload: Workload, kind: Kind,
                    gpu: Gpu) -> str | None:
        """Why ``gpu`` cannot serve ``workload`` as ``kind``, if it cannot.

        :returns: None when the GPU is acceptable (the default), else a
            sentence naming the GPU.
        """
        return None

    def refuses_gpus(self, workload: Workload) -> bool:
        """Whether :meth:`gpu_refusal` may refuse any GPU for
        ``workload`` (False spares the planner asking GPU by GPU).

        :returns: True by default.
        """
        return True

    def _verdict(self, option: Option, passed: bool, message: str,
                 per_model: bool = False) -> Verdict:
        return Verdict(rule=self.name, kind=option.kind, passed=passed,
                       message=message,
                       model=option.model.name if per_model else None)


class PolicyWeigher(abc.ABC):
    """Scores candidates; a higher score is better.

    :param conf: the configuration; read options here, at construction.
    """

    #: entry point name
    name = ''
    #: ``[policy]`` option holding this weigher's multiplier
    multiplier_option = ''
    #: the score depends only on the workload's shape and the candidate's
    #: :meth:`Candidate.profile`, so the engine may reuse it for another
    #: candidate of the same profile (the planner's hot path)
    by_profile = False

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.conf = conf
        self.multiplier = float(getattr(conf.policy, self.multiplier_option))

    @abc.abstractmethod
    def weigh(self, workload: Workload, candidate: Candidate) -> float:
        """The raw score of ``candidate``.

        :returns: a score in [0, 1] (values outside are clamped).
        """

    def score(self, workload: Workload, candidate: Candidate) -> float:
        """The normalised score (clamped to [0, 1])."""
        return min(1.0, max(0.0, float(self.weigh(workload, candidate))))
