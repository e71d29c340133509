"""The improvement pass: local moves after the greedy plan.

The greedy pass places workloads by priority, so a workload is left
unschedulable when what higher-priority workloads left was too
fragmented for it; smaller, lower-priority workloads may then fill those
fragments. A move makes room for such a workload ``U`` on one GPU (one
host, when ``U`` needs several GPUs) by moving what is there elsewhere:

1. on a GPU that could serve ``U`` (for a CU slice: a shared device
   whose free room plus that of its lower-priority slices holds ``U``),
   release its placements one at a time, lowest priority first (at most
   :data:`MAX_VICTIMS`; for a CU slice only the lower-priority slices of
   that device); a GPU left empty loses the
   role the plan gave it, so it may take another;
2. after each release, place ``U`` (the same candidates, filters and
   weighers as the greedy pass); when it fits, place the released ones
   again wherever they fit, highest priority first;
3. keep the move when ``U``'s priority exceeds that of the released
   workloads that found no place again; otherwise, or when ``U`` does not
   fit at all, put everything back exactly as it was.

So the placed priority only grows; every grant goes
through the same allocation as the greedy pass, so nothing is ever
over-committed. The pass stops at its time budget (``[policy]
improve_seconds``) and tries ``[policy] improve_tries`` GPUs (hosts,
for a multi-GPU workload) per workload.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from collections.abc import Sequence
from typing import Any, Protocol

from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import base
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Trail
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Workload

LOG = logging.getLogger(__name__)
#: placements released on one host for one workload, at most
MAX_VICTIMS = 16
#: GPUs looked at per GPU tried (most hold nothing the workload can use)
SCAN_PER_TRY = 16
KIND_ROLES = {Kind.DEDICATED: (Role.NOVA_DEDICATED, Role.K8S_DEDICATED),
              Kind.VF: (Role.NOVA_VF,), Kind.CU: (Role.K8S_SHARED,)}


class Planner(Protocol):
    """What the pass needs of a planner: its fleet state
    (:class:`~amdgpu_virt.policy.fleetstate.FleetState`) and its greedy
    placement (:meth:`amdgpu_virt.policy.planner.Planner.place`)."""

    gpus: list[st.GpuState]
    engine: av_engine.Engine
    options: tuple[base.Option, ...]
    failed: set[Any]

    def role_ok(self, gs: st.GpuState, role: Role) -> tuple[bool, bool]:
        ...

    def release(self, decision: Decision) -> list[tuple[st.GpuState,
                                                         Role, Any]]:
        ...

    def restore(self, decision: Decision,
                emptied: Sequence[tuple[st.GpuState, Role, Any]]) -> None:
        ...

    def place(self, w: Workload) -> Decision:
        ...


def improve(planner: Planner, decided: MutableMapping[str, Decision],
            ordered: Sequence[Workload], seconds: float, tries: int,
            clock: Callable[[], float] = time.monotonic) -> int:
    """Improve the greedy plan ``decided`` in place.

    :param ordered: the new workloads in greedy order.
    :param seconds: time budget; the pass stops when it is spent.
    :param tries: GPUs (hosts, for a multi-GPU workload) tried per
        unschedulable workload.
    :returns: the number of moves made.
    """
    deadline = clock() + seconds
    by_name = {w.name: w for w in ordered}
    # placements per GPU (single-GPU workloads) and per host (the others)
    holders: dict[tuple[str, str], dict[str, None]] = {}
    for w in ordered:
        _index(holders, decided[w.name], w.name)
    gpu_of = {(g.host.name, g.address): g for g in planner.gpus}
    keys = list(holders)
    known = set(keys)
    cursor = 0
    moves = 0
    for w in ordered:
        if clock() > deadline:
            LOG.debug('improvement pass: out of time after %d moves', moves)
            break
        if decided[w.name].code is not Code.UNSCHEDULABLE or \
                w.priority <= 0:
            continue
        judgement = planner.engine.judge(w, planner.options)
        roles = {(o.model.name, r) for o in judgement.allowed
                 for r in KIND_ROLES[o.kind]}
        tried = 0
        # each workload goes on where the last one stopped, so that the
        # tries spread over the fleet; a bounded look per workload
        for _step in range(min(len(keys), SCAN_PER_TRY * tries)):
            if tried >= tries:
                break
            where = keys[cursor % len(keys)]
            cursor += 1
            names = holders.get(where)
            if not names or (where[1] == '') != (w.gpus > 1):
                continue
            if w.gpus == 1:
                gs = gpu_of[where]
                if gs.role is Role.K8S_SHARED and \
                        (gs.model.name, Role.K8S_SHARED) in roles:
                    victims = _slice_victims(planner, decided, by_name, w,
                                             gs, names)
                    if victims is None:
                        continue
                elif _may_serve(planner, gs, roles):
                    victims = _by_priority(by_name, names)
                else:
                    continue
            else:
                victims = _by_priority(by_name, names)
            tried += 1
            if _move(planner, decided, w, where[0], victims, by_name,
                     holders):
                moves += 1
                keys.extend(k for k in holders if k not in known)
                known.update(holders)
                break
            if clock() > deadline:
                break
    return moves


def _by_priority(by_name: Mapping[str, Workload],
                 names: Iterable[str]) -> list[tuple[int, str]]:
    """The placements of ``names``, lowest priority first: a move may
    relocate one of higher priority than the workload it makes room for,
    when it finds room elsewhere."""
    return sorted((by_name[n].priority, n) for n in names)


def _slice_victims(planner: Planner, decided: Mapping[str, Decision],
                   by_name: Mapping[str, Workload], w: Workload,
                   gs: st.GpuState, names: Iterable[str]
                   ) -> list[tuple[int, str]] | None:
    """The lower-priority slices of one shared device of ``gs`` whose
    room, with what is free there, holds a slice of ``w`` (lowest
    priority first); None when no device of ``gs`` has enough."""
    cus = w.cus_on(gs.model)
    mib = w.memory_on(gs.model)
    for pool in gs.pools:
        free_cus = pool.alloc.free_count
        free_mib = pool.mem_free
        victims = []
        for name in names:
            if by_name[name].priority >= w.priority:
                continue
            for grant in decided[name].grants:
                if grant.address == gs.address and \
                        grant.partition == pool.partition:
                    free_cus += len(grant.cus or ())
                    free_mib += grant.memory_mib
                    victims.append((by_name[name].priority, name))
        if victims and free_cus >= cus and free_mib >= mib:
            return sorted(victims)
    return None


def _may_serve(planner: Planner, gs: st.GpuState,
               roles: set[tuple[str, Role]]) -> bool:
    """Could ``gs``, freed of lower-priority users, serve one of
    ``roles``?"""
    for model, role in roles:
        if model != gs.model.name:
            continue
        if gs.role is role or (not gs.fixed and planner.role_ok(gs,
                                                               role)[0]):
            return True
    return False


def _move(planner: Planner, decided: MutableMapping[str, Decision],
          w: Workload, host: str, victims: Sequence[tuple[int, str]],
          by_name: dict[str, Workload],
          holders: dict[tuple[str, str], dict[str, None]]) -> bool:
    released: list[tuple[str, Decision, Any]] = []
    found = None
    for _prio, name in victims[:MAX_VICTIMS]:
        old = decided[name]
        released.append((name, old, planner.release(old)))
        # capacity grew: what failed before may fit now
        planner.failed.clear()
        found = planner.place(w)
        if found.placed:
            break
    if found is None or not found.placed:
        _undo(planner, released, ())
        return False
    again = {}
    for name, _old, _e in sorted(released,
                                 key=lambda r: -by_name[r[0]].priority):
        again[name] = planner.place(by_name[name])
    lost = sum(by_name[n].priority for n, d in again.items()
               if not d.placed)
    if lost >= w.priority:
        _undo(planner, released, [found] + [d for d in again.values()
                                            if d.placed])
        return False
    moved = ', '.join(n for n, _d, _e in released)
    decided[w.name] = _noted(found, 'placed by the improvement pass, after '
                             'moving %s off %s' % (moved, host))
    for name, old, _e in released:
        _unindex(holders, old, name)
    _index(holders, decided[w.name], w.name)
    for name, d in again.items():
        decided[name] = _noted(d, 'moved by the improvement pass from %s '
                               'for %s' % (host, w.name))
        _index(holders, decided[name], name)
    return True


def _undo(planner: Planner, released: Sequence[tuple[str, Decision, Any]],
          made: Sequence[Decision]) -> None:
    """Release what the move ``made``, then restore what it released."""
    for d in made:
        planner.release(d)
    for _name, old, emptied in reversed(released):
        planner.restore(old, emptied)
    planner.failed.clear()


def _index(holders: dict[tuple[str, str], dict[str, None]], d: Decision,
           name: str) -> None:
    if not d.placed or not d.host:
        return
    if len(d.gpus) > 1:
        holders.setdefault((d.host, ''), {})[name] = None
    for address in d.gpus:
        holders.setdefault((d.host, address), {})[name] = None


def _unindex(holders: dict[tuple[str, str], dict[str, None]],
             d: Decision, name: str) -> None:
    for key in [(d.host or '', a) for a in d.gpus] + [(d.host or '', '')]:
        found = holders.get(key)
        if found is not None:
            found.pop(name, None)


def _noted(d: Decision, text: str) -> Decision:
    note = (Verdict('improve', d.kind, True, text),)
    trail = d.trail + note if isinstance(d.trail, Trail) else \
        Trail(tuple(d.trail), tail=note)
    return Decision(d.workload, d.code, d.reason, d.kind, d.host, d.grants,
                    trail, d.score, d.unverified, d.existing)
