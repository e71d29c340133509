"""Cross-audit: is every GPU offered and used only where the ledger says?

Inputs are the role ledger, the hosts' inventories and what each side
reports (:class:`~amdgpu_virt.pool.observed.SideObservation`); the result is
a list of typed findings. Nothing here talks to an API.

Severities:

* ``conflict``: a GPU offered or used on both sides, or offered or used by
  a side the ledger does not give it to. ``amdgpu-virt audit`` exits
  non-zero when there is one.
* ``drift``: the host does not (yet) look the way the ledger says (driver,
  VF count, partition mode), or a side does not offer a GPU the ledger
  gives it (stranded capacity).
* ``info``: GPUs without a role, idle GPUs.

Health: a GPU whose host inventory carries more uncorrectable RAS errors
than allowed (``max_uncorrectable``, the ``[health]`` option) or a
verdict of its node, or that a side reports unhealthy (a node
registration entry with ``health: false``), is ``unhealthy`` (drift: it
needs repair, it is not stranded); one that a consumer still uses (a VM
on one of its VFs, a pod on it) is ``unhealthy-in-use``, a conflict.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from amdgpu_virt.ledger import GpuAssignment
from amdgpu_virt.ledger import Ledger
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.pool.observed import SideObservation

SIDES = ('nova', 'k8s')


class FindingKind(str, enum.Enum):
    DOUBLE_OFFER = 'double-offer'
    DOUBLE_USE = 'double-use'
    OFFER_AGAINST_LEDGER = 'offer-against-ledger'
    USE_AGAINST_LEDGER = 'use-against-ledger'
    REALITY_DIFFERS = 'reality-differs'
    NOT_OFFERED = 'not-offered'
    NOT_IN_LEDGER = 'not-in-ledger'
    UNKNOWN_GPU = 'unknown-gpu'
    IDLE = 'idle'
    UNHEALTHY = 'unhealthy'
    UNHEALTHY_IN_USE = 'unhealthy-in-use'


SEVERITY = {
    FindingKind.DOUBLE_OFFER: 'conflict',
    FindingKind.DOUBLE_USE: 'conflict',
    FindingKind.OFFER_AGAINST_LEDGER: 'conflict',
    FindingKind.USE_AGAINST_LEDGER: 'conflict',
    FindingKind.UNHEALTHY_IN_USE: 'conflict',
    FindingKind.UNHEALTHY: 'drift',
    FindingKind.REALITY_DIFFERS: 'drift',
    FindingKind.NOT_OFFERED: 'drift',
    FindingKind.UNKNOWN_GPU: 'drift',
    FindingKind.NOT_IN_LEDGER: 'info',
    FindingKind.IDLE: 'info',
}


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One thing the audit found about one GPU."""

    host: str
    address: PciAddress
    kind: FindingKind
    message: str

    @property
    def severity(self) -> str:
        return SEVERITY[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {'host': self.host, 'address': str(self.address),
                'kind': self.kind.value, 'severity': self.severity,
                'message': self.message}


@dataclasses.dataclass(frozen=True)
class AuditReport:
    findings: tuple[Finding, ...]
    gpus: int
    offered: Mapping[str, int]
    in_use: Mapping[str, int]
    stranded: int

    @property
    def conflicts(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == 'conflict')

    def to_dict(self) -> dict[str, Any]:
        return {'gpus': self.gpus, 'offered': dict(self.offered),
                'in_use': dict(self.in_use), 'stranded': self.stranded,
                'conflicts': len(self.conflicts),
                'findings': [f.to_dict() for f in self.findings]}


def reality_problems(gpu: Gpu, assignment: GpuAssignment) -> list[str]:
    """How ``gpu`` as inventoried differs from what its role needs."""
    role = assignment.role
    problems = []
    if role is Role.NOVA_VF:
        if gpu.driver is not Driver.GIM:
            problems.append('role nova-vf needs the gim driver, found %s'
                            % gpu.driver.value)
        elif len(gpu.vfs) != assignment.vf_count:
            problems.append('ledger wants %s VFs, host has %d'
                            % (assignment.vf_count, len(gpu.vfs)))
    elif role is Role.NOVA_DEDICATED:
        if gpu.driver is not Driver.VFIO_PCI:
            problems.append('role nova-dedicated needs vfio-pci, found %s'
                            % gpu.driver.value)
    elif role in (Role.K8S_SHARED, Role.K8S_DEDICATED):
        if gpu.driver is not Driver.AMDGPU:
            problems.append('role %s needs the amdgpu driver, found %s'
                            % (role.value, gpu.driver.value))
        else:
            for field, want in (('compute_partition',
                                 assignment.compute_mode),
                                ('memory_partition', assignment.memory_mode)):
                have = getattr(gpu, field)
                if want and have and have.upper() != want:
                    problems.append('ledger wants %s %s, host has %s'
                                    % (field.replace('_', ' '), want, have))
    if assignment.model != gpu.model.name:
        problems.append('ledger says model %s, host has %s'
                        % (assignment.model, gpu.model.name))
    return problems


def _side_findings(host: str, address: PciAddress,
                   assignment: GpuAssignment | None,
                   seen: Mapping[str, SideObservation],
                   sides: frozenset[str] = frozenset(SIDES)
                   ) -> list[Finding]:
    found = []

    def add(kind: FindingKind, message: str) -> None:
        found.append(Finding(host, address, kind, message))

    offered = [s for s in SIDES if s in seen and seen[s].offered]
    used = [s for s in SIDES if s in seen and seen[s].in_use]
    if len(offered) > 1:
        add(FindingKind.DOUBLE_OFFER, 'offered by both nova (%s) and k8s '
            '(%s)' % (seen['nova'].detail, seen['k8s'].detail))
    if len(used) > 1:
        add(FindingKind.DOUBLE_USE, 'in use on both sides: nova %s, k8s %s'
            % (', '.join(seen['nova'].consumers),
               ', '.join(seen['k8s'].consumers)))
    owner = assignment.role.side if assignment else None
    sick = owner in seen and bool(seen[owner].unhealthy) if owner else False
    for side in SIDES:
        if side == owner or side not in seen:
            continue
        why = ('ledger role is %s' % assignment.role.value if assignment
               else 'GPU has no role in the ledger')
        if seen[side].in_use:
            add(FindingKind.USE_AGAINST_LEDGER, '%s consumers %s hold it but '
                '%s' % (side, ', '.join(seen[side].consumers), why))
        elif seen[side].offered:
            add(FindingKind.OFFER_AGAINST_LEDGER, '%s offers it (%s) but %s'
                % (side, seen[side].detail, why))
    if owner and owner in sides and not sick and not (
            owner in seen and seen[owner].offered):
        add(FindingKind.NOT_OFFERED, 'ledger gives it to %s (%s) but %s does '
            'not offer it: stranded capacity' % (
                owner, assignment.role.value if assignment else '', owner))
    return found


def health_findings(host: str, address: PciAddress, gpu: Gpu | None,
                    seen: Mapping[str, SideObservation],
                    max_uncorrectable: int | None) -> list[Finding]:
    """``unhealthy`` or ``unhealthy-in-use`` when the host inventory or a
    side says the GPU is sick."""
    reasons = []
    if gpu is not None and gpu.health is not None:
        problem = gpu.health.problem(max_uncorrectable)
        if problem:
            reasons.append('host: %s' % problem)
    for side in SIDES:
        if side in seen and seen[side].unhealthy:
            reasons.append('%s: %s' % (side, seen[side].unhealthy))
    if not reasons:
        return []
    users = [(s, seen[s].consumers) for s in SIDES
             if s in seen and seen[s].in_use]
    if users:
        return [Finding(host, address, FindingKind.UNHEALTHY_IN_USE,
                        'unhealthy (%s) but in use by %s' % (
                            '; '.join(reasons), '; '.join(
                                '%s %s' % (s, ', '.join(c))
                                for s, c in users)))]
    return [Finding(host, address, FindingKind.UNHEALTHY,
                    'unhealthy: %s' % '; '.join(reasons))]


def audit(ledger: Ledger, inventories: Iterable[HostInventory],
          observations: Iterable[SideObservation],
          sides: Iterable[str] = SIDES,
          max_uncorrectable: int | None = 0) -> AuditReport:
    """Compare the ledger with the hosts and with what each side reports.

    :param sides: the sides that were asked; a GPU the ledger gives to a
        side not asked is not reported as not offered.
    :param max_uncorrectable: uncorrectable RAS errors a healthy GPU may
        have in its host inventory; None: do not judge them.

    :returns: an :class:`AuditReport` whose findings are sorted by host,
        address and kind.
    """
    asked = frozenset(sides)
    gpus: dict[tuple[str, PciAddress], Gpu] = {}
    for inventory in inventories:
        for item in inventory.gpus:
            gpus[(inventory.hostname, item.address)] = item
    seen: dict[tuple[str, PciAddress], dict[str, SideObservation]] = {}
    for obs in observations:
        seen.setdefault((obs.host, obs.address), {})[obs.side] = obs
    assignments = {a.key: a for a in ledger.assignments}
    findings: list[Finding] = []
    for key in sorted(set(gpus) | set(seen) | set(assignments)):
        host, address = key
        assignment = assignments.get(key)
        gpu = gpus.get(key)
        if gpu is None and key in seen:
            findings.append(Finding(
                host, address, FindingKind.UNKNOWN_GPU,
                'reported by %s but not in the host inventory'
                % ', '.join(sorted(seen[key]))))
        if gpu is not None and assignment is None:
            findings.append(Finding(host, address, FindingKind.NOT_IN_LEDGER,
                                    'GPU has no role in the ledger'))
        if gpu is not None and assignment is not None:
            findings.extend(Finding(host, address,
                                    FindingKind.REALITY_DIFFERS, problem)
                            for problem in reality_problems(gpu, assignment))
            if assignment.role is Role.IDLE:
                findings.append(Finding(host, address, FindingKind.IDLE,
                                        'GPU is idle: stranded capacity'))
        findings.extend(_side_findings(host, address, assignment,
                                       seen.get(key, {}), asked))
        findings.extend(health_findings(host, address, gpu,
                                        seen.get(key, {}),
                                        max_uncorrectable))
    offered = {s: sum(1 for v in seen.values() if s in v and v[s].offered)
               for s in SIDES}
    in_use = {s: sum(1 for v in seen.values() if s in v and v[s].in_use)
              for s in SIDES}
    stranded = sum(1 for f in findings
                   if f.kind in (FindingKind.NOT_OFFERED, FindingKind.IDLE))
    return AuditReport(findings=tuple(sorted(findings)), gpus=len(gpus),
                       offered=offered, in_use=in_use, stranded=stranded)
