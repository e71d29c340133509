"""The capacity bound: no plan does better than this, by capacity alone.

The problem is relaxed to capacity alone: each feasible workload costs at
least its smallest footprint in GPUs (whole GPUs, a VF's share
``1 / vf_count``, or its CU/memory share) over the kinds and GPU classes
it may use; no plan places more workloads than the most such footprints
that fit in the fleet's free GPUs, nor more priority than their
fractional knapsack. It ignores host boundaries, partitions, slice limits
and fragmentation, so the distance between the plan and the bound is at
most what packing costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from amdgpu_virt.model import Kind
from amdgpu_virt.policy import explain
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.result import Bound
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Workload

if TYPE_CHECKING:
    from amdgpu_virt.policy.explain import FleetShape
    from amdgpu_virt.policy.fleetstate import FleetState


def bound(state: FleetState, fleet: FleetShape,
          workloads: Sequence[Workload]) -> Bound:
    """Upper bounds by capacity alone (see the module documentation).

    Each feasible workload costs at least its smallest footprint, in
    GPUs, over the kinds and GPU classes (model, host driver family)
    it may use: whole GPUs, ``gpus / vf_count`` or its CU/memory share.
    No plan places more workloads than the most of these smallest
    footprints that fit in the fleet's free GPUs, nor more priority
    than the fractional knapsack of them; per kind likewise, within
    the GPUs that kind may use. Workloads that may only use the GPUs
    a pod may use (amdgpu hosts, and hosts without a driver family)
    must also fit in those GPUs; the bound is the smaller of the two.
    """
    rooms: dict[tuple[str, str], float] = {}
    for gs in state.gpus:
        key = (gs.model.name, gs.host.family_key)
        rooms[key] = rooms.get(key, 0.0) + 1.0
    for d in state.existing:
        for grant in d.grants:
            gs = state.gpu_at(d.host or '', grant.address, 'placements')
            key = (gs.model.name, gs.host.family_key)
            rooms[key] -= min(1.0, max(
                grant.compute_units / (gs.cus or 1),
                grant.memory_mib / (gs.vram or 1)))
    feet: list[tuple[float, int]] = []
    restricted: list[bool] = []
    kind_feet: dict[Kind, list[float]] = {k: [] for k in Kind}
    kind_rooms: dict[Kind, float] = dict.fromkeys(Kind, 0.0)
    counted: set[tuple[Kind, tuple[str, str]]] = set()
    pod = Workload('pod', Platform.POD)
    pod_keys = {key for key in rooms
                if class_ok(state, Kind.CU, pod, key[1])}
    cache: dict[Any, tuple[float, dict[Kind, float], bool]] = {}
    #: feasible workloads per shape (their footprints per kind are the
    #: shape's, and only sorted: added once per shape at the end)
    counts: dict[Any, int] = {}
    for w in workloads:
        shape = w.shape()
        found = cache.get(shape)
        if found is None:
            found = cache[shape] = _footprint(state, fleet, w, rooms,
                                              counted, kind_rooms, pod_keys)
        best, _per_kind, inner = found
        if best < math.inf:
            feet.append((best, w.priority))
            restricted.append(inner)
            counts[shape] = counts.get(shape, 0) + 1
    for shape, count in counts.items():
        for kind, foot in cache[shape][1].items():
            kind_feet[kind].extend([foot] * count)
    total = sum(max(0.0, r) for r in rooms.values())
    pod_room = sum(max(0.0, rooms[k]) for k in pod_keys)
    inside = [f for f, r in zip(feet, restricted, strict=True) if r]
    outside = [f for f, r in zip(feet, restricted, strict=True) if not r]
    placed = min(
        _smallest_first(sorted(f for f, _p in feet), total),
        _smallest_first(sorted(f for f, _p in inside), pod_room)
        + _smallest_first(sorted(f for f, _p in outside), total))
    priority = min(
        _knapsack(feet, total),
        _knapsack(inside, pod_room) + _knapsack(outside, total))
    by_kind = {k.value: _smallest_first(sorted(kind_feet[k]),
                                        kind_rooms[k]) for k in Kind}
    return Bound(placed, int(priority), by_kind, len(feet),
                 sum(f for f, _p in feet), total)


def _footprint(state: FleetState, fleet: FleetShape, w: Workload,
               rooms: dict[tuple[str, str], float],
               counted: set[tuple[Kind, tuple[str, str]]],
               kind_rooms: dict[Kind, float],
               pod_keys: set[tuple[str, str]]
               ) -> tuple[float, dict[Kind, float], bool]:
    """(smallest footprint, smallest per kind, whether it may only use
    ``pod_keys``) of the shape of ``w``; adds the rooms of the GPU
    classes a kind may use to ``kind_rooms``, each (kind, class) once
    (``counted``)."""
    best = math.inf
    per_kind: dict[Kind, float] = {}
    judgement = state.engine.judge(w, state.options)
    if not judgement.allowed or explain.never_reasons(
            state, fleet, w, judgement)[0]:
        return best, per_kind, False
    used: set[tuple[str, str]] = set()
    for option in judgement.allowed:
        if option.kind is Kind.VF:
            foot = w.gpus / (option.vf_count or 1)
        elif option.kind is Kind.CU:
            foot = w.gpus * w.fraction_on(option.model)
        else:
            foot = float(w.gpus)
        for key, room in rooms.items():
            if key[0] != option.model.name or not class_ok(state,
                    option.kind, w, key[1]):
                continue
            if (option.kind, key) not in counted:
                counted.add((option.kind, key))
                kind_rooms[option.kind] += room
            used.add(key)
            best = min(best, foot)
            per_kind[option.kind] = min(
                per_kind.get(option.kind, math.inf), foot)
    inner = bool(used) and used <= pod_keys != set(rooms)
    return best, per_kind, inner


def class_ok(state: FleetState, kind: Kind, w: Workload,
             family_key: str) -> bool:
    """May ``kind`` for ``w`` use GPUs of a host of ``family_key``?"""
    if kind is Kind.DEDICATED and w.platform is not Platform.POD:
        return True
    family = st.GIM if kind is Kind.VF else st.AMDGPU
    return state.allow_mixed or family_key in (family, 'none', 'mixed')


def _knapsack(items: Sequence[tuple[float, int]], room: float) -> float:
    """Fractional knapsack of (footprint, priority) items in ``room``."""
    total = 0.0
    # the ratio once per distinct item (a plan has few), each item's
    # looked up in C: the same stable order as a key function per item
    ratios: dict[tuple[float, int], float] = {}
    for item in items:
        if item not in ratios:
            ratios[item] = -item[1] / max(item[0], 1e-9)
    for foot, prio in sorted((i for i in items if i[1] > 0),
                             key=ratios.__getitem__):
        if room <= 0:
            break
        take = min(1.0, room / foot) if foot > 0 else 1.0
        total += prio * take
        room -= foot * take
    return total


def _smallest_first(feet: Sequence[float], room: float) -> int:
    count = 0
    for foot in feet:
        if foot > room + 1e-9:
            break
        room -= foot
        count += 1
    return count
