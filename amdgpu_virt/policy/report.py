"""The plan's results: the ledger of GPU roles and a report per GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from amdgpu_virt import catalog
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import Role
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.result import GpuReport
from amdgpu_virt.sharing import allocator as cu_allocator

if TYPE_CHECKING:
    from amdgpu_virt.policy.fleetstate import FleetState


def ledger_of(state: FleetState) -> av_ledger.Ledger:
    """The roles of every GPU as a ledger (``idle`` for those without)."""
    items = []
    for gs in state.gpus:
        role = gs.role or Role.IDLE
        compute = memory = None
        if role in (Role.K8S_SHARED, Role.K8S_DEDICATED) and \
                gs.model.partition_modes:
            compute = gs.compute_mode
            memory = gs.memory_mode
        items.append(av_ledger.GpuAssignment(
            host=gs.host.name, address=gs.gpu.address, role=role,
            model=gs.model.name,
            vf_count=gs.vf_count if role is Role.NOVA_VF else None,
            compute_mode=compute, memory_mode=memory))
    return av_ledger.build(items)

def gpu_reports(state: FleetState, decisions: Sequence[Decision]
                ) -> tuple[GpuReport, ...]:
    """One report per GPU: its role, mode, users and how much is used."""
    # per host, then per GPU address (no key tuple per GPU)
    users: dict[str, dict[str, list[Decision]]] = {}
    for d in decisions:
        if d.placed:
            on_host = users.setdefault(d.host or '', {})
            grants = d.grants
            for address in (grants[0].address,) if len(grants) == 1 \
                    else d.gpus:
                on_host.setdefault(address, []).append(d)
    nobody: list[Decision] = []
    #: the mode's text per (role, VF count, compute mode, memory mode)
    modes: dict[tuple[object, ...], str] = {}
    reports = []
    for gs in state.gpus:
        role = gs.role or Role.IDLE
        address = gs.address
        placed_here = users.get(gs.host.name)
        held = placed_here.get(address, nobody) if placed_here else nobody
        cus = gs.cus or 1
        vram = gs.vram or 1
        demand = 0.0
        for d in held:
            for g in d.grants:
                if g.address == address:
                    demand += max(g.compute_units / cus, g.memory_mib / vram)
        if demand > 1.0:
            demand = 1.0
        mode_key = (role, gs.vf_count, gs.compute_mode, gs.memory_mode)
        mode = modes.get(mode_key)
        if mode is None:
            mode = modes[mode_key] = _mode(role, gs.vf_count or 0,
                                           gs.compute_mode, gs.memory_mode)
        vf_owners: tuple[str | None, ...] = ()
        if role is Role.NOVA_VF:
            vf_count = gs.vf_count or 0
            granted = len(gs.vf_owners) / max(1, vf_count)
            vf_owners = tuple(map(gs.vf_owners.get, range(vf_count)))
        elif role is Role.K8S_SHARED:
            granted = max(
                sum(p.alloc.used_count for p in gs.pools) / cus,
                sum(p.mem_total - p.mem_free for p in gs.pools) / vram)
        elif role is Role.NOVA_DEDICATED or role is Role.K8S_DEDICATED:
            granted = 1.0 if gs.owner else 0.0
        else:
            granted = 0.0
        cu_owners = []
        for pool in gs.pools:
            for owner, mask in pool.alloc.owner_masks():
                for start, length in cu_allocator.runs(mask):
                    cu_owners.append((owner, pool.partition, start,
                                      length))
        if not held:
            used_by: tuple[str, ...] = ()
        elif len(held) == 1:
            used_by = (held[0].workload,)
        else:
            used_by = tuple(sorted({d.workload for d in held}))
        # positional: the keywords cost a third more, once per GPU
        reports.append(GpuReport(
            gs.host.name, address, gs.model.name, role, mode, used_by,
            gs.cus, gs.vram, demand, min(1.0, granted), vf_owners,
            tuple(cu_owners),
            tuple((p.partition, p.alloc.total) for p in gs.pools)
            if gs.pools else (), gs.unverified, gs.fixed))
    return tuple(reports)


def _mode(role: Role, vf_count: int, compute_mode: str | None,
          memory_mode: str | None) -> str:
    """The text of a GPU's mode in its report."""
    if role is Role.NOVA_VF:
        return '%d VF%s (%s)' % (vf_count, 's' * (vf_count != 1),
                                 catalog.VF_COUNT_MODES.get(vf_count, '?'))
    if role is Role.K8S_SHARED or role is Role.K8S_DEDICATED:
        return '/'.join(x for x in (compute_mode, memory_mode) if x) or (
            'shared' if role is Role.K8S_SHARED else 'amdgpu')
    if role is Role.NOVA_DEDICATED:
        return 'vfio-pci'
    return '-'
