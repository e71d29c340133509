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
    reports = []
    for gs in state.gpus:
        role = gs.role or Role.IDLE
        held = users.get(gs.host.name, {}).get(gs.address, [])
        demand = 0.0
        for d in held:
            for g in d.grants:
                if g.address == gs.address:
                    demand += max(g.compute_units / (gs.cus or 1),
                                  g.memory_mib / (gs.vram or 1))
        demand = min(1.0, demand)
        if role is Role.NOVA_VF:
            vf_count = gs.vf_count or 0
            mode = '%d VF%s (%s)' % (vf_count, 's' * (vf_count != 1),
                                     catalog.VF_COUNT_MODES.get(
                                         vf_count, '?'))
            granted = len(gs.vf_owners) / max(1, vf_count)
        elif role is Role.K8S_SHARED:
            mode = '/'.join(x for x in (gs.compute_mode, gs.memory_mode)
                            if x) or 'shared'
            granted = max(
                sum(p.alloc.used_count for p in gs.pools) / (gs.cus or 1),
                sum(p.mem_total - p.mem_free for p in gs.pools)
                / (gs.vram or 1))
        elif role is Role.NOVA_DEDICATED:
            mode = 'vfio-pci'
            granted = 1.0 if gs.owner else 0.0
        elif role is Role.K8S_DEDICATED:
            mode = '/'.join(x for x in (gs.compute_mode, gs.memory_mode)
                            if x) or 'amdgpu'
            granted = 1.0 if gs.owner else 0.0
        else:
            mode = '-'
            granted = 0.0
        cu_owners = []
        for pool in gs.pools:
            alloc = pool.alloc
            for owner, mask in alloc.owner_masks():
                for start, length in cu_allocator.runs(mask):
                    cu_owners.append((owner, pool.partition, start,
                                      length))
        reports.append(GpuReport(
            host=gs.host.name, address=gs.address, model=gs.model.name,
            role=role, mode=mode,
            used_by=tuple(sorted({d.workload for d in held})),
            cus=gs.cus, vram_mib=gs.vram, demand=demand,
            granted=min(1.0, granted),
            vf_owners=tuple(gs.vf_owners.get(i)
                            for i in range(gs.vf_count or 0))
            if role is Role.NOVA_VF else (),
            cu_owners=tuple(cu_owners),
            partitions=tuple((p.partition, p.alloc.total)
                             for p in gs.pools),
            unverified=gs.unverified, fixed=gs.fixed))
    return tuple(reports)
