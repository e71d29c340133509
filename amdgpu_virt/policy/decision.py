"""Decisions: where a workload goes, or why it does not, with the trail.

"Doesn't fit" is a result: a :class:`Decision` always comes back, with a
:class:`Code` and every rule's :class:`Verdict` in readable sentences that
carry the numbers (requested, free, capacity).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from amdgpu_virt.model import Kind
from amdgpu_virt.policy.workload import MAX_CUS

UNVERIFIED = 'unverified on real hardware'
#: CU ids of a grant are below this: the most CUs a workload may ask of
#: one GPU
MAX_CU_ID = MAX_CUS


class Code(str, enum.Enum):
    PLACED = 'placed'
    #: some kind is allowed on some GPU of the fleet, but none is free now
    UNSCHEDULABLE = 'unschedulable-now'
    #: no kind is allowed on any GPU of the fleet, whatever is free
    NEVER = 'never-fits'
    #: the specification itself is wrong
    INVALID = 'invalid'


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """One rule's answer for one kind (and model, when it matters).

    :param rule: the filter, weigher or planner step that spoke.
    :param passed: False when the rule excludes the kind.
    :param message: a sentence with the numbers behind the answer.
    """

    rule: str
    kind: Kind | None
    passed: bool
    message: str
    model: str | None = None

    def __str__(self) -> str:
        where = ' '.join(x for x in (
            self.kind.value if self.kind else '', self.model or '') if x)
        return '[%s%s] %s: %s' % (
            self.rule, ' %s' % where if where else '',
            'ok' if self.passed else 'NO', self.message)

    def to_dict(self) -> dict[str, Any]:
        return {'rule': self.rule,
                'kind': self.kind.value if self.kind else None,
                'model': self.model, 'passed': self.passed,
                'message': self.message}


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class Grant:
    """What a workload holds on one GPU.

    Exactly one of: ``vf_index`` (a VF), ``cus`` (a CU slice, with the
    compute partition it lives in when the GPU is partitioned), or neither
    (the whole GPU).
    """

    address: str
    memory_mib: int
    #: CUs the workload asked for on this GPU
    compute_units: int = 0
    vf_index: int | None = None
    cus: tuple[int, ...] | None = None
    partition: int | None = None

    def describe(self) -> str:
        if self.vf_index is not None:
            return 'VF %d' % self.vf_index
        if self.cus is not None:
            text = 'CU %s' % cu_ranges(self.cus)
            if self.partition is not None:
                text = 'part %d %s' % (self.partition, text)
            return text
        return 'whole'

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {'address': self.address,
                                'memory_mib': self.memory_mib,
                                'compute_units': self.compute_units}
        if self.vf_index is not None:
            data['vf'] = self.vf_index
        if self.cus is not None:
            data['cus'] = cu_ranges(self.cus)
        if self.partition is not None:
            data['partition'] = self.partition
        return data


def cu_ranges(cus: tuple[int, ...]) -> str:
    """``0-75,80`` for the sorted CU ids (HSA_CU_MASK ID_list syntax)."""
    parts = []
    start = prev = None
    for cu in cus:
        if start is None:
            start = prev = cu
        elif cu == prev + 1:  # type: ignore[operator]
            prev = cu
        else:
            parts.append(_span(start, prev))  # type: ignore[arg-type]
            start = prev = cu
    if start is not None:
        parts.append(_span(start, prev))  # type: ignore[arg-type]
    return ','.join(parts)


def parse_cu_ranges(text: str) -> tuple[int, ...]:
    """The CU ids of ``0-75,80``.

    The ids are those of one GPU, so a list naming an id at or past
    :data:`MAX_CU_ID` is refused before it is expanded (a crafted
    ``0-999999999`` costs nothing).

    :raises ValueError: on a malformed list, naming the part.
    """
    result: set[int] = set()
    for part in str(text).split(','):
        part = part.strip()
        if '-' in part:
            low, high = part.split('-', 1)
            first, last = int(low), int(high)
            if last < first:
                raise ValueError('range %r runs backwards' % part)
        else:
            first = last = int(part)
        if first < 0 or last >= MAX_CU_ID:
            raise ValueError('CU %r is outside 0..%d' % (part,
                                                         MAX_CU_ID - 1))
        result.update(range(first, last + 1))
    return tuple(sorted(result))


def _span(start: int, end: int) -> str:
    return str(start) if start == end else '%d-%d' % (start, end)


class Trail(Sequence[Verdict]):
    """The verdicts of one decision, kept compact, written out when read.

    A plan of 200,000 workloads keeps a trail per decision, but ``explain``
    reads one and ``plan -f json`` none: the filters' verdicts are shared
    with every workload of the same shape (``head``), the planner's own
    verdicts are kept as the numbers behind them (``args``) and are only
    made into sentences by ``render(*args)`` when the trail is read; later
    notes (``tail``) are kept as verdicts. A trail compares, hashes and
    prints as the tuple of its verdicts, so it may stand wherever a tuple
    of verdicts did.
    """

    __slots__ = ('head', 'render', 'args', 'tail')

    def __init__(self, head: tuple[Verdict, ...],
                 render: Callable[..., Sequence[Verdict]] | None = None,
                 args: tuple[Any, ...] = (),
                 tail: tuple[Verdict, ...] = ()) -> None:
        self.head = head
        self.render = render
        self.args = args
        self.tail = tail

    def verdicts(self) -> tuple[Verdict, ...]:
        """Every verdict, in order."""
        middle = tuple(self.render(*self.args)) if self.render else ()
        return self.head + middle + self.tail

    def __iter__(self) -> Iterator[Verdict]:
        return iter(self.verdicts())

    def __len__(self) -> int:
        return len(self.verdicts())

    @overload
    def __getitem__(self, index: int) -> Verdict: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Verdict, ...]: ...

    def __getitem__(self, index: int | slice) -> Verdict | tuple[
            Verdict, ...]:
        return self.verdicts()[index]

    def __add__(self, other: Sequence[Verdict]) -> Trail:
        return Trail(self.head, self.render, self.args,
                     self.tail + tuple(other))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Trail, tuple)):
            return self.verdicts() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.verdicts())

    def __repr__(self) -> str:
        return repr(self.verdicts())


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """The outcome for one workload."""

    workload: str
    code: Code
    reason: str
    kind: Kind | None = None
    host: str | None = None
    grants: tuple[Grant, ...] = ()
    #: every rule's verdict (a tuple, or a :class:`Trail` that reads as
    #: one)
    trail: Sequence[Verdict] = ()
    score: float | None = None
    #: placed on a GPU whose driver differs from its host's family
    unverified: bool = False
    #: kept from an earlier plan (incremental mode)
    existing: bool = False

    @property
    def placed(self) -> bool:
        return self.code is Code.PLACED

    @property
    def gpus(self) -> tuple[str, ...]:
        seen: list[str] = []
        for grant in self.grants:
            if grant.address not in seen:
                seen.append(grant.address)
        return tuple(seen)

    def to_dict(self, trail: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            'workload': self.workload, 'code': self.code.value,
            'kind': self.kind.value if self.kind else None,
            'host': self.host, 'reason': self.reason,
            'grants': [g.to_dict() for g in self.grants]}
        if self.score is not None:
            data['score'] = round(self.score, 4)
        if self.unverified:
            data['unverified'] = True
        if self.existing:
            data['existing'] = True
        if trail:
            data['trail'] = [v.to_dict() for v in self.trail]
        return data


_new = object.__new__
(_set_workload, _set_code, _set_reason, _set_kind, _set_host, _set_grants,
 _set_trail, _set_score, _set_unverified, _set_existing) = (
    Decision.__dict__[f.name].__set__ for f in dataclasses.fields(Decision))


def placed(workload: str, reason: str, kind: Kind, host: str,
           grants: tuple[Grant, ...], trail: Sequence[Verdict],
           score: float | None, unverified: bool) -> Decision:
    """``Decision(workload, Code.PLACED, reason, kind, host, grants, trail,
    score, unverified)``, made without the frozen dataclass's
    ``object.__setattr__`` per field (the planner makes one per workload):
    the same instance, field for field (a test checks)."""
    decision = _new(Decision)
    _set_workload(decision, workload)
    _set_code(decision, Code.PLACED)
    _set_reason(decision, reason)
    _set_kind(decision, kind)
    _set_host(decision, host)
    _set_grants(decision, grants)
    _set_trail(decision, trail)
    _set_score(decision, score)
    _set_unverified(decision, unverified)
    _set_existing(decision, False)
    return decision
