"""Why a workload goes where it goes, or why it does not fit.

* :func:`fleet_shape`: what the fleet could ever offer (the most GPUs
  of a model any one host can give per role, VFs per host, the largest
  shareable device), whatever is in use;
* :func:`never_reasons`: a workload that can never fit, with the
  tightest reason; :func:`capacity_verdict`: one that does not fit now;
* :func:`short`: the reason of a placement in a few words;
  :func:`placed_verdicts`: its trail (the weighers' ranking, what was
  free where it went, what it got), written out from the numbers
  :func:`ranked_state_of` and :func:`free_state` keep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import base
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.policy.decision import UNVERIFIED
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Workload

if TYPE_CHECKING:
    from amdgpu_virt.policy.fleetstate import FleetState
    from amdgpu_virt.policy.candidates import Choice


@dataclasses.dataclass(frozen=True)
class FleetShape:
    """What a fleet could ever offer, whatever is in use.

    :param per_host: the most GPUs of a model one host can give in a role,
        per (model name, role).
    :param vf_hosts: the most VFs one host can give, per (model name, VFs
        per GPU).
    :param pools: the largest shareable device (CUs, MiB) per model name,
        each the largest of any GPU of that model.
    """

    per_host: Mapping[tuple[str, Role], int]
    vf_hosts: Mapping[tuple[str, int | None], int]
    pools: Mapping[str, tuple[int, int]]


def fleet_shape(state: FleetState) -> FleetShape:
    """What the fleet could ever offer, per model and role."""
    per_host: dict[tuple[str, Role], int] = {}
    vf_hosts: dict[tuple[str, int | None], int] = {}
    vfs: dict[tuple[str, int | None], int] = {}
    pools: dict[str, tuple[int, int]] = {}
    for host in state.hosts.values():
        count: dict[tuple[str, Role], int] = {}
        for gs in host.gpus:
            for role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED,
                         Role.K8S_SHARED, Role.NOVA_VF):
                if gs.role is None:
                    ok = state.role_ok(gs, role)[0]
                else:
                    ok = gs.role is role
                if not ok:
                    continue
                key = (gs.model.name, role)
                count[key] = count.get(key, 0) + 1
                if role is Role.NOVA_VF:
                    vf = gs.vf_count if gs.role else state.vf_count_on(gs)
                    vkey = (gs.model.name, vf)
                    vfs[vkey] = vfs.get(vkey, 0) + (vf or 0)
                if role is Role.K8S_SHARED:
                    if gs.pools:
                        sizes = [(p.alloc.total, p.mem_total)
                                 for p in gs.pools]
                    else:
                        sizes = [s for _m, layout in gs.layouts()
                                 for s in layout]
                    best = (max(c for c, _m in sizes),
                            max(m for _c, m in sizes))
                    old = pools.get(gs.model.name, (0, 0))
                    pools[gs.model.name] = (max(old[0], best[0]),
                                            max(old[1], best[1]))
        for key, value in count.items():
            per_host[key] = max(per_host.get(key, 0), value)
        for vkey, value in vfs.items():
            vf_hosts[vkey] = max(vf_hosts.get(vkey, 0), value)
        vfs.clear()
    return FleetShape(per_host, vf_hosts, pools)


def never_reasons(state: FleetState, shape: FleetShape, w: Workload,
                  judgement: av_engine.Judgement
                  ) -> tuple[bool, list[Verdict]]:
    """Whether ``w`` can never fit the fleet, whatever is free, and the
    verdicts saying why (per allowed option, the tightest first)."""
    key = w.shape()
    if key in state.never:
        known = state.never[key]
        return all(not v.passed for v in known), known
    reasons: list[tuple[int, Verdict]] = []
    for option in judgement.allowed:
        model = option.model
        if option.kind is Kind.DEDICATED:
            roles = {Platform.VM: [Role.NOVA_DEDICATED],
                     Platform.POD: [Role.K8S_DEDICATED]}.get(
                w.platform, [Role.NOVA_DEDICATED, Role.K8S_DEDICATED])
            most = max(shape.per_host.get((model.name, r), 0)
                       for r in roles)
            ok = w.gpus <= most
            text = ('needs %d whole %s GPUs on one host; the most any '
                    'host can give as %s is %d' % (
                        w.gpus, model.name,
                        ' or '.join(r.value for r in roles), most))
        elif option.kind is Kind.VF:
            most = shape.vf_hosts.get((model.name, option.vf_count), 0)
            ok = w.gpus <= most
            text = ('needs %d VFs of a %s on one host; the most any host '
                    'can give is %d' % (w.gpus, model.name, most))
        else:
            most = shape.per_host.get((model.name, Role.K8S_SHARED), 0)
            cus, mib = shape.pools.get(model.name, (0, 0))
            need_cus = w.cus_on(model)
            need_mib = w.memory_on(model)
            ok = (w.gpus <= most and need_cus <= cus
                  and need_mib <= mib)
            text = ('needs %d slices of %d CUs and %d MiB on distinct %s '
                    'GPUs of one host; the fleet can share at most %d '
                    'GPUs per host, with devices (GPUs or partitions) of '
                    'up to %d CUs and %d MiB' % (
                        w.gpus, need_cus, need_mib, model.name, most,
                        cus, mib))
        reasons.append((most, Verdict('capacity', option.kind, ok, text,
                                      model.name)))
    reasons.sort(key=lambda item: -item[0])
    verdicts = [v for _m, v in reasons]
    state.never[key] = verdicts
    return all(not v.passed for v in verdicts), verdicts


def capacity_verdict(state: FleetState, w: Workload, option: base.Option
                      ) -> Verdict:
    model = option.model
    name = model.name
    free_gpus = state.free.count(name)
    if option.kind is Kind.DEDICATED:
        ready = sum(len(v) for (m, _r), hosts in state.ready.items()
                    if m == name for v in hosts.values()) \
            if state.ready else 0
        text = ('needs %d whole %s GPU(s) on one host; %d unassigned '
                'and %d free dedicated GPU(s) in the fleet, none '
                'enough on one host' % (w.gpus, name, free_gpus, ready))
    elif option.kind is Kind.VF:
        index = state.vf_index.get((name, option.vf_count or 0))
        free_vfs = index.total if index else 0
        text = ('needs %d VF(s) of a %s; %d VF(s) free on nova-vf GPUs '
                'and %d unassigned GPU(s) that could take the role' % (
                    w.gpus, name, free_vfs, free_gpus))
    else:
        pools = state.cu_index.get(name)
        biggest = pools.largest() if pools else 0
        text = ('needs %d slice(s) of %d CUs and %d MiB on %s; the '
                'largest free slice on a shared device is %d CUs, and '
                '%d unassigned GPU(s) could take the role' % (
                    w.gpus, w.cus_on(model), w.memory_on(model), name,
                    biggest, free_gpus))
    return Verdict('capacity', option.kind, False, text, name)


#: tags of :func:`free_state` entries (each followed by its numbers)
_CONVERT, _VFS, _SLICE, _WHOLE = range(4)


def free_state(choice: Choice) -> list[Any]:
    """What is free where the workload goes, before it goes there: per
    GPU a tag, its address and the numbers (flat, for
    :func:`placed_verdicts`)."""
    state: list[Any] = []
    seen: set[int] = set()
    for gs, pool in zip(choice.gpus, choice.pools, strict=True):
        if id(gs) in seen:
            continue
        seen.add(id(gs))
        if gs in choice.convert:
            state += (_CONVERT, gs.address)
        elif choice.kind is Kind.VF:
            state += (_VFS, gs.address, len(gs.vf_free), gs.vf_count or 0)
        elif choice.kind is Kind.CU and pool is not None:
            state += (_SLICE, gs.address, pool.partition,
                      pool.alloc.free_count, pool.alloc.total,
                      pool.mem_free, pool.mem_total)
        else:
            state += (_WHOLE, gs.address)
    return state


def _free_text(w: Workload, model: GpuModel, role: Role, host: str,
               state: Sequence[Any]) -> str:
    parts = []
    i = 0
    while i < len(state):
        tag, address = state[i], state[i + 1]
        if tag == _CONVERT:
            parts.append('%s: unassigned, becomes %s' % (address,
                                                         role.value))
            i += 2
        elif tag == _VFS:
            parts.append('%s: %d of %d VFs free' % (address, state[i + 2],
                                                    state[i + 3]))
            i += 4
        elif tag == _SLICE:
            part, free, total, mem_free, mem_total = state[i + 2:i + 7]
            parts.append('%s%s: %d of %d CUs and %d of %d MiB free' % (
                address, '' if part is None else ' part %d' % part,
                free, total, mem_free, mem_total))
            i += 7
        else:
            parts.append('%s: free %s GPU' % (address, role.value))
            i += 2
    return 'requested %d x (%d CUs, %d MiB) on %s; %s' % (
        w.gpus, w.cus_on(model), w.memory_on(model), host,
        '; '.join(parts))


def ranking(ranked: Sequence[av_engine.Scored],
            candidates: Sequence[base.Candidate],
            memo: dict[Any, Any]) -> tuple[tuple[int, Any], ...]:
    """The ranking of ``candidates`` as their positions, best first, each
    with what its verdict shares with others of its profile (kept once in
    ``memo``): the same for any candidates of the same profiles when the
    weighers read only those."""
    where = {id(c): i for i, c in enumerate(candidates)}
    return tuple((where[id(s.candidate)], _shared(s, memo)) for s in ranked)


def ranked_state_of(order: Sequence[tuple[int, Any]],
                    candidates: Sequence[base.Candidate]) -> list[Any]:
    """The weighers' ranking of ``candidates`` as ``order`` (from
    :func:`ranking`) says, flat (for :func:`weigher_verdicts`): per
    candidate what its verdict shares with others of its profile, its
    host and its GPUs."""
    state: list[Any] = []
    for i, shared in order:
        c = candidates[i]
        state += (shared, c.host, c.addresses)
    return state


def _shared(scored: av_engine.Scored, memo: dict[Any, Any]) -> Any:
    c = scored.candidate
    key = (id(scored.parts), id(c.kind), c.in_role == len(
        c.addresses), c.model.name, scored.score)
    shared = memo.get(key)
    if shared is None:
        shared = memo[key] = (c.kind, key[2], c.model.name, scored.score,
                              scored.parts)
    return shared


def weigher_verdicts(state: Sequence[Any]) -> list[Verdict]:
    """A verdict per ranked candidate of :func:`ranked_state_of`, best
    first."""
    verdicts = []
    for i in range(0, len(state), 3):
        shared, host, addresses = state[i:i + 3]
        kind, in_role, model, score, parts = shared
        verdicts.append(Verdict(
            'weighers', kind, True, '%s on %s %s (%s): score %s' % (
                kind.value, host, ','.join(addresses),
                'in role' if in_role else 'converting',
                av_engine.explain_parts(score, parts)), model))
    return verdicts


def placed_verdicts(w: Workload,
                    kind_of: tuple[GpuModel, Kind, Role, bool], host: str,
                    grants: Sequence[Grant], ranked: int, *state: Any
                    ) -> list[Verdict]:
    """The planner's verdicts of a placement, in words: the weighers'
    ranking (the first ``ranked`` items of ``state``, from
    :func:`ranked_state_of`), what was free where it went (the rest, from
    :func:`free_state`), and what it got.

    :param kind_of: the model, kind, role and whether it is unverified.
    """
    model, kind, role, unverified = kind_of
    verdicts = weigher_verdicts(state[:ranked])
    verdicts.append(Verdict('capacity', kind, True,
                            _free_text(w, model, role, host,
                                       state[ranked:]), model.name))
    reason = '%s on %s: %s' % (kind.value, host, ', '.join(
        '%s %s' % (g.address, g.describe()) for g in grants))
    if unverified:
        reason += ' (%s: mixed host drivers)' % UNVERIFIED
    verdicts.append(Verdict('planner', kind, True, 'placed ' + reason,
                            model.name))
    return verdicts


def first_refusals(trail: Sequence[Verdict]) -> str:
    seen: list[tuple[Kind | None, str]] = []
    for verdict in trail:
        if not verdict.passed and verdict.kind not in [k for k, _ in seen]:
            seen.append((verdict.kind, verdict.message))
    return '; '.join('%s: %s' % (k.value if k else '-', m) for k, m in seen)


def short(w: Workload, choice: Choice,
          judgement: av_engine.Judgement) -> str:
    """Why this kind, in a few words, and which rules excluded the others."""
    kind = choice.kind
    view = choice.view
    if kind is Kind.DEDICATED:
        if w.p2p and w.gpus > 1:
            why = 'P2P across %d GPUs' % w.gpus
        else:
            why = 'whole GPU%s' % ('s' if w.gpus > 1 else '')
    elif kind is Kind.VF:
        why = 'VF of %d CUs/%d MiB' % (view.unit_cus, view.unit_mib)
    else:
        why = '%d CUs + %d MiB slice' % (view.unit_cus, view.unit_mib)
    allowed = judgement.kinds()
    excluded: dict[Kind, list[str]] = {}
    for verdict in judgement.trail:
        if (not verdict.passed and verdict.kind is not None
                and verdict.kind not in allowed):
            rules = excluded.setdefault(verdict.kind, [])
            if verdict.rule not in rules:
                rules.append(verdict.rule)
    notes = ['no %s: %s' % (k.value, '/'.join(excluded[k]))
             for k in av_engine.KIND_ORDER if k in excluded]
    if notes:
        why += ' (%s)' % '; '.join(notes)
    if choice.unverified:
        why += '; %s' % UNVERIFIED
    return why
