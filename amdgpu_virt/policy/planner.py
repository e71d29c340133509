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

The fleet and its constraints are :class:`~.fleetstate.FleetState`; why a
workload does not fit is :mod:`.explain`; the capacity bound the plan is
compared with is :mod:`.bound`; the ledger and the GPU reports are built
by :mod:`.report`.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
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
from amdgpu_virt.policy import bound as av_bound
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import explain
from amdgpu_virt.policy import improve
from amdgpu_virt.policy import report
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.policy.decision import Trail
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.fleetstate import FleetState
from amdgpu_virt.policy.result import Bound
from amdgpu_virt.policy.result import Plan
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Workload
from amdgpu_virt.sharing import allocator as cu_allocator
from amdgpu_virt.sharing import packing

LOG = logging.getLogger(__name__)
_REFERENCE_MODEL = catalog.by_name('MI300X')
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


class Planner(FleetState):
    """Plans a fleet; one instance per plan (the parameters and errors
    are those of :class:`~.fleetstate.FleetState`)."""

    def __init__(self, conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
                 ledger: av_ledger.Ledger | None = None,
                 existing: Sequence[Decision] = (),
                 engine: av_engine.Engine | None = None) -> None:
        super().__init__(conf, hosts, ledger, existing, engine)
        self.shape = explain.fleet_shape(self)
        #: whether a GPU filter may refuse a GPU for the workload being
        #: placed (set per workload)
        self.checks_gpus = self.engine.checks_gpus
        #: the fragmentation score of k8s-shared devices ([policy]
        #: packing), against the mix of the workloads planned; None: best
        #: fit
        self.packing: packing.Score | None = None
        #: short reasons per (shape, kind, unit, unverified)
        self._reasons: dict[Any, str] = {}
        #: candidates per (shape, option), with the index versions they
        #: were found at (see :meth:`_candidates`)
        self._found: dict[Any, tuple[tuple[int, int], list[Choice]]] = {}
        #: CU ids per bitmap given
        self._cu_ids: dict[int, tuple[int, ...]] = {}
        #: what the weighers' verdicts of one profile share
        self._ranked: dict[Any, Any] = {}
        #: rankings per (shape, candidate profiles), see :meth:`_rank`
        self._orders: dict[Any, tuple[tuple[int, Any], ...]] = {}
        #: a small number per workload shape, the key of the caches
        #: above (a shape tuple of enums is slow to hash), and that of the
        #: workload being placed
        self._shapes: dict[Any, int] = {}
        self._shape = -1
        self._kinds: dict[Any, tuple[GpuModel, Kind, Role, bool]] = {}
        #: (CUs, MiB) per GPU per (shape, model name), see :meth:`_size`
        self._sizes: dict[tuple[int, str], tuple[int, int]] = {}

    # -- candidates -------------------------------------------------------

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
            eligible.append((gs, unv))
            if n == 1:
                break  # the first will do: NUMA matters from two GPUs on
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
        if len(gpus) == 1:
            addresses = gpus[0].addresses
            numa_nodes = gpus[0].numa_nodes
        else:
            addresses = tuple(g.address for g in gpus)
            numa_nodes = tuple(g.gpu.numa_node for g in gpus)
        return base.Candidate(kind, model, host.name, addresses, numa_nodes,
                              unit[0], unit[1], in_role, unverified)

    def _new_gpus(self, w: Workload, kind: Kind, role: Role,
                  model: GpuModel, n: int, extra: Any = None
                  ) -> tuple[st.HostState, tuple[st.GpuState, ...], bool
                             ] | None:
        for key in self.family_keys(role):
            for host, lst in self.free.hosts_with(model.name, key, n):
                found = self._select(w, kind, role, lst, n, extra)
                if found is not None:
                    return host, found[0], found[1]
        return None

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
                             lambda g: self.vf_count_on(g) == count)
        if new is not None:
            host, fresh, unv = new
            spread = tuple(fresh[i // count] for i in range(n))
            result.append(Choice(
                Kind.VF, Role.NOVA_VF, host, spread, (None,) * n, fresh, unv,
                self._view(Kind.VF, model, host, spread, unit, 0, unv),
                count))
        return result

    def _pick_pool(self, w: Workload,
                   fitting: Iterator[tuple[st.Pool, Any]]
                   ) -> tuple[st.Pool, Any] | None:
        """The shared device a CU slice of ``w`` goes to, among those
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
        if score is None:
            return next(fitting, None)
        window = list(itertools.islice(fitting, SCORE_WINDOW))
        if len(window) <= 1:
            return window[0] if window else None
        best = min(range(len(window)), key=lambda i: self._packing_key(
            score, w, window[i][0]))
        return window[best]

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
                for each in other.pools:
                    if each.alloc.used_count == 0 and \
                            each.mem_free == each.mem_total:
                        idle += 1
                    else:
                        partial += each.alloc.free_count / (other.cus or 1)
            known = self.fragments[where] = (idle, partial, {})
        idle, partial, memo = known
        free = packing.GpuFree(
            pool.alloc.free_count / (gs.cus or 1),
            pool.mem_free / (gs.vram or 1), gs.slices < self.max_slices,
            pool.alloc.used_count == 0 and pool.mem_free == pool.mem_total,
            pool.mem_free)
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
            picked = self._pick_pool(w, (
                (pool, ((pool.gpu,), pool.gpu.unverified))
                for pool in (index.fitting(need, mib) if index else ())
                if pool.fits(cus, mib) and (
                    refusal is None
                    or refusal(w, Kind.CU, pool.gpu.gpu) is None)))
            if picked is not None:
                pool, found = picked
                gs = pool.gpu
                result.append(Choice(
                    Kind.CU, Role.K8S_SHARED, gs.host, (gs,), (pool,),
                    (), found[1], self._view(Kind.CU, model, gs.host,
                                             (gs,), unit, 1, found[1])))
        else:
            hosts = self.shared_hosts.get(model.name, {})
            for hostname in list(itertools.islice(hosts, MULTI_GPU_SCAN)):
                shared = hosts[hostname]
                host = self.hosts[hostname]
                ready = [g for g in shared if self._pool_for(g, cus, mib)]
                if not ready:
                    # look at the others first next time (round robin)
                    hosts[hostname] = hosts.pop(hostname)
                    self.cu_version += 1
                    continue
                spare = [g for g in host.gpus if g.role is None
                         and self._could_share(g, cus, mib)]
                found = self._select(w, Kind.CU, Role.K8S_SHARED,
                                     ready + spare, n)
                if found is None:
                    hosts[hostname] = hosts.pop(hostname)
                    self.cu_version += 1
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
                             lambda g: self._could_share(g, cus, mib))
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

    # -- commit -----------------------------------------------------------

    def _commit(self, w: Workload, choice: Choice) -> tuple[Grant, ...
                                                              ] | None:
        model = choice.view.model
        cus, mib = self._size(w, model)
        for gs in choice.convert:
            ok, unv = self.role_ok(gs, choice.role)
            mode = (self._share_mode(gs, cus, mib)[1]
                    if choice.role is Role.K8S_SHARED else None)
            self.assign(gs, choice.role, unv, choice.vf_count, mode)
        grants: list[Grant] = []
        if choice.kind is Kind.DEDICATED:
            for gs in choice.gpus:
                gs.owner = w.name
                self.unready(gs)
                grants.append(Grant(gs.address, mib, cus))
        elif choice.kind is Kind.VF:
            for gs in choice.gpus:
                index = gs.vf_free.pop(0)
                gs.vf_owners[index] = w.name
                grants.append(Grant(gs.address, mib, cus, vf_index=index))
            for gs in set(choice.gpus):
                self.vf_update(gs)
        else:
            done: list[st.Pool] = []
            for gs, pool in zip(choice.gpus, choice.pools, strict=True):
                pool = pool or self._pool_for(gs, cus, mib)
                try:
                    if pool is None:
                        raise exception.InsufficientCapacity(
                            gpu=gs.address, requested=cus, unit='CUs',
                            owner=w.name, free=0, capacity=gs.cus)
                    mask = pool.alloc.allocate_mask(w.name, cus)
                except exception.SharingError:
                    for other in done:
                        other.alloc.release(w.name)
                        other.mem_free += mib
                        other.gpu.slices -= 1
                        self.cu_update(other)
                    return None
                pool.mem_free -= mib
                gs.slices += 1
                self.cu_update(pool)
                done.append(pool)
                # the same CUs are given on many GPUs: one tuple for all
                taken = self._cu_ids.get(mask)
                if taken is None:
                    taken = self._cu_ids[mask] = cu_allocator.ids_of(mask)
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
        """Decide and commit one workload.

        The trail shares the filters' verdicts with every workload of the
        same shape and keeps the planner's own as numbers
        (:class:`~.decision.Trail`), written out when it is read.
        """
        if not self.gpus:
            return Decision(w.name, Code.NEVER, 'the fleet has no GPUs')
        shape = self._shapes.get(w.shape())
        if shape is None:
            shape = self._shapes[w.shape()] = len(self._shapes)
        self._shape = shape
        self.checks_gpus = self.engine.checks_gpus_of(w)
        judgement = self.engine.judge(w, self.options)
        head = judgement.trail
        if not judgement.allowed:
            return Decision(
                w.name, Code.NEVER, 'no kind is allowed on any GPU model '
                'of the fleet: %s' % explain.first_refusals(head),
                trail=head)
        choices: list[Choice] = []
        for option in judgement.allowed:
            choices.extend(self._candidates(w, option, shape))
        while choices:
            views = [c.view for c in choices]
            order = self._rank(w, views)
            choice = choices[order[0][0]]
            free = explain.free_state(choice)
            grants = self._commit(w, choice)
            scores = explain.ranked_state_of(order, views)
            if grants is None:
                head = head + tuple(explain.weigher_verdicts(scores))
                choices.remove(choice)
                continue
            model = choice.view.model
            return Decision(w.name, Code.PLACED,
                            self._short(w, choice, judgement),
                            choice.kind, choice.host.name, grants,
                            Trail(head, explain.placed_verdicts, (
                                w, self._kind_of(model, choice),
                                choice.host.name, grants, len(scores),
                                *scores, *free)),
                            order[0][1][3], choice.unverified)
        never = explain.never_reasons(self, self.shape, w,
                                      judgement)
        if never[0]:
            return Decision(w.name, Code.NEVER, '; '.join(
                v.message for v in never[1]), trail=Trail(
                    head, tail=tuple(never[1])))
        capacity = [explain.capacity_verdict(self, w, o)
                    for o in judgement.allowed]
        return Decision(
            w.name, Code.UNSCHEDULABLE, 'allowed %s, but nothing is free '
            'now: %s' % ('/'.join(k.value for k in judgement.kinds()),
                         capacity[0].message), trail=Trail(
                head, tail=tuple(never[1]) + tuple(capacity)))

    def _rank(self, w: Workload, views: Sequence[base.Candidate]
              ) -> tuple[tuple[int, Any], ...]:
        """The weighers' ranking of ``views`` (:func:`explain.ranking`),
        kept per shape and sequence of profiles when the weighers read
        only those (the same few are ranked again and again)."""
        if not self.engine.ranks_by_profile:
            return explain.ranking(self.engine.rank(w, views), views,
                                   self._ranked)
        key = (self._shape, tuple(v.profile() for v in views))
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = explain.ranking(
                self.engine.rank(w, views), views, self._ranked)
        return order

    def _kind_of(self, model: GpuModel, choice: Choice
                 ) -> tuple[GpuModel, Kind, Role, bool]:
        """(model, kind, role, unverified) of ``choice``, one tuple for
        every decision alike."""
        key = (id(model), choice.kind.value, choice.role.value,
               choice.unverified)
        found = self._kinds.get(key)
        if found is None:
            found = self._kinds[key] = (model, choice.kind, choice.role,
                                        choice.unverified)
        return found

    def _short(self, w: Workload, choice: Choice,
               judgement: av_engine.Judgement) -> str:
        view = choice.view
        key = (self._shape, choice.kind.value, view.unit_cus,
               view.unit_mib, choice.unverified)
        text = self._reasons.get(key)
        if text is None:
            text = self._reasons[key] = explain.short(w, choice, judgement)
        return text

    def plan(self, workloads: Sequence[Workload],
             invalid: Sequence[tuple[str, exception.WorkloadSpecError]] = ()
             ) -> Plan:
        """Place ``workloads`` (new ones; running ones came in ``existing``).

        The cyclic garbage collector is paused while the plan is made (it
        would walk the growing plan again and again, and the plan leaves
        no cycles behind), and set back as it was after.

        :param invalid: specifications that failed validation, reported
            with code ``invalid`` and every problem in the trail.
        :raises PlanError: a workload name is used twice or is running.
        """
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._plan(workloads, invalid)
        finally:
            if paused:
                gc.enable()

    def _plan(self, workloads: Sequence[Workload],
              invalid: Sequence[tuple[str, exception.WorkloadSpecError]]
              ) -> Plan:
        names = {d.workload for d in self.existing}
        for w in workloads:
            if w.name in names:
                raise exception.PlanError(
                    source='workloads', reason='workload %s is listed twice '
                    'or already running' % w.name)
            names.add(w.name)
        del names
        if self.conf.policy.packing:
            # one request shape per workload shape, weighed by its count
            # (the same sums as one weight per workload, in the same order)
            counts: dict[Any, list[Any]] = {}
            for w in workloads:
                entry = counts.get(w.shape())
                if entry is None:
                    counts[w.shape()] = [_shape_of(w), 1.0]
                else:
                    entry[1] += 1.0
            self.packing = packing.score_of(
                (shape, weight) for shape, weight in counts.values())
        decided: dict[str, Decision] = {}
        ordered = self.order(workloads)
        for w in ordered:
            decided[w.name] = self.place(w)
        seconds = float(self.conf.policy.improve_seconds)
        if seconds > 0:
            moves = improve.improve(self, decided, ordered, seconds,
                                    int(self.conf.policy.improve_tries))
            LOG.debug('improvement pass: %d moves', moves)
        decisions = tuple(self.existing) + tuple(
            decided[w.name] for w in workloads) + tuple(
            Decision(name, Code.INVALID, str(err), trail=tuple(
                Verdict('spec', None, False, p) for p in err.problems))
            for name, err in invalid)
        LOG.debug('planned %d workloads on %d GPUs', len(workloads),
                  len(self.gpus))
        return Plan(report.ledger_of(self), decisions,
                    report.gpu_reports(self, decisions),
                    self.bound(workloads), tuple(workloads))

    def bound(self, workloads: Sequence[Workload]) -> Bound:
        """Upper bounds by capacity alone (see :mod:`.bound`)."""
        return av_bound.bound(self, self.shape, workloads)


def _shape_of(w: Workload) -> packing.Shape:
    """``w`` as a request shape of the packing mix (on the reference
    model)."""
    model = _REFERENCE_MODEL
    if w.fraction_on(model) >= 1.0 or (w.p2p and w.gpus > 1):
        return packing.Shape.whole_gpus(w.gpus)
    mib = w.memory_on(model)
    return packing.Shape.share(w.cus_on(model) / (model.compute_units or 1),
                               mib / (model.vram_mib or 1), w.gpus, mib)


def plan(conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
         workloads: Sequence[Workload],
         ledger: av_ledger.Ledger | None = None,
         existing: Sequence[Decision] = (),
         invalid: Sequence[tuple[str, exception.WorkloadSpecError]] = ()
         ) -> Plan:
    """Plan ``workloads`` on ``hosts`` (see :class:`Planner`)."""
    return Planner(conf, hosts, ledger, existing).plan(workloads, invalid)
