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

Constraints kept: one role per GPU; VF counts the catalog allows for the
model; one driver family per host (GIM: ``nova-vf``, ``nova-dedicated``
by vfio-pci, ``idle``; amdgpu: ``k8s-shared``, ``k8s-dedicated``,
``nova-dedicated``, ``idle``) unless ``[policy] allow_mixed_host_drivers``
(then marked unverified); a host's memory (NPS) and compute partition mode
as the inventory found it (a CU slice never spans two partitions); roles
in a given ledger and running placements never change (incremental mode).

The capacity bound relaxes the problem to capacity alone: each feasible
workload costs at least its smallest footprint in GPUs (whole GPUs, a VF's
share ``1 / vf_count``, or its CU/memory share) over the kinds and GPU
classes it may use; no plan places more workloads than the most such
footprints that fit in the fleet's free GPUs, nor more priority than their
fractional knapsack. It ignores host boundaries, partitions, slice limits
and fragmentation, so the distance between the plan and the bound is at
most what packing costs.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

from oslo_config import cfg

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import base
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.result import Bound
from amdgpu_virt.policy.result import GpuReport
from amdgpu_virt.policy.result import Plan
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.policy.decision import UNVERIFIED
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Workload
from amdgpu_virt.sharing import allocator as cu_allocator

LOG = logging.getLogger(__name__)
_REFERENCE_MODEL = catalog.by_name('MI300X')
#: shared hosts examined per multi-GPU CU request (round robin), which
#: bounds the work per request on large fleets
MULTI_GPU_SCAN = 32


@dataclasses.dataclass
class _Choice:
    kind: Kind
    role: Role
    host: st.HostState
    #: one entry per grant (a GPU appears once per VF it gives)
    gpus: tuple[st.GpuState, ...]
    pools: tuple[st.Pool | None, ...]
    convert: tuple[st.GpuState, ...]
    unverified: bool
    view: base.Candidate
    vf_count: int | None = None


class Planner:
    """Plans a fleet; one instance per plan.

    :param conf: configuration (``[policy]``, ``[sharing]``).
    :param hosts: host inventories.
    :param ledger: roles already decided (incremental mode); they stay.
    :param existing: running placements (incremental mode); they stay.
    :raises PlanError: the ledger or a placement does not match the fleet.
    :raises DriverNotFound: a configured plugin is unknown.
    """

    def __init__(self, conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
                 ledger: av_ledger.Ledger | None = None,
                 existing: Sequence[Decision] = (),
                 engine: av_engine.Engine | None = None) -> None:
        self.conf = conf
        self.engine = engine or av_engine.Engine(conf)
        self.strategy = self.engine.cu_strategy
        self.allow_mixed = bool(conf.policy.allow_mixed_host_drivers)
        self.max_slices = int(conf.policy.max_slices_per_gpu)
        self.hosts: dict[str, st.HostState] = {}
        self.gpus: list[st.GpuState] = []
        self.free = st.FreeIndex()
        self.vf_index: dict[tuple[str, int], st.BucketIndex] = {}
        self.vf_hosts: dict[tuple[str, int], st.BucketIndex] = {}
        self.cu_index: dict[str, st.BucketIndex] = {}
        self.shared_hosts: dict[str, dict[str, list[st.GpuState]]] = {}
        self.ready: dict[tuple[str, Role], dict[str, list[st.GpuState]]] = {}
        self._failed: set[Any] = set()
        self._never: dict[Any, list[Verdict]] = {}
        order = 0
        for inv in hosts:
            if inv.hostname in self.hosts:
                raise exception.PlanError(
                    source='fleet', reason='host %s is listed twice'
                    % inv.hostname)
            host = st.HostState(inv)
            self.hosts[host.name] = host
            for gpu in inv.gpus:
                gs = st.GpuState(host, gpu, order)
                order += 1
                host.gpus.append(gs)
                self.gpus.append(gs)
        self.existing: list[Decision] = []
        if ledger is not None:
            self._load_ledger(ledger)
        for gs in self.gpus:
            if gs.role is None:
                self.free.add(gs)
        for decision in existing:
            self._claim(decision)
        self.models = sorted({g.model for g in self.gpus},
                             key=lambda m: m.name)
        # VF layouts that exist or may be made in this fleet, per model:
        # a model none of whose GPUs can run GIM here offers no VF
        vf_counts: dict[str, list[int]] = {m.name: [] for m in self.models}
        for gs in self.gpus:
            count = None
            if gs.role is Role.NOVA_VF:
                count = gs.vf_count
            elif gs.role is None and self._role_ok(gs, Role.NOVA_VF)[0]:
                count = self._vf_count_on(gs)
            if count is not None and count not in vf_counts[gs.model.name]:
                vf_counts[gs.model.name].append(count)
        self.options = self.engine.options(self.models, {
            k: sorted(v) for k, v in vf_counts.items()})
        self.structure = self._structure()

    # -- roles and families -----------------------------------------------

    def _vf_count_on(self, gs: st.GpuState) -> int | None:
        """VFs per GPU ``gs`` would get as ``nova-vf``."""
        model = gs.model
        if model.vf_device_id is None or not model.vf_counts:
            return None
        current = gs.gpu.sriov_numvfs
        if gs.native_family == st.GIM and current in model.vf_counts:
            return current
        return self.engine.vf_count_for(model)

    def _role_ok(self, gs: st.GpuState, role: Role) -> tuple[bool, bool]:
        """(allowed, unverified) for giving ``gs`` the ``role``."""
        if role is Role.NOVA_VF and self._vf_count_on(gs) is None:
            return False, False
        family = st.ROLE_FAMILY.get(role)
        if family is None:
            return True, False
        families = gs.host.families
        if not families or families == {family}:
            return True, False
        if len(families) > 1 and gs.native_family == family:
            return True, True
        if self.allow_mixed:
            return True, True
        return False, False

    def _assign(self, gs: st.GpuState, role: Role, unverified: bool,
                vf_count: int | None = None,
                share_mode: str | None = None) -> None:
        if gs.role is None and not gs.fixed:
            self.free.remove(gs)
        gs.role = role
        gs.unverified = gs.unverified or unverified
        family = st.ROLE_FAMILY.get(role)
        if family and family not in gs.host.families:
            gs.host.families.add(family)
            self.free.rekey(gs.host)
        model = gs.model.name
        if role is Role.NOVA_VF:
            gs.vf_count = vf_count or self._vf_count_on(gs)
            gs.vf_free = list(range(gs.vf_count or 0))
            self._vf_update(gs)
        elif role is Role.K8S_SHARED:
            gs.make_pools(self.strategy, share_mode or gs.compute_mode)
            for pool in gs.pools:
                self._cu_update(pool)
            self.shared_hosts.setdefault(model, {}).setdefault(
                gs.host.name, []).append(gs)
        elif role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED) and gs.fixed:
            self.ready.setdefault((model, role), {}).setdefault(
                gs.host.name, []).append(gs)

    def _cu_update(self, pool: st.Pool) -> None:
        """Re-index ``pool`` (and its GPU's other pools at the slice cap).

        Pools are bucketed by their balanced free capacity: the smaller of
        free CUs and free memory counted in CUs, so that a scan from a
        request's own balanced size finds pools that fit both.
        """
        gs = pool.gpu
        index = self.cu_index.setdefault(gs.model.name, st.BucketIndex())
        for each in gs.pools:
            value = 0
            if gs.slices < self.max_slices:
                value = min(each.alloc.free_count,
                            self._mem_as_cus(gs.model, each.mem_free))
            index.put(each, value)

    @staticmethod
    def _mem_as_cus(model: GpuModel, mib: int) -> int:
        # rounded up: the index is a hint, fits() decides; rounding down
        # would hide a device a few MiB short of the nominal split
        return -(-mib * (model.compute_units or 1) // (model.vram_mib or 1))

    def _vf_update(self, gs: st.GpuState) -> None:
        key = (gs.model.name, gs.vf_count or 0)
        self.vf_index.setdefault(key, st.BucketIndex()).put(
            gs, len(gs.vf_free))
        total = sum(len(g.vf_free) for g in gs.host.gpus
                    if g.role is Role.NOVA_VF and g.vf_count == gs.vf_count)
        self.vf_hosts.setdefault(key, st.BucketIndex()).put(gs.host.name,
                                                            total)

    # -- incremental mode -------------------------------------------------

    def _gpu(self, host: str, address: str, where: str) -> st.GpuState:
        hs = self.hosts.get(host)
        if hs is None:
            raise exception.PlanError(source=where,
                                      reason='host %s is not in the fleet'
                                      % host)
        for gs in hs.gpus:
            if gs.address == address:
                return gs
        raise exception.PlanError(source=where, reason='host %s has no GPU '
                                  'at %s' % (host, address))

    def _load_ledger(self, ledger: av_ledger.Ledger) -> None:
        for item in ledger.assignments:
            where = 'ledger: hosts.%s (%s)' % (item.host, item.address)
            gs = self._gpu(item.host, str(item.address), where)
            if item.model != gs.model.name:
                raise exception.PlanError(
                    source=where, reason='model %s, but the inventory has a '
                    '%s there' % (item.model, gs.model.name))
            if item.role is Role.NOVA_VF:
                try:
                    catalog.check_vf_count(gs.model, item.vf_count or 0)
                except exception.InvalidPartitionMode as err:
                    raise exception.PlanError(source=where,
                                              reason=str(err)) from None
            ok, unverified = self._role_ok(gs, item.role)
            if not ok:
                raise exception.PlanError(
                    source=where, reason='role %s needs the %s driver, but '
                    'host %s runs %s ([policy] allow_mixed_host_drivers is '
                    'off)' % (item.role.value, st.ROLE_FAMILY[item.role],
                              item.host, ', '.join(sorted(gs.host.families))))
            gs.fixed = True
            if item.compute_mode:
                gs.compute_mode = item.compute_mode
            if item.memory_mode:
                gs.memory_mode = item.memory_mode
            self._assign(gs, item.role, unverified, item.vf_count)

    def _claim(self, decision: Decision) -> None:
        where = 'placements: %s' % decision.workload
        if decision.kind is None or decision.host is None:
            raise exception.PlanError(source=where,
                                      reason='kind and host are required')
        for grant in decision.grants:
            gs = self._gpu(decision.host, grant.address, where)
            needed = {Kind.VF: (Role.NOVA_VF,), Kind.CU: (Role.K8S_SHARED,),
                      Kind.DEDICATED: (Role.NOVA_DEDICATED,
                                       Role.K8S_DEDICATED)}[decision.kind]
            if gs.role not in needed:
                raise exception.PlanError(
                    source=where, reason='GPU %s of %s has role %s in the '
                    'ledger, but a %s placement needs %s' % (
                        gs.address, gs.host.name,
                        gs.role.value if gs.role else 'none',
                        decision.kind.value,
                        ' or '.join(r.value for r in needed)))
            if decision.kind is Kind.DEDICATED:
                if gs.owner is not None:
                    raise exception.PlanError(
                        source=where, reason='GPU %s of %s is already held '
                        'by %s' % (gs.address, gs.host.name, gs.owner))
                gs.owner = decision.workload
                self._unready(gs)
            elif decision.kind is Kind.VF:
                if grant.vf_index not in gs.vf_free:
                    raise exception.PlanError(
                        source=where, reason='VF %s of GPU %s of %s is not '
                        'free (owner %s)' % (
                            grant.vf_index, gs.address, gs.host.name,
                            gs.vf_owners.get(grant.vf_index or 0)))
                gs.vf_free.remove(grant.vf_index)
                gs.vf_owners[grant.vf_index] = decision.workload
                self._vf_update(gs)
            else:
                pool = next((p for p in gs.pools
                             if p.partition == grant.partition), None)
                if pool is None or grant.cus is None:
                    raise exception.PlanError(
                        source=where, reason='GPU %s of %s has no partition '
                        '%s, or the grant lists no CUs' % (
                            gs.address, gs.host.name, grant.partition))
                try:
                    pool.alloc.claim(decision.workload, grant.cus)
                except exception.SharingError as err:
                    raise exception.PlanError(source=where,
                                              reason=str(err)) from None
                pool.mem_free -= grant.memory_mib
                gs.slices += 1
                self._cu_update(pool)
        self.existing.append(dataclasses.replace(decision, existing=True,
                                                 code=Code.PLACED))

    def _unready(self, gs: st.GpuState) -> None:
        hosts = self.ready.get((gs.model.name, gs.role))  # type: ignore
        if hosts and gs in hosts.get(gs.host.name, []):
            hosts[gs.host.name].remove(gs)
            if not hosts[gs.host.name]:
                del hosts[gs.host.name]

    # -- candidates -------------------------------------------------------

    def _keys(self, role: Role) -> list[str]:
        family = st.ROLE_FAMILY.get(role)
        if family is None:
            return ['none', st.GIM, st.AMDGPU, 'mixed']
        other = st.AMDGPU if family == st.GIM else st.GIM
        keys = [family, 'none', 'mixed']
        if self.allow_mixed:
            keys.append(other)
        return keys

    def _select(self, w: Workload, kind: Kind, role: Role,
                gpus: Iterable[st.GpuState], n: int,
                extra: Any = None) -> tuple[tuple[st.GpuState, ...], bool
                                            ] | None:
        """``n`` GPUs of one host for ``role``, NUMA-local if possible."""
        eligible = []
        unverified = False
        for gs in gpus:
            if gs.role is None:
                ok, unv = self._role_ok(gs, role)
                if not ok:
                    continue
            else:
                unv = gs.unverified
            if self.engine.checks_gpus and self.engine.gpu_refusal(
                    w, kind, gs.gpu) is not None:
                continue
            if extra is not None and not extra(gs):
                continue
            eligible.append((gs, unv))
        if len(eligible) < n:
            return None
        if n > 1:
            groups: dict[int | None, list[tuple[st.GpuState, bool]]] = {}
            for item in eligible:
                groups.setdefault(item[0].gpu.numa_node, []).append(item)
            local = [g for g in groups.values() if len(g) >= n]
            if local:
                eligible = local[0]
            elif w.same_numa:
                return None
        chosen = eligible[:n]
        unverified = any(u for _g, u in chosen)
        return tuple(g for g, _u in chosen), unverified

    def _view(self, kind: Kind, model: GpuModel, host: st.HostState,
              gpus: Sequence[st.GpuState], unit: tuple[int, int],
              in_role: int, unverified: bool) -> base.Candidate:
        return base.Candidate(
            kind=kind, model=model, host=host.name,
            addresses=tuple(g.address for g in gpus),
            numa_nodes=tuple(g.gpu.numa_node for g in gpus),
            unit_cus=unit[0], unit_mib=unit[1], in_role=in_role,
            unverified=unverified)

    def _new_gpus(self, w: Workload, kind: Kind, role: Role,
                  model: GpuModel, n: int, extra: Any = None
                  ) -> tuple[st.HostState, tuple[st.GpuState, ...], bool
                             ] | None:
        for key in self._keys(role):
            for host, lst in self.free.hosts_with(model.name, key, n):
                found = self._select(w, kind, role, lst, n, extra)
                if found is not None:
                    return host, found[0], found[1]
        return None

    def _dedicated(self, w: Workload, option: base.Option
                   ) -> list[_Choice]:
        model = option.model
        roles = {Platform.VM: [Role.NOVA_DEDICATED],
                 Platform.POD: [Role.K8S_DEDICATED],
                 Platform.ANY: [Role.K8S_DEDICATED, Role.NOVA_DEDICATED]
                 }[w.platform]
        unit = (model.compute_units or 0, model.vram_mib or 0)
        result = []
        for role in roles:
            for hostname, lst in self.ready.get((model.name, role),
                                                {}).items():
                found = self._select(w, Kind.DEDICATED, role, lst, w.gpus)
                if found is not None:
                    host = self.hosts[hostname]
                    result.append(_Choice(
                        Kind.DEDICATED, role, host, found[0],
                        (None,) * w.gpus, (), found[1], self._view(
                            Kind.DEDICATED, model, host, found[0], unit,
                            w.gpus, found[1])))
                    break
            new = self._new_gpus(w, Kind.DEDICATED, role, model, w.gpus)
            if new is not None:
                host, gpus, unv = new
                result.append(_Choice(
                    Kind.DEDICATED, role, host, gpus, (None,) * w.gpus, gpus,
                    unv, self._view(Kind.DEDICATED, model, host, gpus, unit,
                                    0, unv)))
        return result

    def _vf(self, w: Workload, option: base.Option) -> list[_Choice]:
        model = option.model
        count = option.vf_count or 1
        cus, mib = catalog.vf_size(model, count)
        unit = (cus or 0, mib or 0)
        key = (model.name, count)
        result = []
        n = w.gpus
        if n == 1:
            index = self.vf_index.get(key)
            for item in index.at_least(1) if index else ():
                gs: st.GpuState = item  # type: ignore[assignment]
                found = self._select(w, Kind.VF, Role.NOVA_VF, [gs], 1)
                if found is not None:
                    result.append(_Choice(
                        Kind.VF, Role.NOVA_VF, gs.host, (gs,), (None,), (),
                        found[1], self._view(Kind.VF, model, gs.host, (gs,),
                                             unit, 1, found[1]), count))
                    break
        else:
            hosts = self.vf_hosts.get(key)
            for hostname in hosts.at_least(n) if hosts else ():
                host = self.hosts[hostname]  # type: ignore[index]
                vf_gpus = [g for g in host.gpus if g.role is Role.NOVA_VF
                           and g.vf_count == count and g.vf_free]
                picked = self._spread_vfs(w, vf_gpus, n)
                if picked is not None:
                    unv = any(g.unverified for g in picked)
                    result.append(_Choice(
                        Kind.VF, Role.NOVA_VF, host, picked, (None,) * n, (),
                        unv, self._view(Kind.VF, model, host, picked, unit,
                                        len(set(picked)), unv), count))
                    break
        if n == 1 and result:
            return result  # an in-role GPU outscores converting another
        needed = math.ceil(n / count)
        new = self._new_gpus(w, Kind.VF, Role.NOVA_VF, model, needed,
                             lambda g: self._vf_count_on(g) == count)
        if new is not None:
            host, fresh, unv = new
            spread = tuple(fresh[i // count] for i in range(n))
            result.append(_Choice(
                Kind.VF, Role.NOVA_VF, host, spread, (None,) * n, fresh, unv,
                self._view(Kind.VF, model, host, spread, unit, 0, unv),
                count))
        return result

    def _spread_vfs(self, w: Workload, gpus: Sequence[st.GpuState],
                    n: int) -> tuple[st.GpuState, ...] | None:
        picked: list[st.GpuState] = []
        for gs in gpus:
            if self.engine.checks_gpus and self.engine.gpu_refusal(
                    w, Kind.VF, gs.gpu) is not None:
                continue
            take = min(len(gs.vf_free), n - len(picked))
            picked.extend([gs] * take)
            if len(picked) == n:
                return tuple(picked)
        return None

    def _pool_for(self, gs: st.GpuState, cus: int, mib: int
                  ) -> st.Pool | None:
        if gs.slices >= self.max_slices:
            return None
        best = None
        for pool in gs.pools:
            if pool.fits(cus, mib) and (
                    best is None
                    or pool.alloc.free_count < best.alloc.free_count):
                best = pool
        return best

    @staticmethod
    def _share_mode(gs: st.GpuState, cus: int, mib: int
                    ) -> tuple[bool, str | None]:
        """(fits, compute mode) for turning ``gs`` into ``k8s-shared``.

        The current layout if one of its devices fits the slice, else the
        layout with the most (so the smallest) devices that fit.
        """
        layouts = gs.layouts()
        fitting = [(mode, sizes) for mode, sizes in layouts
                   if any(c >= cus and m >= mib for c, m in sizes)]
        if not fitting:
            return False, None
        if fitting[0] is layouts[0] or fitting[0][0] == layouts[0][0]:
            return True, layouts[0][0]
        best = max(fitting, key=lambda item: len(item[1]))
        return True, best[0]

    def _could_share(self, gs: st.GpuState, cus: int, mib: int) -> bool:
        """Would ``gs``, turned into ``k8s-shared``, fit the slice?"""
        return self._share_mode(gs, cus, mib)[0]

    def _cu(self, w: Workload, option: base.Option) -> list[_Choice]:
        model = option.model
        cus = w.cus_on(model)
        mib = w.memory_on(model)
        unit = (cus, mib)
        result = []
        n = w.gpus
        if n == 1:
            index = self.cu_index.get(model.name)
            need = max(cus, -(-mib * (model.compute_units or 1)
                              // (model.vram_mib or 1)))
            for item in index.at_least(need) if index else ():
                pool: st.Pool = item  # type: ignore[assignment]
                if not pool.fits(cus, mib):
                    continue
                found = self._select(w, Kind.CU, Role.K8S_SHARED,
                                     [pool.gpu], 1)
                if found is not None:
                    gs = pool.gpu
                    result.append(_Choice(
                        Kind.CU, Role.K8S_SHARED, gs.host, (gs,), (pool,),
                        (), found[1], self._view(Kind.CU, model, gs.host,
                                                 (gs,), unit, 1, found[1])))
                    break
        else:
            hosts = self.shared_hosts.get(model.name, {})
            for hostname in list(itertools.islice(hosts, MULTI_GPU_SCAN)):
                shared = hosts[hostname]
                host = self.hosts[hostname]
                ready = [g for g in shared if self._pool_for(g, cus, mib)]
                if not ready:
                    # look at the others first next time (round robin)
                    hosts[hostname] = hosts.pop(hostname)
                    continue
                spare = [g for g in host.gpus if g.role is None
                         and self._could_share(g, cus, mib)]
                found = self._select(w, Kind.CU, Role.K8S_SHARED,
                                     ready + spare, n)
                if found is None:
                    hosts[hostname] = hosts.pop(hostname)
                    continue
                gpus, unv = found
                convert = tuple(g for g in gpus if g.role is None)
                pools = tuple(None if g.role is None
                              else self._pool_for(g, cus, mib) for g in gpus)
                result.append(_Choice(
                    Kind.CU, Role.K8S_SHARED, host, gpus, pools, convert,
                    unv, self._view(Kind.CU, model, host, gpus, unit,
                                    n - len(convert), unv)))
                break
        if n == 1 and result:
            return result  # an in-role GPU outscores converting another
        new = self._new_gpus(w, Kind.CU, Role.K8S_SHARED, model, n,
                             lambda g: self._could_share(g, cus, mib))
        if new is not None:
            host, gpus, unv = new
            result.append(_Choice(
                Kind.CU, Role.K8S_SHARED, host, gpus, (None,) * n, gpus, unv,
                self._view(Kind.CU, model, host, gpus, unit, 0, unv)))
        return result

    def _candidates(self, w: Workload, option: base.Option
                    ) -> list[_Choice]:
        key = (w.shape(), option)
        if key in self._failed:
            return []
        if option.kind is Kind.DEDICATED:
            found = self._dedicated(w, option)
        elif option.kind is Kind.VF:
            found = self._vf(w, option)
        else:
            found = self._cu(w, option)
        if not found:
            # capacity only shrinks while planning: this shape stays out
            self._failed.add(key)
        return found

    # -- commit -----------------------------------------------------------

    def _commit(self, w: Workload, choice: _Choice) -> tuple[Grant, ...
                                                              ] | None:
        model = choice.view.model
        cus = w.cus_on(model)
        mib = w.memory_on(model)
        for gs in choice.convert:
            ok, unv = self._role_ok(gs, choice.role)
            mode = (self._share_mode(gs, cus, mib)[1]
                    if choice.role is Role.K8S_SHARED else None)
            self._assign(gs, choice.role, unv, choice.vf_count, mode)
        grants: list[Grant] = []
        if choice.kind is Kind.DEDICATED:
            for gs in choice.gpus:
                gs.owner = w.name
                self._unready(gs)
                grants.append(Grant(gs.address, mib, cus))
        elif choice.kind is Kind.VF:
            for gs in choice.gpus:
                index = gs.vf_free.pop(0)
                gs.vf_owners[index] = w.name
                grants.append(Grant(gs.address, mib, cus, vf_index=index))
            for gs in set(choice.gpus):
                self._vf_update(gs)
        else:
            done: list[st.Pool] = []
            for gs, pool in zip(choice.gpus, choice.pools, strict=True):
                pool = pool or self._pool_for(gs, cus, mib)
                try:
                    if pool is None:
                        raise exception.InsufficientCapacity(
                            gpu=gs.address, requested=cus, unit='CUs',
                            owner=w.name, free=0, capacity=gs.cus)
                    taken = pool.alloc.allocate(w.name, cus)
                except exception.SharingError:
                    for other in done:
                        other.alloc.release(w.name)
                        other.mem_free += mib
                        other.gpu.slices -= 1
                        self._cu_update(other)
                    return None
                pool.mem_free -= mib
                gs.slices += 1
                self._cu_update(pool)
                done.append(pool)
                grants.append(Grant(gs.address, mib, cus, cus=taken,
                                    partition=pool.partition))
        return tuple(grants)

    # -- the plan ---------------------------------------------------------

    @staticmethod
    def order(workloads: Iterable[Workload]) -> list[Workload]:
        """Priority first, then the hardest to place."""
        return sorted(workloads, key=lambda w: (
            -w.priority, not (w.p2p and w.gpus > 1), -w.gpus,
            -w.fraction_on(_REFERENCE_MODEL), w.name))

    def place(self, w: Workload) -> Decision:
        """Decide and commit one workload."""
        if not self.gpus:
            return Decision(w.name, Code.NEVER, 'the fleet has no GPUs')
        judgement = self.engine.judge(w, self.options)
        trail = list(judgement.trail)
        if not judgement.allowed:
            return Decision(
                w.name, Code.NEVER, 'no kind is allowed on any GPU model '
                'of the fleet: %s' % _first_refusals(judgement.trail),
                trail=tuple(trail))
        choices: list[_Choice] = []
        for option in judgement.allowed:
            choices.extend(self._candidates(w, option))
        while choices:
            ranked = self.engine.rank(w, [c.view for c in choices])
            best = ranked[0]
            choice = choices[[c.view for c in choices].index(
                best.candidate)]
            free = self._free_text(w, choice)
            grants = self._commit(w, choice)
            for scored in ranked:
                trail.append(Verdict(
                    'weighers', scored.candidate.kind, True,
                    '%s on %s %s (%s): score %s' % (
                        scored.candidate.kind.value, scored.candidate.host,
                        ','.join(scored.candidate.addresses),
                        'in role' if scored.candidate.in_role ==
                        len(scored.candidate.addresses) else 'converting',
                        scored.explain()), scored.candidate.model.name))
            if grants is None:
                choices.remove(choice)
                continue
            reason = '%s on %s: %s' % (
                choice.kind.value, choice.host.name, ', '.join(
                    '%s %s' % (g.address, g.describe()) for g in grants))
            if choice.unverified:
                reason += ' (%s: mixed host drivers)' % UNVERIFIED
            trail.append(Verdict('capacity', choice.kind, True, free,
                                 choice.view.model.name))
            trail.append(Verdict('planner', choice.kind, True,
                                 'placed ' + reason,
                                 choice.view.model.name))
            return Decision(w.name, Code.PLACED,
                            _short(w, choice, judgement),
                            choice.kind, choice.host.name, grants,
                            tuple(trail), best.score, choice.unverified)
        never = self._never_reasons(w, judgement)
        trail.extend(never[1])
        if never[0]:
            return Decision(w.name, Code.NEVER, '; '.join(
                v.message for v in never[1]), trail=tuple(trail))
        capacity = [self._capacity_verdict(w, o) for o in judgement.allowed]
        trail.extend(capacity)
        return Decision(
            w.name, Code.UNSCHEDULABLE, 'allowed %s, but nothing is free '
            'now: %s' % ('/'.join(k.value for k in judgement.kinds()),
                         capacity[0].message), trail=tuple(trail))

    def _free_text(self, w: Workload, choice: _Choice) -> str:
        """What was free where the workload goes, before it went there."""
        model = choice.view.model
        parts = []
        seen: set[int] = set()
        for gs, pool in zip(choice.gpus, choice.pools, strict=True):
            if id(gs) in seen:
                continue
            seen.add(id(gs))
            if gs in choice.convert:
                parts.append('%s: unassigned, becomes %s' % (
                    gs.address, choice.role.value))
            elif choice.kind is Kind.VF:
                parts.append('%s: %d of %d VFs free' % (
                    gs.address, len(gs.vf_free), gs.vf_count or 0))
            elif choice.kind is Kind.CU and pool is not None:
                parts.append('%s%s: %d of %d CUs and %d of %d MiB free' % (
                    gs.address, '' if pool.partition is None
                    else ' part %d' % pool.partition,
                    pool.alloc.free_count, pool.alloc.total, pool.mem_free,
                    pool.mem_total))
            else:
                parts.append('%s: free %s GPU' % (gs.address,
                                                  choice.role.value))
        return 'requested %d x (%d CUs, %d MiB) on %s; %s' % (
            w.gpus, w.cus_on(model), w.memory_on(model), choice.host.name,
            '; '.join(parts))

    def plan(self, workloads: Sequence[Workload],
             invalid: Sequence[tuple[str, exception.WorkloadSpecError]] = ()
             ) -> Plan:
        """Place ``workloads`` (new ones; running ones came in ``existing``).

        :param invalid: specifications that failed validation, reported
            with code ``invalid`` and every problem in the trail.
        :raises PlanError: a workload name is used twice or is running.
        """
        names = {d.workload for d in self.existing}
        for w in workloads:
            if w.name in names:
                raise exception.PlanError(
                    source='workloads', reason='workload %s is listed twice '
                    'or already running' % w.name)
            names.add(w.name)
        decided: dict[str, Decision] = {}
        for w in self.order(workloads):
            decided[w.name] = self.place(w)
        decisions = tuple(self.existing) + tuple(
            decided[w.name] for w in workloads) + tuple(
            Decision(name, Code.INVALID, str(err), trail=tuple(
                Verdict('spec', None, False, p) for p in err.problems))
            for name, err in invalid)
        LOG.debug('planned %d workloads on %d GPUs', len(workloads),
                  len(self.gpus))
        return Plan(self._ledger(), decisions, self._reports(decisions,
                                                             workloads),
                    self.bound(workloads), tuple(workloads))

    # -- why not ----------------------------------------------------------

    def _structure(self) -> dict[Any, Any]:
        """What the fleet could ever offer, per model and role."""
        per_host: dict[Any, int] = {}
        vfs: dict[Any, int] = {}
        pools: dict[str, tuple[int, int]] = {}
        for host in self.hosts.values():
            count: dict[Any, int] = {}
            for gs in host.gpus:
                for role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED,
                             Role.K8S_SHARED, Role.NOVA_VF):
                    if gs.role is None:
                        ok = self._role_ok(gs, role)[0]
                    else:
                        ok = gs.role is role
                    if not ok:
                        continue
                    key = (gs.model.name, role)
                    count[key] = count.get(key, 0) + 1
                    if role is Role.NOVA_VF:
                        vf = gs.vf_count if gs.role else self._vf_count_on(gs)
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
            for vkey in list(vfs):
                per_host[('vf',) + vkey] = max(per_host.get(('vf',) + vkey,
                                                            0), vfs[vkey])
            vfs.clear()
        return {'per_host': per_host, 'pools': pools}

    def _never_reasons(self, w: Workload, judgement: Any
                       ) -> tuple[bool, list[Verdict]]:
        key = w.shape()
        if key in self._never:
            known = self._never[key]
            return all(not v.passed for v in known), known
        per_host = self.structure['per_host']
        reasons: list[tuple[int, Verdict]] = []
        for option in judgement.allowed:
            model = option.model
            if option.kind is Kind.DEDICATED:
                roles = {Platform.VM: [Role.NOVA_DEDICATED],
                         Platform.POD: [Role.K8S_DEDICATED]}.get(
                    w.platform, [Role.NOVA_DEDICATED, Role.K8S_DEDICATED])
                most = max(per_host.get((model.name, r), 0) for r in roles)
                ok = w.gpus <= most
                text = ('needs %d whole %s GPUs on one host; the most any '
                        'host can give as %s is %d' % (
                            w.gpus, model.name,
                            ' or '.join(r.value for r in roles), most))
            elif option.kind is Kind.VF:
                most = per_host.get(('vf', model.name, option.vf_count), 0)
                ok = w.gpus <= most
                text = ('needs %d VFs of a %s on one host; the most any host '
                        'can give is %d' % (w.gpus, model.name, most))
            else:
                most = per_host.get((model.name, Role.K8S_SHARED), 0)
                cus, mib = self.structure['pools'].get(model.name, (0, 0))
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
        self._never[key] = verdicts
        return all(not v.passed for v in verdicts), verdicts

    def _capacity_verdict(self, w: Workload, option: base.Option
                          ) -> Verdict:
        model = option.model
        name = model.name
        free_gpus = self.free.count(name)
        if option.kind is Kind.DEDICATED:
            ready = sum(len(v) for (m, _r), hosts in self.ready.items()
                        if m == name for v in hosts.values()) \
                if self.ready else 0
            text = ('needs %d whole %s GPU(s) on one host; %d unassigned '
                    'and %d free dedicated GPU(s) in the fleet, none '
                    'enough on one host' % (w.gpus, name, free_gpus, ready))
        elif option.kind is Kind.VF:
            index = self.vf_index.get((name, option.vf_count or 0))
            free_vfs = index.total if index else 0
            text = ('needs %d VF(s) of a %s; %d VF(s) free on nova-vf GPUs '
                    'and %d unassigned GPU(s) that could take the role' % (
                        w.gpus, name, free_vfs, free_gpus))
        else:
            index = self.cu_index.get(name)
            biggest = 0
            if index:
                biggest = next((v for v in range(index.top, 0, -1)
                                if index.buckets.get(v)), 0)
            text = ('needs %d slice(s) of %d CUs and %d MiB on %s; the '
                    'largest free slice on a shared device is %d CUs, and '
                    '%d unassigned GPU(s) could take the role' % (
                        w.gpus, w.cus_on(model), w.memory_on(model), name,
                        biggest, free_gpus))
        return Verdict('capacity', option.kind, False, text, name)

    # -- results ----------------------------------------------------------

    def _ledger(self) -> av_ledger.Ledger:
        items = []
        for gs in self.gpus:
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

    def _reports(self, decisions: Sequence[Decision],
                 workloads: Sequence[Workload]) -> tuple[GpuReport, ...]:
        users: dict[tuple[str, str], list[Decision]] = {}
        for d in decisions:
            if d.placed:
                for address in d.gpus:
                    users.setdefault((d.host or '', address), []).append(d)
        reports = []
        for gs in self.gpus:
            role = gs.role or Role.IDLE
            held = users.get((gs.host.name, gs.address), [])
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
                for owner, cus in pool.alloc.allocations.items():
                    for start, length in cu_allocator.runs(
                            cu_allocator.mask_of(cus)):
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

    def bound(self, workloads: Sequence[Workload]) -> Bound:
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
        for gs in self.gpus:
            key = (gs.model.name, gs.host.family_key)
            rooms[key] = rooms.get(key, 0.0) + 1.0
        for d in self.existing:
            for grant in d.grants:
                gs = self._gpu(d.host or '', grant.address, 'placements')
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
                    if self._class_ok(Kind.CU, pod, key[1])}
        cache: dict[Any, tuple[float, dict[Kind, float], bool]] = {}
        for w in workloads:
            shape = w.shape()
            if shape in cache:
                best, per_kind, inner = cache[shape]
                if best < math.inf:
                    feet.append((best, w.priority))
                    restricted.append(inner)
                    for kind, foot in per_kind.items():
                        kind_feet[kind].append(foot)
                continue
            judgement = self.engine.judge(w, self.options)
            best = math.inf
            per_kind = {}
            used: set[tuple[str, str]] = set()
            cache[shape] = (best, per_kind, False)
            if not judgement.allowed or self._never_reasons(
                    w, judgement)[0]:
                continue
            for option in judgement.allowed:
                if option.kind is Kind.VF:
                    foot = w.gpus / (option.vf_count or 1)
                elif option.kind is Kind.CU:
                    foot = w.gpus * w.fraction_on(option.model)
                else:
                    foot = float(w.gpus)
                for key, room in rooms.items():
                    if key[0] != option.model.name or not self._class_ok(
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
            cache[shape] = (best, per_kind, inner)
            if best < math.inf:
                feet.append((best, w.priority))
                restricted.append(inner)
                for kind, foot in per_kind.items():
                    kind_feet[kind].append(foot)
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

    def _class_ok(self, kind: Kind, w: Workload, family_key: str) -> bool:
        if kind is Kind.DEDICATED and w.platform is not Platform.POD:
            return True
        family = st.GIM if kind is Kind.VF else st.AMDGPU
        return self.allow_mixed or family_key in (family, 'none', 'mixed')


def _knapsack(items: Sequence[tuple[float, int]], room: float) -> float:
    """Fractional knapsack of (footprint, priority) items in ``room``."""
    total = 0.0
    for foot, prio in sorted((i for i in items if i[1] > 0),
                             key=lambda i: -i[1] / max(i[0], 1e-9)):
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


def _first_refusals(trail: Sequence[Verdict]) -> str:
    seen: list[tuple[Kind | None, str]] = []
    for verdict in trail:
        if not verdict.passed and verdict.kind not in [k for k, _ in seen]:
            seen.append((verdict.kind, verdict.message))
    return '; '.join('%s: %s' % (k.value if k else '-', m) for k, m in seen)


def _short(w: Workload, choice: _Choice,
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


def plan(conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
         workloads: Sequence[Workload],
         ledger: av_ledger.Ledger | None = None,
         existing: Sequence[Decision] = (),
         invalid: Sequence[tuple[str, exception.WorkloadSpecError]] = ()
         ) -> Plan:
    """Plan ``workloads`` on ``hosts`` (see :class:`Planner`)."""
    return Planner(conf, hosts, ledger, existing).plan(workloads, invalid)
