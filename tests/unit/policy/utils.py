"""Helpers shared by the policy tests."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from amdgpu_virt import conf as av_conf
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import HostInventory
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import planner as av_planner
from amdgpu_virt.policy import result as av_result
from amdgpu_virt.policy.workload import Workload


def conf(**policy: object):
    """A fresh configuration with ``[policy]`` overrides."""
    c = av_conf.new_conf()
    for name, value in policy.items():
        c.set_override(name, value, group='policy')
    return c


@functools.lru_cache(maxsize=1)
def default_engine() -> av_engine.Engine:
    return av_engine.Engine(conf())


def host(name: str, mode: str = 'spx', model: str = 'MI300X', gpus: int = 8,
         nps: str = 'nps1', gpu_modes: Sequence[str] = ()) -> HostInventory:
    return simulate.design_host(simulate.HostSpec(
        hostname=name, model=model, gpus=gpus, mode=mode, nps=nps,
        gpu_modes=tuple(gpu_modes)))


def plan(hosts: Sequence[HostInventory], workloads: Sequence[Workload],
         c=None, **kwargs) -> av_result.Plan:
    engine = None if c is not None else default_engine()
    c = c if c is not None else conf()
    return av_planner.Planner(c, hosts, engine=engine, **kwargs).plan(
        workloads)


def invariants(plan: av_result.Plan, hosts: Sequence[HostInventory],
               workloads: Sequence[Workload]) -> list[str]:
    """Every broken invariant of ``plan``, recomputed from its decisions."""
    from amdgpu_virt import catalog
    from amdgpu_virt.model import Kind
    from amdgpu_virt.model import Role
    from amdgpu_virt.policy.workload import Platform
    from amdgpu_virt.policy.workload import Tenancy

    problems = []
    gpus = {(h.hostname, str(g.address)): g for h in hosts for g in h.gpus}
    roles = {(a.host, str(a.address)): a for a in plan.ledger.assignments}
    if set(roles) != set(gpus):
        problems.append('ledger does not cover every GPU exactly once')
    by_name = {w.name: w for w in workloads}
    whole: dict[tuple[str, str], str] = {}
    vfs: dict[tuple[str, str, int], str] = {}
    cus: dict[tuple[str, str, int | None], set[int]] = {}
    mem: dict[tuple[str, str, int | None], int] = {}
    for d in plan.decisions:
        w = by_name.get(d.workload)
        if not d.placed:
            if not d.reason:
                problems.append('%s has no reason' % d.workload)
            continue
        if w is not None:
            if d.kind is Kind.CU and w.tenancy is Tenancy.ISOLATED:
                problems.append('isolated %s got cu' % w.name)
            if d.kind is Kind.CU and w.platform is Platform.VM:
                problems.append('VM %s got cu' % w.name)
            if d.kind is Kind.VF and w.platform is Platform.POD:
                problems.append('pod %s got a VF' % w.name)
            if len(d.grants) != w.gpus:
                problems.append('%s asked %d GPUs, got %d grants' % (
                    w.name, w.gpus, len(d.grants)))
            if d.kind is not Kind.VF and len(d.gpus) != w.gpus:
                problems.append('%s shares a GPU with itself' % w.name)
        for g in d.grants:
            key = (d.host, g.address)
            gpu = gpus.get(key)
            role = roles.get(key)
            if gpu is None or role is None:
                problems.append('%s on unknown GPU %s' % (d.workload, key))
                continue
            if d.kind is Kind.DEDICATED:
                if role.role not in (Role.NOVA_DEDICATED,
                                     Role.K8S_DEDICATED):
                    problems.append('%s dedicated on %s' % (d.workload,
                                                            role.role))
                if key in whole:
                    problems.append('%s and %s share a dedicated GPU' % (
                        whole[key], d.workload))
                whole[key] = d.workload
            elif d.kind is Kind.VF:
                if role.role is not Role.NOVA_VF:
                    problems.append('%s VF on %s' % (d.workload, role.role))
                    continue
                catalog.check_vf_count(gpu.model, role.vf_count)
                if not 0 <= g.vf_index < role.vf_count:
                    problems.append('VF index %s out of range' % g.vf_index)
                vkey = (d.host, g.address, g.vf_index)
                if vkey in vfs:
                    problems.append('VF %s given twice' % (vkey,))
                vfs[vkey] = d.workload
                vf_cus, vf_mib = catalog.vf_size(gpu.model, role.vf_count)
                if g.memory_mib > vf_mib or g.compute_units > vf_cus:
                    problems.append('%s larger than its VF' % d.workload)
            else:
                if role.role is not Role.K8S_SHARED:
                    problems.append('%s cu on %s' % (d.workload, role.role))
                    continue
                pkey = (d.host, g.address, g.partition)
                if g.partition is not None and (
                        role.compute_mode != gpu.compute_partition):
                    count = catalog.partitions_in_mode(gpu.model,
                                                       role.compute_mode)
                    catalog.check_modes(gpu.model, role.compute_mode,
                                        gpu.memory_partition)
                    size = gpu.compute_units // count
                    vram = gpu.vram_mib // count
                elif g.partition is not None:
                    part = gpu.partitions[g.partition]
                    size, vram = part.compute_units, part.vram_mib
                else:
                    size = gpu.compute_units or gpu.model.compute_units
                    vram = gpu.vram_mib or gpu.model.vram_mib
                taken = cus.setdefault(pkey, set())
                if taken & set(g.cus):
                    problems.append('CUs of %s overlap' % (pkey,))
                taken.update(g.cus)
                if max(g.cus) >= size:
                    problems.append('CU beyond %d on %s' % (size, pkey))
                mem[pkey] = mem.get(pkey, 0) + g.memory_mib
                if mem[pkey] > vram:
                    problems.append('memory over-committed on %s' % (pkey,))
    for key, item in roles.items():
        if item.role is Role.NOVA_VF and gpus[key].model.vf_device_id is None:
            problems.append('%s without SR-IOV is nova-vf' % (key,))
    return problems
