"""The fleet planner's candidate search: for each kind a workload may
take, the GPUs that could hold it, found through the fleet's indexes.

For each allowed kind at most two candidates: the best fit among GPUs
already in the needed role (fewest free units first, so GPUs fill up and
fewer are used) and the best host to convert unassigned GPUs on (fewest
free GPUs first, so whole hosts stay free for large P2P jobs). Candidates
are kept per (workload shape, option) while the indexes they came from
are unchanged. :class:`~.planner.Planner` ranks and commits them.
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
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import GpuModel
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import base
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.fleetstate import FleetState
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Workload
from amdgpu_virt.sharing import packing

LOG = logging.getLogger(__name__)
#: shared hosts examined per multi-GPU CU request (round robin), which
#: bounds the work per request on large fleets
MULTI_GPU_SCAN = 32
#: shared devices compared per single-GPU CU request with [policy] packing
SCORE_WINDOW = 4


@dataclasses.dataclass
class Choice:
    """A candidate placement: the GPUs, pools and conversions it needs."""

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
    #: the view's profile, once read (see :meth:`profile`)
    _profile: tuple[object, ...] | None = dataclasses.field(
        default=None, repr=False, compare=False)

    def profile(self) -> tuple[object, ...]:
        """The view's :meth:`~.base.Candidate.profile`, kept (a choice is
        ranked again for every workload of its shape while it is
        kept)."""
        found = self._profile
        if found is None:
            found = self._profile = self.view.profile()
        return found


class CandidateSearch(FleetState):
    """The candidates of a workload for each option (the parameters and
    errors are those of :class:`~.fleetstate.FleetState`)."""

    def __init__(self, conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
                 ledger: av_ledger.Ledger | None = None,
                 existing: Sequence[Decision] = (),
                 engine: av_engine.Engine | None = None) -> None:
        super().__init__(conf, hosts, ledger, existing, engine)
        #: whether a GPU filter may refuse a GPU for the workload being
        #: placed (set per workload)
        self.checks_gpus = self.engine.checks_gpus
        #: the fragmentation score of k8s-shared devices ([policy]
        #: packing), against the mix of the workloads planned; None: best
        #: fit
        self.packing: packing.Score | None = None
        #: candidates per (shape, option), with the index versions they
        #: were found at (see :meth:`_candidates`)
        self._found: dict[Any, tuple[tuple[int, int], list[Choice]]] = {}
        #: the number of the shape of the workload being placed (see
        #: :meth:`~.planner.Planner.place`)
        self._shape = -1
        #: unassigned GPUs to convert, with the free index's version,
        #: per search (see :meth:`_new_gpus`)
        self._fresh: dict[Any, tuple[int, Any]] = {}
        #: (CUs, MiB) per GPU per (shape, model name), see :meth:`_size`
        self._sizes: dict[tuple[int, str], tuple[int, int]] = {}

    def _select(self, w: Workload, kind: Kind, role: Role,
                gpus: Iterable[st.GpuState], n: int,
                extra: Any = None) -> tuple[tuple[st.GpuState, ...], bool
                                            ] | None:
        """``n`` GPUs of one host for ``role``, NUMA-local if possible."""
        eligible = []
        checks = self.checks_gpus
        for gs in gpus:
            if gs.role is None:
                ok, unv = self.role_ok(gs, role)
                if not ok:
                    continue
            else:
                unv = gs.unverified
            if checks and self.engine.gpu_refusal(
                    w, kind, gs.gpu) is not None:
                continue
            if extra is not None and not extra(gs):
                continue
            if n == 1:
                # the first will do: NUMA matters from two GPUs on
                return (gs,), unv
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
        addresses: tuple[str, ...]
        numa_nodes: tuple[int | None, ...]
        if len(gpus) == 1:
            addresses = gpus[0].addresses
            numa_nodes = gpus[0].numa_nodes
        else:
            addresses = tuple(g.address for g in gpus)
            numa_nodes = tuple(g.gpu.numa_node for g in gpus)
        return base.candidate(kind, model, host.name, addresses, numa_nodes,
                              unit[0], unit[1], in_role, unverified)

    def _new_gpus(self, w: Workload, kind: Kind, role: Role,
                  model: GpuModel, n: int, extra: Any = None,
                  extra_key: Any = None
                  ) -> tuple[st.HostState, tuple[st.GpuState, ...], bool
                             ] | None:
        """The best host to convert ``n`` unassigned GPUs of ``model`` on
        for ``role`` (fewest free GPUs first), those GPUs and whether they
        are unverified.

        Without GPU filters for the workload the search reads of it only
        whether it needs one NUMA node, so its result is kept per
        (kind, role, model, count, ``extra_key``: what ``extra`` checks)
        while the free index is unchanged, for every workload shape
        alike (an ``extra`` without a key is not kept).
        """
        key = None
        if not self.checks_gpus and (extra is None or extra_key is not None):
            key = (id(kind), id(role), model.name, n, extra_key,
                   n > 1 and w.same_numa)
            hit = self._fresh.get(key)
            if hit is not None and hit[0] == self.free.version:
                return hit[1]
        found = None
        for family in self.family_keys(role):
            for host, lst in self.free.hosts_with(model.name, family, n):
                chosen = self._select(w, kind, role, lst, n, extra)
                if chosen is not None:
                    found = host, chosen[0], chosen[1]
                    break
            if found is not None:
                break
        if key is not None:
            self._fresh[key] = (self.free.version, found)
        return found

    def _dedicated(self, w: Workload, option: base.Option
                   ) -> list[Choice]:
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
                    result.append(Choice(
                        Kind.DEDICATED, role, host, found[0],
                        (None,) * w.gpus, (), found[1], self._view(
                            Kind.DEDICATED, model, host, found[0], unit,
                            w.gpus, found[1])))
                    break
            new = self._new_gpus(w, Kind.DEDICATED, role, model, w.gpus)
            if new is not None:
                host, gpus, unv = new
                result.append(Choice(
                    Kind.DEDICATED, role, host, gpus, (None,) * w.gpus, gpus,
                    unv, self._view(Kind.DEDICATED, model, host, gpus, unit,
                                    0, unv)))
        return result

    def _vf(self, w: Workload, option: base.Option) -> list[Choice]:
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
                    result.append(Choice(
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
                    result.append(Choice(
                        Kind.VF, Role.NOVA_VF, host, picked, (None,) * n, (),
                        unv, self._view(Kind.VF, model, host, picked, unit,
                                        len(set(picked)), unv), count))
                    break
        if n == 1 and result:
            return result  # an in-role GPU outscores converting another
        needed = math.ceil(n / count)
        new = self._new_gpus(w, Kind.VF, Role.NOVA_VF, model, needed,
                             lambda g: self.vf_count_on(g) == count, count)
        if new is not None:
            host, fresh, unv = new
            spread = tuple(fresh[i // count] for i in range(n))
            result.append(Choice(
                Kind.VF, Role.NOVA_VF, host, spread, (None,) * n, fresh, unv,
                self._view(Kind.VF, model, host, spread, unit, 0, unv),
                count))
        return result

    def _pick_pool(self, w: Workload, window: Sequence[st.Pool]
                   ) -> st.Pool | None:
        """The shared device a CU slice of ``w`` goes to, among the first
        that fit it (best fit first: least balanced room, then least
        memory).

        With ``[policy] packing`` the first :data:`SCORE_WINDOW` are
        compared as :func:`packing.best` compares them, by the
        fragmentation-aware score of
        :mod:`amdgpu_virt.sharing.packing` against the plan's workload
        mix (the one that grows the host's expected fragmentation least;
        ties: the best fit); without it, the best fit.
        """
        score = self.packing
        if score is None or len(window) <= 1:
            return window[0] if window else None
        return min(window, key=lambda pool: self._packing_key(
            score, w, pool))

    def _packing_key(self, score: packing.Score, w: Workload,
                     pool: st.Pool) -> tuple[float, float]:
        """What :func:`packing.best` compares for ``pool`` taking a slice
        of ``w``: the growth of its host's expected fragmentation (over
        the host's shared devices, in fractions of a GPU), then the room
        left."""
        gs = pool.gpu
        where = (gs.model.name, gs.host.name)
        known = self.fragments.get(where)
        # kept per host until a device of the host changes (cu_update)
        memo_key = (pool, self._shape)
        if known is not None:
            hit = known[2].get(memo_key)
            if hit is not None:
                return hit
        else:
            idle = 0
            partial = 0.0
            for other in self.shared_hosts.get(where[0], {}).get(
                    where[1], (gs,)):
                size = other.cus or 1
                for each in other.pools:
                    alloc = each.alloc
                    used = alloc.used_count
                    if used == 0 and each.mem_free == each.mem_total:
                        idle += 1
                    else:
                        partial += (alloc.total - used) / size
            known = self.fragments[where] = (idle, partial, {})
        idle, partial, memo = known
        alloc = pool.alloc
        used = alloc.used_count
        free = packing.GpuFree(
            (alloc.total - used) / (gs.cus or 1),
            pool.mem_free / (gs.vram or 1), gs.slices < self.max_slices,
            used == 0 and pool.mem_free == pool.mem_total, pool.mem_free)
        whole, mib = self._size(w, gs.model)
        cus = whole / (gs.cus or 1)
        cost = packing.share_cost(score, free, cus, mib / (gs.vram or 1),
                                  gs.slices + 1 < self.max_slices, idle,
                                  partial, mib)
        memo[memo_key] = result = (round(cost, 9), free.cus - cus)
        return result

    def _size(self, w: Workload, model: GpuModel) -> tuple[int, int]:
        """(CUs, MiB) per GPU of ``model`` for ``w``, the workload being
        placed (kept per shape: a share in percent costs a conversion)."""
        key = (self._shape, model.name)
        size = self._sizes.get(key)
        if size is None:
            size = self._sizes[key] = (w.cus_on(model), w.memory_on(model))
        return size

    def _spread_vfs(self, w: Workload, gpus: Sequence[st.GpuState],
                    n: int) -> tuple[st.GpuState, ...] | None:
        picked: list[st.GpuState] = []
        for gs in gpus:
            if self.checks_gpus and self.engine.gpu_refusal(
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

    def _cu(self, w: Workload, option: base.Option) -> list[Choice]:
        model = option.model
        cus, mib = unit = self._size(w, model)
        result = []
        n = w.gpus
        if n == 1:
            index = self.cu_index.get(model.name)
            need = max(cus, -(-mib * (model.compute_units or 1)
                              // (model.vram_mib or 1)))
            # an indexed device is on a k8s-shared GPU: only the GPU
            # filters may refuse it (what _select would say for one GPU)
            refusal = self.engine.gpu_refusal if self.checks_gpus else None
            window: list[st.Pool] = []
            # how many fitting devices _pick_pool compares
            size = 1 if self.packing is None else SCORE_WINDOW
            for pool in index.fitting(need, mib) if index else ():
                if pool.fits(cus, mib) and (
                        refusal is None
                        or refusal(w, Kind.CU, pool.gpu.gpu) is None):
                    window.append(pool)
                    if len(window) == size:
                        break
            picked = self._pick_pool(w, window)
            if picked is not None:
                gs = picked.gpu
                unv = gs.unverified
                result.append(Choice(
                    Kind.CU, Role.K8S_SHARED, gs.host, (gs,), (picked,),
                    (), unv, self._view(Kind.CU, model, gs.host, (gs,),
                                        unit, 1, unv)))
        else:
            hosts = self.shared_hosts.get(model.name, {})
            for hostname in list(itertools.islice(hosts, MULTI_GPU_SCAN)):
                shared = hosts[hostname]
                host = self.hosts[hostname]
                most_cus, most_mib = self.host_room(model.name, hostname,
                                                    shared)
                ready = [g for g in shared if self._pool_for(g, cus, mib)
                         ] if most_cus >= cus and most_mib >= mib else []
                if not ready:
                    # look at the others first next time (round robin;
                    # only this search reads the order, and it is not
                    # kept: no kept candidate goes stale)
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
                result.append(Choice(
                    Kind.CU, Role.K8S_SHARED, host, gpus, pools, convert,
                    unv, self._view(Kind.CU, model, host, gpus, unit,
                                    n - len(convert), unv)))
                break
        if n == 1 and result:
            return result  # an in-role GPU outscores converting another
        new = self._new_gpus(w, Kind.CU, Role.K8S_SHARED, model, n,
                             lambda g: self._could_share(g, cus, mib),
                             (cus, mib))
        if new is not None:
            host, gpus, unv = new
            result.append(Choice(
                Kind.CU, Role.K8S_SHARED, host, gpus, (None,) * n, gpus, unv,
                self._view(Kind.CU, model, host, gpus, unit, 0, unv)))
        return result

    def _candidates(self, w: Workload, option: base.Option,
                    shape: Any = None) -> list[Choice]:
        """The candidates of ``w`` for ``option``.

        They depend only on the workload's shape and on the indexes the
        kind searches, so they are kept per (shape, option) with the
        versions of those indexes and reused while none has changed
        (workloads of one shape come in runs, and most placements change
        one kind's index). A multi-GPU slice search turns its round robin
        as it goes, so it is not kept.
        """
        key = (w.shape() if shape is None else shape, option)
        if key in self.failed:
            return []
        kind = option.kind
        if kind is Kind.DEDICATED:
            version: tuple[int, int] | None = (self.free.version,
                                               self.ready_version)
        elif kind is Kind.VF:
            version = (self.free.version, self.vf_version)
        elif w.gpus == 1:
            version = (self.free.version, self.cu_version)
        else:
            version = None
        if version is not None:
            hit = self._found.get(key)
            if hit is not None and hit[0] == version:
                return hit[1]
        if kind is Kind.DEDICATED:
            found = self._dedicated(w, option)
        elif kind is Kind.VF:
            found = self._vf(w, option)
        else:
            found = self._cu(w, option)
        if not found:
            # capacity only shrinks while planning: this shape stays out
            self.failed.add(key)
        elif version is not None:
            self._found[key] = (version, found)
        return found
