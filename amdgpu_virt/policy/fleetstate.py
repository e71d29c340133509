"""The fleet while it is planned: every GPU, its role and what is free.

Constraints kept: one role per GPU; VF counts the catalog allows for the
model; one driver family per host (GIM: ``nova-vf``, ``nova-dedicated``
by vfio-pci, ``idle``; amdgpu: ``k8s-shared``, ``k8s-dedicated``,
``nova-dedicated``, ``idle``) unless ``[policy] allow_mixed_host_drivers``
(then marked unverified); a host's memory (NPS) and compute partition mode
as the inventory found it (a CU slice never spans two partitions); roles
in a given ledger and running placements never change (incremental mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from oslo_config import cfg

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.policy.decision import Verdict


class FleetState:
    """Every GPU of a fleet with its role, and the indexes of what is free.

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
        #: VFs per GPU a GPU of each model gets as ``nova-vf`` (the
        #: engine's answer, read once)
        self._vf_counts: dict[str, int | None] = {}
        self.hosts: dict[str, st.HostState] = {}
        self.gpus: list[st.GpuState] = []
        self.free = st.FreeIndex()
        self.vf_index: dict[tuple[str, int], st.BucketIndex] = {}
        self.vf_hosts: dict[tuple[str, int], st.BucketIndex] = {}
        self.cu_index: dict[str, st.PoolIndex] = {}
        self.shared_hosts: dict[str, dict[str, list[st.GpuState]]] = {}
        self.ready: dict[tuple[str, Role], dict[str, list[st.GpuState]]] = {}
        #: (shape, option) pairs found not to fit (capacity only shrinks)
        self.failed: set[Any] = set()
        #: why-never verdicts per workload shape
        self.never: dict[Any, list[Verdict]] = {}
        #: grow at every change of ``ready``, of the VF indexes and of the
        #: shared devices (with :attr:`FreeIndex.version`, what a search
        #: cached on them compares)
        self.ready_version = 0
        self.vf_version = 0
        self.cu_version = 0
        #: (idle devices, free fraction of the partly used ones, scores
        #: of its devices per workload shape) of the shared GPUs per
        #: (model, host), dropped at every change there
        self.fragments: dict[tuple[str, str],
                             tuple[int, float, dict[Any, Any]]] = {}
        #: (most free CUs, most free MiB) of one device of the shared
        #: GPUs below the slice cap, per (model, host), dropped at every
        #: change there (see :meth:`host_room`)
        self.rooms: dict[tuple[str, str], tuple[int, int]] = {}
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
            self.load_ledger(ledger)
        for gs in self.gpus:
            if gs.role is None:
                self.free.add(gs)
        for decision in existing:
            self.claim(decision)
        self.models = sorted({g.model for g in self.gpus},
                             key=lambda m: m.name)
        # VF layouts that exist or may be made in this fleet, per model:
        # a model none of whose GPUs can run GIM here offers no VF
        vf_counts: dict[str, list[int]] = {m.name: [] for m in self.models}
        for gs in self.gpus:
            count = None
            if gs.role is Role.NOVA_VF:
                count = gs.vf_count
            elif gs.role is None and self.role_ok(gs, Role.NOVA_VF)[0]:
                count = self.vf_count_on(gs)
            if count is not None and count not in vf_counts[gs.model.name]:
                vf_counts[gs.model.name].append(count)
        self.options = self.engine.options(self.models, {
            k: sorted(v) for k, v in vf_counts.items()})


    # -- roles and families -----------------------------------------------

    def vf_count_on(self, gs: st.GpuState) -> int | None:
        """VFs per GPU ``gs`` would get as ``nova-vf``."""
        model = gs.model
        if model.vf_device_id is None or not model.vf_counts:
            return None
        current = gs.gpu.sriov_numvfs
        if gs.native_family == st.GIM and current in model.vf_counts:
            return current
        count = self._vf_counts.get(model.name, 0)
        if count == 0:
            count = self._vf_counts[model.name] = self.engine.vf_count_for(
                model)
        return count

    def role_ok(self, gs: st.GpuState, role: Role) -> tuple[bool, bool]:
        """(allowed, unverified) for giving ``gs`` the ``role``."""
        if role is Role.NOVA_VF and self.vf_count_on(gs) is None:
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

    def assign(self, gs: st.GpuState, role: Role, unverified: bool,
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
            gs.vf_count = vf_count or self.vf_count_on(gs)
            gs.vf_free = list(range(gs.vf_count or 0))
            gs.vf_owners = {}
            self.vf_update(gs)
        elif role is Role.K8S_SHARED:
            gs.make_pools(self.strategy, share_mode or gs.compute_mode)
            self.cu_version += 1
            for pool in gs.pools:
                self.cu_update(pool)
            self.shared_hosts.setdefault(model, {}).setdefault(
                gs.host.name, []).append(gs)
        elif role in (Role.NOVA_DEDICATED, Role.K8S_DEDICATED) and gs.fixed:
            self.ready_version += 1
            self.ready.setdefault((model, role), {}).setdefault(
                gs.host.name, []).append(gs)

    def cu_update(self, pool: st.Pool) -> None:
        """Re-index ``pool`` (and its GPU's other pools at the slice cap).

        Pools are bucketed by their balanced free capacity: the smaller of
        free CUs and free memory counted in CUs, so that a scan from a
        request's own balanced size finds pools that fit both. The GPU's
        other pools change only where its slice count meets or leaves the
        cap (a change is one slice more or less).
        """
        self.cu_version += 1
        gs = pool.gpu
        where = (gs.model.name, gs.host.name)
        self.fragments.pop(where, None)
        self.rooms.pop(where, None)
        index = self.cu_index.get(where[0])
        if index is None:
            index = self.cu_index[where[0]] = st.PoolIndex()
        capped = gs.slices >= self.max_slices
        for each in (gs.pools if gs.slices >= self.max_slices - 1
                     else (pool,)):
            value = 0
            if not capped:
                value = min(each.alloc.free_count,
                            self.mem_as_cus(gs.model, each.mem_free))
            index.put(each, value)

    def host_room(self, model: str, host: str,
                  shared: Sequence[st.GpuState]) -> tuple[int, int]:
        """(most free CUs, most free MiB) of one device of ``shared``,
        the shared GPUs of ``model`` on ``host``, counting only GPUs below
        the slice cap: a slice larger in either fits none of them. Kept
        until a device there changes."""
        where = (model, host)
        room = self.rooms.get(where)
        if room is None:
            most_cus = most_mib = 0
            cap = self.max_slices
            for gs in shared:
                if gs.slices < cap:
                    for pool in gs.pools:
                        free = pool.alloc.free_count
                        if free > most_cus:
                            most_cus = free
                        if pool.mem_free > most_mib:
                            most_mib = pool.mem_free
            room = self.rooms[where] = (most_cus, most_mib)
        return room

    @staticmethod
    def mem_as_cus(model: GpuModel, mib: int) -> int:
        # rounded up: the index is a hint, fits() decides; rounding down
        # would hide a device a few MiB short of the nominal split
        return -(-mib * (model.compute_units or 1) // (model.vram_mib or 1))

    def vf_update(self, gs: st.GpuState) -> None:
        """Re-index ``gs`` by its free VFs, and its host by the free VFs
        of its GPUs of that VF count (the host's figure moves by what the
        GPU's moved)."""
        self.vf_version += 1
        key = (gs.model.name, gs.vf_count or 0)
        index = self.vf_index.get(key)
        if index is None:
            index = self.vf_index[key] = st.BucketIndex()
        old = index.where.get(gs, 0)
        free = len(gs.vf_free)
        index.put(gs, free)
        hosts = self.vf_hosts.get(key)
        if hosts is None:
            hosts = self.vf_hosts[key] = st.BucketIndex()
        name = gs.host.name
        hosts.put(name, hosts.where.get(name, 0) + free - old)

    # -- incremental mode -------------------------------------------------

    def gpu_at(self, host: str, address: str, where: str) -> st.GpuState:
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

    def load_ledger(self, ledger: av_ledger.Ledger) -> None:
        for item in ledger.assignments:
            where = 'ledger: hosts.%s (%s)' % (item.host, item.address)
            gs = self.gpu_at(item.host, str(item.address), where)
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
            ok, unverified = self.role_ok(gs, item.role)
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
            self.assign(gs, item.role, unverified, item.vf_count)

    def claim(self, decision: Decision) -> None:
        """Hold what a running placement holds; it stays (incremental
        mode).

        :raises PlanError: naming the placement that does not match.
        """
        self.hold(decision, 'placements: %s' % decision.workload)
        self.existing.append(dataclasses.replace(decision, existing=True,
                                                 code=Code.PLACED))

    def hold(self, decision: Decision, where: str) -> None:
        """Take exactly the grants of ``decision`` (GPUs in their roles).

        A placement read from a state file or from the live cluster is
        input, not truth: every grant is checked against the fleet before
        it is taken, and a decision is held whole or not at all.

        :raises PlanError: naming the workload and the GPU when a grant
            names an unknown GPU, a GPU of another role, a VF, partition
            or CU that does not exist or is taken, more memory than is
            free, or a slice past ``[policy] max_slices_per_gpu``.
        """
        if decision.kind is None or decision.host is None:
            raise exception.PlanError(source=where,
                                      reason='kind and host are required')
        if not decision.grants:
            raise exception.PlanError(
                source=where, reason='placement of %s lists no grants'
                % decision.workload)
        taken: list[tuple[st.GpuState, Grant]] = []
        try:
            for grant in decision.grants:
                gs = self.gpu_at(decision.host, grant.address, where)
                self._take(decision, gs, grant, where)
                taken.append((gs, grant))
        except exception.PlanError:
            for gs, grant in reversed(taken):
                self._give(decision, gs, grant)
            raise

    def _take(self, decision: Decision, gs: st.GpuState, grant: Grant,
              where: str) -> None:
        """Take one grant of ``decision`` on ``gs``, or refuse it (and
        change nothing)."""
        kind = decision.kind
        needed = {Kind.VF: (Role.NOVA_VF,), Kind.CU: (Role.K8S_SHARED,),
                  Kind.DEDICATED: (Role.NOVA_DEDICATED,
                                   Role.K8S_DEDICATED)}[kind]  # type: ignore
        gpu = 'GPU %s of %s' % (gs.address, gs.host.name)

        def refuse(reason: str) -> exception.PlanError:
            if decision.workload not in where:
                reason = '%s: %s' % (decision.workload, reason)
            return exception.PlanError(source=where, reason=reason)

        if gs.role not in needed:
            raise refuse('%s has role %s in the ledger, but a %s placement '
                         'needs %s' % (
                             gpu, gs.role.value if gs.role else 'none',
                             kind.value,  # type: ignore[union-attr]
                             ' or '.join(r.value for r in needed)))
        if grant.memory_mib < 0 or grant.compute_units < 0:
            raise refuse('%s: a grant of %d MiB and %d CUs is negative' % (
                gpu, grant.memory_mib, grant.compute_units))
        if kind is Kind.DEDICATED:
            if gs.owner is not None:
                raise refuse('%s is already held by %s' % (gpu, gs.owner))
            gs.owner = decision.workload
            self.unready(gs)
        elif kind is Kind.VF:
            index = grant.vf_index
            count = gs.vf_count or 0
            if index is None or not 0 <= index < count:
                raise refuse('%s has VFs 0..%d, not %s' % (
                    gpu, count - 1, 'none' if index is None else index))
            if index not in gs.vf_free:
                raise refuse('VF %d of %s is not free (owner %s)' % (
                    index, gpu, gs.vf_owners.get(index)))
            _cus, vf_mib = gs.vf_unit()
            if vf_mib and grant.memory_mib > vf_mib:
                raise refuse('VF %d of %s has %d MiB, not %d' % (
                    index, gpu, vf_mib, grant.memory_mib))
            gs.vf_free.remove(index)
            gs.vf_owners[index] = decision.workload
            self.vf_update(gs)
        else:
            pool = next((p for p in gs.pools
                         if p.partition == grant.partition), None)
            if pool is None or not grant.cus:
                raise refuse('%s has no partition %s, or the grant lists '
                             'no CUs' % (gpu, grant.partition))
            if gs.slices >= self.max_slices:
                raise refuse('%s already holds %d slices, the most '
                             '[policy] max_slices_per_gpu allows' % (
                                 gpu, gs.slices))
            if grant.memory_mib > pool.mem_free:
                raise refuse('%s%s has %d of %d MiB free, the grant needs '
                             '%d' % (gpu, '' if pool.partition is None
                                     else ' partition %d' % pool.partition,
                                     pool.mem_free, pool.mem_total,
                                     grant.memory_mib))
            try:
                pool.alloc.claim(decision.workload, grant.cus)
            except exception.SharingError as err:
                raise refuse(str(err)) from None
            pool.mem_free -= grant.memory_mib
            gs.slices += 1
            self.cu_update(pool)

    def _give(self, decision: Decision, gs: st.GpuState,
              grant: Grant) -> None:
        """Give one grant of ``decision`` on ``gs`` back."""
        if decision.kind is Kind.DEDICATED:
            gs.owner = None
            if gs.fixed and gs.role is not None:
                self.ready_version += 1
                self.ready.setdefault((gs.model.name, gs.role), {}
                                      ).setdefault(gs.host.name,
                                                   []).append(gs)
        elif decision.kind is Kind.VF:
            del gs.vf_owners[grant.vf_index]  # type: ignore[arg-type]
            gs.vf_free.append(grant.vf_index)  # type: ignore[arg-type]
            gs.vf_free.sort()
            self.vf_update(gs)
        else:
            pool = next(p for p in gs.pools
                        if p.partition == grant.partition)
            pool.alloc.release(decision.workload)
            pool.mem_free += grant.memory_mib
            gs.slices -= 1
            self.cu_update(pool)

    def release(self, decision: Decision) -> list[tuple[st.GpuState,
                                                         Role, Any]]:
        """Give back what the (new, placed) ``decision`` holds.

        A GPU it leaves empty whose role the planner gave (not the
        ledger's) is unassigned again, so it may take another role.

        :returns: (GPU, role, VF count or compute mode) of each GPU
            unassigned, for :meth:`restore`.
        """
        emptied: list[tuple[st.GpuState, Role, Any]] = []
        touched: dict[int, st.GpuState] = {}
        for grant in decision.grants:
            gs = self.gpu_at(decision.host or '', grant.address, 'release')
            self._give(decision, gs, grant)
            touched.setdefault(id(gs), gs)
        # a GPU is empty once every grant on it is back (several VFs of
        # one GPU are several grants)
        for gs in touched.values():
            if not gs.fixed and gs.role is not None and not (
                    gs.owner or gs.vf_owners or gs.slices):
                role = gs.role
                extra = gs.vf_count if role is Role.NOVA_VF else \
                    gs.compute_mode
                self.unassign(gs)
                emptied.append((gs, role, extra))
        return emptied

    def restore(self, decision: Decision,
                emptied: Sequence[tuple[st.GpuState, Role, Any]]) -> None:
        """Undo :meth:`release`: the same roles, then the same grants."""
        for gs, role, extra in emptied:
            if gs.role is not None:
                continue   # taken meanwhile: hold() says if it differs
            _ok, unverified = self.role_ok(gs, role)
            if role is Role.NOVA_VF:
                self.assign(gs, role, unverified, extra)
            else:
                self.assign(gs, role, unverified, share_mode=extra)
        self.hold(decision, 'restore')

    def unassign(self, gs: st.GpuState) -> None:
        """Take the (planner-given) role of the empty ``gs`` back."""
        role = gs.role
        model = gs.model.name
        host = gs.host
        gs.role = None
        self.vf_version += 1
        self.cu_version += 1
        if role is Role.NOVA_VF:
            self.vf_index[(model, gs.vf_count or 0)].put(gs, 0)
            count = gs.vf_count
            total = sum(len(g.vf_free) for g in host.gpus
                        if g.role is Role.NOVA_VF and g.vf_count == count)
            self.vf_hosts[(model, count or 0)].put(host.name, total)
        elif role is Role.K8S_SHARED:
            self.fragments.pop((model, host.name), None)
            self.rooms.pop((model, host.name), None)
            index = self.cu_index[model]
            for pool in gs.pools:
                index.put(pool, 0)
            gs.pools = st.NO_POOLS  # type: ignore[assignment]
            shared = self.shared_hosts.get(model, {})
            on_host = shared.get(host.name, [])
            if gs in on_host:
                on_host.remove(gs)
                if not on_host:
                    del shared[host.name]
        gs.vf_count = None
        gs.vf_free = st.NO_VFS  # type: ignore[assignment]
        gs.vf_owners = st.NO_OWNERS  # type: ignore[assignment]
        gs.unverified = False
        gs.compute_mode = gs.gpu.compute_partition
        gs.memory_mode = gs.gpu.memory_partition
        families = set(host.native_families)
        families.update(st.ROLE_FAMILY[g.role] for g in host.gpus
                        if g.role in st.ROLE_FAMILY)
        if families != host.families:
            host.families = families
            self.free.rekey(host)
        self.free.add(gs)

    def unready(self, gs: st.GpuState) -> None:
        self.ready_version += 1
        hosts = self.ready.get((gs.model.name, gs.role))  # type: ignore
        if hosts and gs in hosts.get(gs.host.name, []):
            hosts[gs.host.name].remove(gs)
            if not hosts[gs.host.name]:
                del hosts[gs.host.name]

    # -- host driver families ---------------------------------------------

    def family_keys(self, role: Role) -> list[str]:
        family = st.ROLE_FAMILY.get(role)
        if family is None:
            return ['none', st.GIM, st.AMDGPU, 'mixed']
        other = st.AMDGPU if family == st.GIM else st.GIM
        keys = [family, 'none', 'mixed']
        if self.allow_mixed:
            keys.append(other)
        return keys
