"""The result of planning a fleet: roles, decisions and figures."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.workload import Workload


@dataclasses.dataclass(frozen=True, slots=True)
class GpuReport:
    """One GPU of the plan, for tables and charts.

    ``cu_owners`` lists ``(owner, partition, first CU, count)`` runs;
    ``vf_owners`` the owner of each VF index (None when free).
    """

    host: str
    address: str
    model: str
    role: Role
    mode: str
    used_by: tuple[str, ...]
    cus: int
    vram_mib: int
    demand: float
    granted: float
    vf_owners: tuple[str | None, ...] = ()
    cu_owners: tuple[tuple[str, int | None, int, int], ...] = ()
    partitions: tuple[tuple[int | None, int], ...] = ()
    unverified: bool = False
    fixed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {'host': self.host, 'address': self.address,
                'model': self.model, 'role': self.role.value,
                'mode': self.mode, 'used_by': list(self.used_by),
                'demand': round(self.demand, 4),
                'unverified': self.unverified}


@dataclasses.dataclass(frozen=True)
class Bound:
    """The fluid capacity bound (see the module documentation)."""

    placed: int
    priority: int
    by_kind: Mapping[str, int]
    feasible: int
    #: GPUs the feasible workloads need at least (smallest footprints)
    demand_gpus: float = 0.0
    #: GPUs free for them (the fleet minus running placements)
    capacity_gpus: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {'placed': self.placed, 'priority': self.priority,
                'by_kind': dict(self.by_kind), 'feasible': self.feasible,
                'demand_gpus': round(self.demand_gpus, 2),
                'capacity_gpus': round(self.capacity_gpus, 2)}


@dataclasses.dataclass(frozen=True)
class Plan:
    """GPU roles (a ledger), a decision per workload, and figures."""

    ledger: av_ledger.Ledger
    decisions: tuple[Decision, ...]
    gpus: tuple[GpuReport, ...]
    bound: Bound
    workloads: tuple[Workload, ...]

    def decision(self, name: str) -> Decision:
        """The decision about workload ``name``.

        :raises UnknownWorkload: naming the workload when there is none.
        """
        for item in self.decisions:
            if item.workload == name:
                return item
        raise exception.UnknownWorkload(
            name=name, known=', '.join(d.workload for d in self.decisions))

    def summary(self) -> dict[str, Any]:
        new = [d for d in self.decisions if not d.existing]
        invalid = sum(1 for d in new if d.code is Code.INVALID)
        placed = [d for d in new if d.placed]
        by_kind = {k.value: sum(1 for d in placed if d.kind is k)
                   for k in Kind}
        by_code = {c.value: sum(1 for d in new if d.code is c)
                   for c in Code}
        priority = {w.name: w.priority for w in self.workloads}
        total = len(self.gpus)
        used = [g for g in self.gpus if g.role is not Role.IDLE]
        busy = [g for g in self.gpus if g.used_by]
        demand = sum(g.demand for g in self.gpus)
        stranded = sum(1.0 - g.demand for g in used)
        placed_priority = sum(priority.get(d.workload, 0) for d in placed)
        return {
            'workloads': len(new), 'placed': len(placed),
            'invalid': invalid,
            'placed_by_kind': by_kind, 'by_code': by_code,
            'placed_priority': placed_priority,
            'existing': len(self.decisions) - len(new),
            'unverified': sum(1 for d in placed if d.unverified),
            'gpus': total, 'gpus_with_role': len(used),
            'gpus_in_use': len(busy),
            'roles': {r.value: sum(1 for g in self.gpus if g.role is r)
                      for r in Role},
            'utilisation': round(demand / total, 4) if total else 0.0,
            'utilisation_of_used': (round(demand / len(used), 4)
                                    if used else 0.0),
            'stranded_gpus': round(stranded, 2),
            'bound': self.bound.to_dict(),
            'distance_to_bound': self.bound.placed - len(placed),
            'placed_of_bound': (round(len(placed) / self.bound.placed, 4)
                                if self.bound.placed else 1.0),
            'priority_of_bound': (
                round(placed_priority / self.bound.priority, 4)
                if self.bound.priority else 1.0),
        }

    def placements(self) -> list[dict[str, Any]]:
        """Placed workloads in the state-file form (see :func:`load_state`)."""
        return [{'workload': d.workload, 'kind': d.kind.value,  # type: ignore
                 'host': d.host,
                 'grants': [g.to_dict() for g in d.grants]}
                for d in self.decisions if d.placed]

    def state_dict(self) -> dict[str, Any]:
        """The ledger plus the placements: input of incremental mode."""
        data = self.ledger.to_dict()
        data['placements'] = self.placements()
        return data
