"""One row per GPU of the live fleet: role, users, free, health, drift.

Inputs, all read before by the command:

* the plan of no new workload around what runs (:class:`Plan` of
  :func:`amdgpu_virt.policy.planner.plan` with the running placements of
  :func:`amdgpu_virt.policy.running.placements`): per GPU its role (the
  ledger's, or the one what runs there gives it), who uses it and how much
  of it (CU ranges, VFs, MiB);
* the cross-audit (:func:`amdgpu_virt.pool.crossaudit.audit`): what each
  side offers and uses against the ledger;
* what the nodes register per GPU (:class:`NodeFacts`): health and memory
  enforcement; for a GPU no node registers (a Nova host's), the health
  its inventory's RAS counts give (:func:`inventory_facts`).

Free capacity is what no running placement holds: the CUs and MiB of a
shared GPU its slices leave, the VFs (and their share of CUs and MiB) of
a VF GPU, all or nothing of a whole GPU. A GPU the audit finds but no
inventory lists (reported by a side only) gets a row of its own, with
nothing known of its size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.policy import chart
from amdgpu_virt.policy.result import GpuReport
from amdgpu_virt.policy.result import Plan
from amdgpu_virt.pool.crossaudit import AuditReport
from amdgpu_virt.pool.crossaudit import Finding
from amdgpu_virt.pool.observed import HEALTHY
from amdgpu_virt.pool.observed import NodeFacts
from amdgpu_virt.pool.observed import UNHEALTHY
from amdgpu_virt.pool.observed import UNKNOWN

COLUMNS = ('Host', 'GPU', 'Model', 'Role', 'Mode', 'Used by', 'CUs',
           'CUs free', 'MiB', 'MiB free', 'VFs', 'VFs free', 'Health',
           'Enforcement', 'Drift')
#: enforcement of a role that needs none from the node
HARDWARE = 'sr-iov'
WHOLE = 'whole-gpu'
#: the findings a row lists as drift (the others are information)
DRIFT_SEVERITIES = ('conflict', 'drift')


@dataclasses.dataclass(frozen=True)
class GpuStatus:
    """One GPU as the fleet runs it.

    Sizes are None where nothing is known (a GPU no inventory lists);
    ``vfs`` and ``vfs_free`` are None for a GPU that is not a VF GPU.
    """

    host: str
    address: str
    model: str
    role: str
    mode: str
    users: tuple[str, ...]
    cus: int | None
    cus_free: int | None
    vram_mib: int | None
    mib_free: int | None
    vfs: int | None
    vfs_free: int | None
    health: str
    health_reason: str
    enforcement: str
    findings: tuple[Finding, ...] = ()

    @property
    def drift(self) -> tuple[str, ...]:
        """The kinds of its conflict and drift findings."""
        return tuple(dict.fromkeys(
            f.kind.value for f in self.findings
            if f.severity in DRIFT_SEVERITIES))

    def row(self) -> tuple[Any, ...]:
        """The values of :data:`COLUMNS` (an empty string where a size is
        not known or does not apply)."""
        health = self.health
        if self.health_reason:
            health = '%s: %s' % (health, self.health_reason)
        sizes = tuple('' if v is None else v for v in (
            self.cus, self.cus_free, self.vram_mib, self.mib_free, self.vfs,
            self.vfs_free))
        return (self.host, self.address, self.model, self.role, self.mode,
                ', '.join(self.users)) + sizes + (
                    health, self.enforcement, ', '.join(self.drift))

    def to_dict(self) -> dict[str, Any]:
        return {'host': self.host, 'address': self.address,
                'model': self.model, 'role': self.role, 'mode': self.mode,
                'users': [{'name': u, 'kind': user_kind(u)}
                          for u in self.users],
                'cus': self.cus, 'cus_free': self.cus_free,
                'vram_mib': self.vram_mib, 'mib_free': self.mib_free,
                'vfs': self.vfs, 'vfs_free': self.vfs_free,
                'health': self.health, 'health_reason': self.health_reason,
                'enforcement': self.enforcement, 'drift': list(self.drift),
                'findings': [f.to_dict() for f in self.findings]}


@dataclasses.dataclass(frozen=True)
class FleetStatus:
    """Every GPU's row, the audit's findings and what was odd."""

    gpus: tuple[GpuStatus, ...]
    findings: tuple[Finding, ...]
    warnings: tuple[str, ...]
    sides: tuple[str, ...]
    #: where the roles came from (a file, the ledger ConfigMap)
    ledger: str = ''

    @property
    def conflicts(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == 'conflict')

    @property
    def drifting(self) -> bool:
        return any(f.severity == 'drift' for f in self.findings)

    def summary(self) -> dict[str, Any]:
        roles: dict[str, int] = {}
        for gpu in self.gpus:
            roles[gpu.role] = roles.get(gpu.role, 0) + 1
        known = [g for g in self.gpus if g.cus is not None]
        return {
            'gpus': len(self.gpus), 'roles': dict(sorted(roles.items())),
            'in_use': sum(1 for g in self.gpus if g.users),
            'users': len({u for g in self.gpus for u in g.users}),
            'cus': sum(g.cus or 0 for g in known),
            'cus_free': sum(g.cus_free or 0 for g in known),
            'vram_mib': sum(g.vram_mib or 0 for g in known),
            'mib_free': sum(g.mib_free or 0 for g in known),
            'vfs': sum(g.vfs or 0 for g in self.gpus),
            'vfs_free': sum(g.vfs_free or 0 for g in self.gpus),
            'unhealthy': sum(1 for g in self.gpus if g.health == UNHEALTHY),
            'health_unknown': sum(1 for g in self.gpus
                                  if g.health == UNKNOWN),
            'conflicts': len(self.conflicts),
            'drift': sum(1 for f in self.findings if f.severity == 'drift'),
        }

    def to_dict(self) -> dict[str, Any]:
        return {'ledger': self.ledger, 'sides': list(self.sides),
                'summary': self.summary(),
                'gpus': [g.to_dict() for g in self.gpus],
                'findings': [f.to_dict() for f in self.findings],
                'warnings': list(self.warnings)}


def user_kind(name: str) -> str:
    """``pod``, ``claim``, ``vm`` or ``held`` (a GPU kept occupied for a
    consumer whose use does not add up) from a running placement's
    name."""
    prefix = name.split('/', 1)[0]
    return {'pod': 'pod', 'claim': 'claim', 'instance': 'vm',
            'held': 'held'}.get(prefix, 'workload')


def _free(gpu: GpuReport, held_mib: int
          ) -> tuple[int, int, int | None, int | None]:
    """(CUs free, MiB free, VFs, VFs free) of one GPU of the plan."""
    cus, vram = gpu.cus or 0, gpu.vram_mib or 0
    if gpu.role is Role.NOVA_VF:
        vfs = len(gpu.vf_owners)
        free = sum(1 for owner in gpu.vf_owners if owner is None)
        if not vfs:
            return 0, 0, 0, 0
        return cus * free // vfs, vram * free // vfs, vfs, free
    if gpu.role is Role.K8S_SHARED:
        used = sum(length for _o, _p, _s, length in gpu.cu_owners)
        return max(0, cus - used), max(0, vram - held_mib), None, None
    if gpu.role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED) and \
            gpu.used_by:
        return 0, 0, None, None
    return cus, vram, None, None


def _merged_facts(node: Mapping[tuple[str, PciAddress], NodeFacts],
                  inventory: Mapping[tuple[str, PciAddress], NodeFacts]
                  ) -> dict[tuple[str, PciAddress], NodeFacts]:
    merged = dict(node)
    for key, judged in inventory.items():
        said = merged.get(key)
        if said is None:
            merged[key] = judged
        elif judged.health == UNHEALTHY and said.health != UNHEALTHY:
            merged[key] = dataclasses.replace(said, health=UNHEALTHY,
                                              reason=judged.reason)
    return merged


def _enforcement(role: Role, facts: NodeFacts | None) -> str:
    if role is Role.NOVA_VF:
        return HARDWARE
    if role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED):
        return WHOLE
    if role is Role.K8S_SHARED:
        return facts.enforcement if facts is not None else UNKNOWN
    return '-'


def inventory_facts(hosts: Sequence[HostInventory],
                    max_uncorrectable: int | None
                    ) -> dict[tuple[str, PciAddress], NodeFacts]:
    """The health of each GPU whose inventory has RAS counts, judged
    as the planner judges it (``[health] max_uncorrectable``): what a
    host that registers nothing (a Nova host) shows in the Health
    column."""
    result = {}
    for inventory in hosts:
        for gpu in inventory.gpus:
            if gpu.health is None:
                continue
            problem = gpu.health.problem(max_uncorrectable)
            result[(inventory.hostname, gpu.address)] = NodeFacts(
                health=UNHEALTHY if problem else HEALTHY,
                reason='inventory: %s' % problem if problem else '')
    return result


def build(plan: Plan, audit: AuditReport | None,
          facts: Mapping[tuple[str, PciAddress], NodeFacts],
          warnings: Sequence[str] = (), sides: Sequence[str] = (),
          ledger: str = '',
          inventory: Mapping[tuple[str, PciAddress], NodeFacts]
          | None = None) -> FleetStatus:
    """The fleet's status from the plan around what runs, the audit and
    what the nodes register.

    :param audit: None when no side was audited (no drift column).
    :param inventory: health from the hosts' inventories
        (:func:`inventory_facts`), for GPUs no node registers; a node's
        own word comes first, except that an unhealthy inventory is never
        hidden by a node that says healthy.
    """
    facts = _merged_facts(facts, inventory or {})
    held = chart.vram_held(plan.gpus, plan.decisions)
    by_gpu: dict[tuple[str, str], list[Finding]] = {}
    findings = audit.findings if audit is not None else ()
    for finding in findings:
        by_gpu.setdefault((finding.host, str(finding.address)),
                          []).append(finding)
    roles = {(a.host, str(a.address)): a for a in plan.ledger.assignments}
    rows = []
    seen = set()
    for gpu in plan.gpus:
        key = (gpu.host, gpu.address)
        seen.add(key)
        node = facts.get((gpu.host, PciAddress.parse(gpu.address)))
        cus_free, mib_free, vfs, vfs_free = _free(gpu, held.get(key, 0))
        rows.append(GpuStatus(
            host=gpu.host, address=gpu.address, model=gpu.model,
            role=gpu.role.value, mode=gpu.mode, users=gpu.used_by,
            cus=gpu.cus, cus_free=cus_free, vram_mib=gpu.vram_mib,
            mib_free=mib_free, vfs=vfs, vfs_free=vfs_free,
            health=node.health if node else UNKNOWN,
            health_reason=node.reason if node else '',
            enforcement=_enforcement(gpu.role, node),
            findings=tuple(by_gpu.get(key, ()))))
    for key in sorted(set(by_gpu) - seen):
        # reported by a side (or listed by the ledger) without inventory
        node = facts.get((key[0], PciAddress.parse(key[1])))
        assignment = roles.get(key)
        role = assignment.role if assignment else None
        rows.append(GpuStatus(
            host=key[0], address=key[1],
            model=assignment.model if assignment else '-',
            role=role.value if role else '-', mode='-', users=(),
            cus=None, cus_free=None, vram_mib=None, mib_free=None,
            vfs=None, vfs_free=None,
            health=node.health if node else UNKNOWN,
            health_reason=node.reason if node else '',
            enforcement=(_enforcement(role, node) if role else UNKNOWN),
            findings=tuple(by_gpu[key])))
    rows.sort(key=lambda r: (r.host, r.address))
    return FleetStatus(tuple(rows), tuple(findings), tuple(warnings),
                       tuple(sides), ledger)
