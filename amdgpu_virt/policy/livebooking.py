"""Booking live consumers onto the planner's fleet state, GPU by GPU
(pure; see :mod:`amdgpu_virt.policy.running`).

A GPU's consumers are booked the way its ledger role holds work: one
whole-GPU placement (``nova-dedicated``, ``k8s-dedicated``), VFs
(``nova-vf``), CU slices in the GPU's partitions (``k8s-shared``). What
does not fit is a :class:`~amdgpu_virt.policy.live.LiveWarning`, and
:meth:`Booking.block` then holds what is left of the GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from amdgpu_virt import exception
from amdgpu_virt.model import Kind
from amdgpu_virt.model import Role
from amdgpu_virt.policy import fleetstate
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.policy.live import HELD
from amdgpu_virt.policy.live import Holding
from amdgpu_virt.policy.live import KUBERNETES
from amdgpu_virt.policy.live import LiveWarning
from amdgpu_virt.policy.live import NOVA
from amdgpu_virt.sharing import allocator

_K8S_ROLES = (Role.K8S_SHARED, Role.K8S_DEDICATED)
_NOVA_ROLES = (Role.NOVA_VF, Role.NOVA_DEDICATED)
_DEDICATED = (Role.NOVA_DEDICATED, Role.K8S_DEDICATED)


class Booking:
    """Books live consumers GPU by GPU onto a planner fleet state."""

    def __init__(self, fleet: fleetstate.FleetState) -> None:
        self.fleet = fleet
        self.warnings: list[LiveWarning] = []
        #: consumer -> kind -> (host, grants, labels)
        self.grants: dict[tuple[str, Kind], tuple[str, list[Grant],
                                                  list[str]]] = {}
        self.held: list[Decision] = []

    def warn(self, gs: st.GpuState, consumer: str, message: str) -> None:
        self.warnings.append(LiveWarning(gs.host.name, gs.address, consumer,
                                         message))

    def keep(self, gs: st.GpuState, holding: Holding, kind: Kind,
             grants: list[Grant]) -> bool:
        """Hold ``grants`` for ``holding``; False (and a warning) when the
        fleet state refuses them (a consumer that names one device twice
        in two ways)."""
        try:
            self.fleet.hold(Decision(holding.consumer, Code.PLACED,
                                     'running', kind=kind,
                                     host=gs.host.name,
                                     grants=tuple(grants)),
                            'live: %s' % holding.consumer)
        except exception.PlanError as err:
            self.warn(gs, holding.consumer, 'cannot be kept as it is: %s'
                      % err)
            return False
        entry = self.grants.setdefault((holding.consumer, kind),
                                       (gs.host.name, [], []))
        if entry[0] != gs.host.name:
            # one name on two hosts: a second workload
            self.warn(gs, holding.consumer, 'the same consumer also holds '
                      'GPUs of host %s; kept as a second placement' % entry[0])
            entry = self.grants.setdefault(
                ('%s@%s' % (holding.consumer, gs.host.name), kind),
                (gs.host.name, [], []))
        entry[1].extend(grants)
        if holding.label not in entry[2]:
            entry[2].append(holding.label)
        return True

    # -- per role ------------------------------------------------------------

    def dedicated(self, gs: st.GpuState, holdings: Sequence[Holding]
                  ) -> bool:
        """One placement of the whole GPU; False when consumers overlap."""
        ok = True
        taken: dict[int | None, str] = {}
        for h in holdings:
            part = h.partition     # None: the whole GPU
            if part is None:
                clash = next(iter(taken.values()), None)
            else:
                clash = taken.get(None) or taken.get(part)
            if clash is not None:
                self.warn(gs, h.consumer, 'overlaps %s on this %s GPU '
                          '(%s): two consumers of one device' % (
                              clash, gs.role.value if gs.role else '-',
                              'partition %d' % part if part is not None
                              else 'the whole GPU'))
                ok = False
            taken.setdefault(part, h.consumer)
        first = holdings[0]
        others = [h.label for h in holdings[1:]]
        return self.keep(gs, dataclasses.replace(
            first, what=first.label + (' with %s' % ', '.join(others)
                                       if others else '')),
            Kind.DEDICATED, [Grant(gs.address, gs.vram, gs.cus)]) and ok

    def vf(self, gs: st.GpuState, holdings: Sequence[Holding]) -> bool:
        ok = True
        cus, mib = gs.vf_unit()
        for h in holdings:
            wanted = max(h.vfs, 1)
            free = sorted(gs.vf_free)
            if wanted > len(free):
                self.warn(gs, h.consumer, 'holds %d VF(s), but only %d of '
                          'the %d VFs are free' % (wanted, len(free),
                                                   gs.vf_count or 0))
                ok = False
            taken = free[:wanted]
            if taken and not self.keep(gs, h, Kind.VF, [
                    Grant(gs.address, mib, cus, vf_index=i) for i in taken]):
                ok = False
        return ok

    def _pool(self, gs: st.GpuState, h: Holding) -> st.Pool | None:
        if len(gs.pools) == 1 and h.partition in (None, 0):
            return gs.pools[0]
        return next((p for p in gs.pools if p.partition == h.partition),
                    None)

    def shared(self, gs: st.GpuState, holdings: Sequence[Holding]) -> bool:
        ok = True
        expanded: list[Holding] = []
        for h in holdings:
            if h.whole:
                # a share device's claims are slices: a whole device here
                # was allocated before the GPU became k8s-shared
                self.warn(gs, h.consumer, 'holds %s as a whole device, but '
                          'the ledger role is k8s-shared: it keeps all of it'
                          % ('partition %d' % h.partition
                             if h.partition is not None else 'the GPU'))
            if h.whole and h.partition is None and len(gs.pools) > 1:
                # the whole of a partitioned GPU: every partition
                expanded += [dataclasses.replace(h, partition=p.partition)
                             for p in gs.pools]
            else:
                expanded.append(h)
        for h in expanded:
            pool = self._pool(gs, h)
            where = 'partition %d' % h.partition \
                if h.partition is not None else 'the GPU'
            if pool is None:
                self.warn(gs, h.consumer, 'holds a slice of partition %s, '
                          'which this GPU does not have as k8s-shared (%d '
                          'partition(s))' % (h.partition, len(gs.pools)))
                ok = False
                continue
            alloc = pool.alloc
            count = alloc.total if h.whole else h.compute_units
            mib = pool.mem_total if h.whole else h.memory_mib
            if not (count or mib or h.cus):
                self.warn(gs, h.consumer, 'holds a slice of 0 CUs and 0 MiB '
                          'of %s: what it uses is unknown' % where)
                ok = False
                continue
            if count > alloc.total or mib > pool.mem_total or count < 0 \
                    or mib < 0:
                self.warn(gs, h.consumer, 'holds a slice of %d CUs and %d '
                          'MiB, larger than %s (%d CUs, %d MiB)' % (
                              count, mib, where, alloc.total,
                              pool.mem_total))
                ok = False
                continue
            if h.cus is not None and not h.whole:
                outside = [c for c in h.cus if not 0 <= c < alloc.total]
                if outside:
                    self.warn(gs, h.consumer, 'holds CU %d, outside the '
                              '%d CUs of %s' % (outside[0], alloc.total,
                                                where))
                    ok = False
                    continue
                mask = allocator.mask_of(h.cus)
                count = mask.bit_count()
            else:
                wanted = min(alloc.round_up(count), alloc.free_count)
                mask = allocator.take_low(alloc.free_mask, wanted) \
                    if wanted else 0
            clash = mask & ~alloc.free_mask
            if clash or mask.bit_count() < count:
                cu = (clash & -clash).bit_length() - 1 if clash else None
                self.warn(gs, h.consumer, (
                    'its CU %d overlaps %s' % (cu, alloc.owner_of(cu))
                    if cu is not None else
                    'holds %d CUs of %s, but only %d are free'
                    % (count, where, alloc.free_count)))
                ok = False
                mask &= alloc.free_mask
            if mib > pool.mem_free:
                self.warn(gs, h.consumer, 'holds %d MiB of %s, but only %d '
                          'MiB are free (memory over-committed)' % (
                              mib, where, pool.mem_free))
                ok = False
                mib = pool.mem_free
            if not mask:
                if not count:
                    self.warn(gs, h.consumer, 'holds %d MiB of %s but no CU: '
                              'what it uses is unknown' % (mib, where))
                ok = False
                continue
            if not self.keep(gs, h, Kind.CU, [Grant(
                    gs.address, mib, count, cus=allocator.ids_of(mask),
                    partition=pool.partition)]):
                ok = False
        return ok

    def block(self, gs: st.GpuState, why: str) -> None:
        """Hold whatever is left of ``gs`` (fail closed)."""
        name = '%s/%s/%s' % (HELD, gs.host.name, gs.address)
        grants: list[Grant] = []
        kind: Kind | None = None
        if gs.role in _DEDICATED and gs.owner is None:
            kind, grants = Kind.DEDICATED, [Grant(gs.address, gs.vram,
                                                  gs.cus)]
        elif gs.role is Role.NOVA_VF:
            cus, mib = gs.vf_unit()
            kind, grants = Kind.VF, [Grant(gs.address, mib, cus, vf_index=i)
                                     for i in sorted(gs.vf_free)]
        elif gs.role is Role.K8S_SHARED:
            kind = Kind.CU
            # every slice counts against [policy] max_slices_per_gpu: once
            # the GPU holds that many, no new slice goes there, so the
            # pools past the cap need no grant
            room = self.fleet.max_slices - gs.slices
            for pool in gs.pools:
                free = pool.alloc.free_mask
                if free and len(grants) < room:
                    grants.append(Grant(
                        gs.address, max(pool.mem_free, 0),
                        free.bit_count(), cus=allocator.ids_of(free),
                        partition=pool.partition))
        if kind is None or not grants:
            return
        decision = Decision(name, Code.PLACED, 'kept occupied: %s' % why,
                            kind=kind, host=gs.host.name,
                            grants=tuple(grants), existing=True)
        self.fleet.hold(decision, 'live: %s' % name)
        self.held.append(decision)

    def placements(self) -> list[Decision]:
        result = []
        first: dict[str, Kind] = {}
        for name, kind in self.grants:
            first.setdefault(name, kind)
        for (name, kind), (host, grants, labels) in sorted(
                self.grants.items(), key=lambda i: (i[0][0], i[0][1].value)):
            workload = name if first[name] is kind else '%s@%s' % (
                name, kind.value)
            result.append(Decision(
                workload, Code.PLACED, 'running: %s' % '; '.join(labels),
                kind=kind, host=host, grants=tuple(grants), existing=True))
        return result + self.held



def cloud_of(role: Role | None) -> str | None:
    if role in _K8S_ROLES:
        return KUBERNETES
    if role in _NOVA_ROLES:
        return NOVA
    return None



def book_gpu(booking: Booking, gs: st.GpuState,
              holdings: Sequence[Holding]) -> bool:
    role = gs.role
    cloud = cloud_of(role)
    mine = [h for h in holdings if h.cloud == cloud]
    ok = True
    for h in holdings:
        if h.cloud != cloud:
            booking.warn(gs, h.consumer, 'a %s consumer (%s) of a GPU whose '
                         'ledger role is %s' % (
                             'Kubernetes' if h.cloud == KUBERNETES else
                             'Nova', h.label, role.value if role else 'none'))
            ok = False
    if not mine:
        return ok
    if role in _DEDICATED:
        return booking.dedicated(gs, mine) and ok
    if role is Role.NOVA_VF:
        return booking.vf(gs, mine) and ok
    return booking.shared(gs, mine) and ok

