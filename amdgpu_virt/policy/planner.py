"""The fleet planner: a role for every GPU, a placement for every workload.

Greedy with a careful order, which is fast enough for thousands of hosts:

1. workloads in order of priority, then the hardest first (multi-GPU P2P
   jobs, then more GPUs, then larger shares of a GPU);
2. per workload the filters say which kinds are allowed on which models;
   for each allowed kind the indexes give at most two candidates: the best
   fit among GPUs already in the needed role (fewest free units first, so
   GPUs fill up and fewer are used) and the best host to convert
   unassigned GPUs on (fewest free GPUs first, so whole hosts stay free
   for large P2P jobs);
3. the weighers score the candidates; the best is committed.

The fleet and its constraints are :class:`~.fleetstate.FleetState`; why a
workload does not fit is :mod:`.explain`; the capacity bound the plan is
compared with is :mod:`.bound`; the ledger and the GPU reports are built
by :mod:`.report`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oslo_config import cfg

from amdgpu_virt import catalog
from amdgpu_virt import collector
from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import base
from amdgpu_virt.policy import bound as av_bound
from amdgpu_virt.policy.candidates import CandidateSearch
from amdgpu_virt.policy.candidates import Choice
from amdgpu_virt.policy import decision
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import explain
from amdgpu_virt.policy import improve
from amdgpu_virt.policy import report
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.policy.decision import Trail
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.result import Bound
from amdgpu_virt.policy.result import Plan
from amdgpu_virt.policy.workload import Workload
from amdgpu_virt.sharing import allocator as cu_allocator
from amdgpu_virt.sharing import packing

LOG = logging.getLogger(__name__)
_REFERENCE_MODEL = catalog.by_name('MI300X')

#: Told how far a plan got: (step, done, total); ``total`` 0 for a step
#: whose size is not known. Steps: ``placing workloads``, ``improving``,
#: ``bounding``, ``reporting``.
Progress = Callable[[str, int, int], None]
#: workloads placed between two calls of the progress callback
PROGRESS_EVERY = 1000


class Planner(CandidateSearch):
    """Plans a fleet; one instance per plan (the parameters and errors
    are those of :class:`~.fleetstate.FleetState`); the candidates come
    from :class:`~.candidates.CandidateSearch`."""

    def __init__(self, conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
                 ledger: av_ledger.Ledger | None = None,
                 existing: Sequence[Decision] = (),
                 engine: av_engine.Engine | None = None) -> None:
        # the fleet's state is long-lived: the collector's passes over it
        # while it grows would cost more than building it
        with collector.paused():
            self._build(conf, hosts, ledger, existing, engine)

    def _build(self, conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
               ledger: av_ledger.Ledger | None,
               existing: Sequence[Decision],
               engine: av_engine.Engine | None) -> None:
        super().__init__(conf, hosts, ledger, existing, engine)
        self.shape = explain.fleet_shape(self)
        #: short reasons per (shape, kind, unit, unverified)
        self._reasons: dict[Any, str] = {}
        #: CU ids per bitmap given
        self._cu_ids: dict[int, tuple[int, ...]] = {}
        #: what the weighers' verdicts of one profile share
        self._ranked: dict[Any, Any] = {}
        #: rankings per (shape, candidate profiles), see :meth:`_rank`
        self._orders: dict[Any, tuple[tuple[int, Any], ...]] = {}
        #: a small number per workload shape, the key of the caches
        #: above and of the candidates' (a shape tuple of enums is slow to
        #: hash); that of the workload being placed is ``_shape``
        self._shapes: dict[Any, int] = {}
        self._kinds: dict[Any, tuple[GpuModel, Kind, Role, bool]] = {}

    # -- commit -----------------------------------------------------------

    def _commit(self, w: Workload, choice: Choice) -> tuple[Grant, ...
                                                              ] | None:
        model = choice.view.model
        cus, mib = self._size(w, model)
        for gs in choice.convert:
            ok, unv = self.role_ok(gs, choice.role)
            mode = (self._share_mode(gs, cus, mib)[1]
                    if choice.role is Role.K8S_SHARED else None)
            self.assign(gs, choice.role, unv, choice.vf_count, mode)
        grants: list[Grant] = []
        if choice.kind is Kind.DEDICATED:
            for gs in choice.gpus:
                gs.owner = w.name
                self.unready(gs)
                grants.append(Grant(gs.address, mib, cus))
        elif choice.kind is Kind.VF:
            for gs in choice.gpus:
                index = gs.vf_free.pop(0)
                gs.vf_owners[index] = w.name
                grants.append(Grant(gs.address, mib, cus, vf_index=index))
            for gs in set(choice.gpus):
                self.vf_update(gs)
        else:
            done: list[st.Pool] = []
            for gs, pool in zip(choice.gpus, choice.pools, strict=True):
                pool = pool or self._pool_for(gs, cus, mib)
                try:
                    if pool is None:
                        raise exception.InsufficientCapacity(
                            gpu=gs.address, requested=cus, unit='CUs',
                            owner=w.name, free=0, capacity=gs.cus)
                    mask = pool.alloc.allocate_mask(w.name, cus)
                except exception.SharingError:
                    for other in done:
                        other.alloc.release(w.name)
                        other.mem_free += mib
                        other.gpu.slices -= 1
                        self.cu_update(other)
                    return None
                pool.mem_free -= mib
                gs.slices += 1
                self.cu_update(pool)
                done.append(pool)
                # the same CUs are given on many GPUs: one tuple for all
                taken = self._cu_ids.get(mask)
                if taken is None:
                    taken = self._cu_ids[mask] = cu_allocator.ids_of(mask)
                grants.append(Grant(gs.address, mib, cus, cus=taken,
                                    partition=pool.partition))
        return tuple(grants)

    # -- the plan ---------------------------------------------------------

    @staticmethod
    def order(workloads: Iterable[Workload]) -> list[Workload]:
        """Priority first, then the hardest to place."""
        # how hard a workload is to place depends on its shape alone
        hardness: dict[Any, tuple[bool, int, float]] = {}

        def key(w: Workload) -> tuple[Any, ...]:
            shape = w.shape()
            hard = hardness.get(shape)
            if hard is None:
                hard = hardness[shape] = (
                    not (w.p2p and w.gpus > 1), -w.gpus,
                    -w.fraction_on(_REFERENCE_MODEL))
            return (-w.priority, *hard, w.name)
        return sorted(workloads, key=key)

    def place(self, w: Workload) -> Decision:
        """Decide and commit one workload.

        The trail shares the filters' verdicts with every workload of the
        same shape and keeps the planner's own as numbers
        (:class:`~.decision.Trail`), written out when it is read.
        """
        if not self.gpus:
            return Decision(w.name, Code.NEVER, 'the fleet has no GPUs')
        key = w.shape()
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = len(self._shapes)
        self._shape = shape
        self.checks_gpus = self.engine.checks_gpus_of(w, key)
        judgement = self.engine.judge(w, self.options, key)
        head = judgement.trail
        if not judgement.allowed:
            return Decision(
                w.name, Code.NEVER, 'no kind is allowed on any GPU model '
                'of the fleet: %s' % explain.first_refusals(head),
                trail=head)
        choices: list[Choice] = []
        for option in judgement.allowed:
            choices.extend(self._candidates(w, option, shape))
        while choices:
            views = [c.view for c in choices]
            order = self._rank(w, views, choices)
            choice = choices[order[0][0]]
            free = explain.free_state(choice)
            grants = self._commit(w, choice)
            scores = explain.ranked_state_of(order, views)
            if grants is None:
                head = head + tuple(explain.weigher_verdicts(scores))
                choices.remove(choice)
                continue
            model = choice.view.model
            return decision.placed(
                w.name, self._short(w, choice, judgement), choice.kind,
                choice.host.name, grants, Trail(
                    head, explain.placed_verdicts, (
                        w, self._kind_of(model, choice), choice.host.name,
                        grants, len(scores), *scores, *free)),
                order[0][1][3], choice.unverified)
        never = explain.never_reasons(self, self.shape, w,
                                      judgement)
        if never[0]:
            return Decision(w.name, Code.NEVER, '; '.join(
                v.message for v in never[1]), trail=Trail(
                    head, tail=tuple(never[1])))
        capacity = [explain.capacity_verdict(self, w, o)
                    for o in judgement.allowed]
        return Decision(
            w.name, Code.UNSCHEDULABLE, 'allowed %s, but nothing is free '
            'now: %s' % ('/'.join(k.value for k in judgement.kinds()),
                         capacity[0].message), trail=Trail(
                head, tail=tuple(never[1]) + tuple(capacity)))

    def _rank(self, w: Workload, views: Sequence[base.Candidate],
              choices: Sequence[Choice]) -> tuple[tuple[int, Any], ...]:
        """The weighers' ranking of ``views``, the views of ``choices``
        (:func:`explain.ranking`), kept per shape and sequence of profiles
        when the weighers read only those (the same few are ranked again
        and again)."""
        if not self.engine.ranks_by_profile:
            return explain.ranking(self.engine.rank(w, views), views,
                                   self._ranked)
        key = (self._shape, tuple(c.profile() for c in choices))
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = explain.ranking(
                self.engine.rank(w, views), views, self._ranked)
        return order

    def _kind_of(self, model: GpuModel, choice: Choice
                 ) -> tuple[GpuModel, Kind, Role, bool]:
        """(model, kind, role, unverified) of ``choice``, one tuple for
        every decision alike."""
        # enum members are singletons: their ids hash in C, their values
        # through a property
        key = (id(model), id(choice.kind), id(choice.role),
               choice.unverified)
        found = self._kinds.get(key)
        if found is None:
            found = self._kinds[key] = (model, choice.kind, choice.role,
                                        choice.unverified)
        return found

    def _short(self, w: Workload, choice: Choice,
               judgement: av_engine.Judgement) -> str:
        view = choice.view
        key = (self._shape, id(choice.kind), view.unit_cus,
               view.unit_mib, choice.unverified)
        text = self._reasons.get(key)
        if text is None:
            text = self._reasons[key] = explain.short(w, choice, judgement)
        return text

    def plan(self, workloads: Sequence[Workload],
             invalid: Sequence[tuple[str, exception.WorkloadSpecError]] = (),
             progress: Progress | None = None) -> Plan:
        """Place ``workloads`` (new ones; running ones came in ``existing``).

        The cyclic garbage collector is paused while the plan is made, as
        while the planner is built (:func:`amdgpu_virt.collector.paused`:
        it would walk the growing plan again and again, and the plan
        leaves no cycles behind), and set back as it was after.

        :param invalid: specifications that failed validation, reported
            with code ``invalid`` and every problem in the trail.
        :param progress: told how far the plan got, every
            :data:`PROGRESS_EVERY` workloads and at each step.
        :raises PlanError: a workload name is used twice or is running.
        """
        with collector.paused():
            return self._plan(workloads, invalid,
                              progress or (lambda *_args: None))

    def _plan(self, workloads: Sequence[Workload],
              invalid: Sequence[tuple[str, exception.WorkloadSpecError]],
              progress: Progress) -> Plan:
        names = {d.workload for d in self.existing}
        for w in workloads:
            if w.name in names:
                raise exception.PlanError(
                    source='workloads', reason='workload %s is listed twice '
                    'or already running' % w.name)
            names.add(w.name)
        del names
        if self.conf.policy.packing:
            # one request shape per workload shape, weighed by its count
            # (the same sums as one weight per workload, in the same order)
            counts: dict[Any, list[Any]] = {}
            for w in workloads:
                shape = w.shape()
                entry = counts.get(shape)
                if entry is None:
                    counts[shape] = [_shape_of(w), 1.0]
                else:
                    entry[1] += 1.0
            self.packing = packing.score_of(
                (shape, weight) for shape, weight in counts.values())
        decided: dict[str, Decision] = {}
        ordered = self.order(workloads)
        total = len(ordered)
        progress('placing workloads', 0, total)
        for count, w in enumerate(ordered, 1):
            decided[w.name] = self.place(w)
            if count % PROGRESS_EVERY == 0:
                progress('placing workloads', count, total)
        progress('placing workloads', total, total)
        seconds = float(self.conf.policy.improve_seconds)
        if seconds > 0:
            progress('improving', 0, 0)
            moves = improve.improve(self, decided, ordered, seconds,
                                    int(self.conf.policy.improve_tries))
            LOG.debug('improvement pass: %d moves', moves)
        decisions = tuple(self.existing) + tuple(
            decided[w.name] for w in workloads) + tuple(
            Decision(name, Code.INVALID, str(err), trail=tuple(
                Verdict('spec', None, False, p) for p in err.problems))
            for name, err in invalid)
        LOG.debug('planned %d workloads on %d GPUs', len(workloads),
                  len(self.gpus))
        progress('bounding', 0, 0)
        bound = self.bound(workloads)
        progress('reporting', 0, 0)
        return Plan(report.ledger_of(self), decisions,
                    report.gpu_reports(self, decisions), bound,
                    tuple(workloads))

    def bound(self, workloads: Sequence[Workload]) -> Bound:
        """Upper bounds by capacity alone (see :mod:`.bound`)."""
        return av_bound.bound(self, self.shape, workloads)


def _shape_of(w: Workload) -> packing.Shape:
    """``w`` as a request shape of the packing mix (on the reference
    model)."""
    model = _REFERENCE_MODEL
    if w.fraction_on(model) >= 1.0 or (w.p2p and w.gpus > 1):
        return packing.Shape.whole_gpus(w.gpus)
    mib = w.memory_on(model)
    return packing.Shape.share(w.cus_on(model) / (model.compute_units or 1),
                               mib / (model.vram_mib or 1), w.gpus, mib)


def plan(conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
         workloads: Sequence[Workload],
         ledger: av_ledger.Ledger | None = None,
         existing: Sequence[Decision] = (),
         invalid: Sequence[tuple[str, exception.WorkloadSpecError]] = (),
         progress: Progress | None = None) -> Plan:
    """Plan ``workloads`` on ``hosts`` (see :class:`Planner`)."""
    return Planner(conf, hosts, ledger, existing).plan(workloads, invalid,
                                                       progress)
