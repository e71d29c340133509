"""What really runs, as the planner's running placements (pure).

``plan --running-from k8s,placement`` plans new workloads around the
consumers the clouds report instead of around the placements of a state
file. The adapters (:mod:`amdgpu_virt.k8s.running`,
:mod:`amdgpu_virt.nova.running`) turn what they read into
:class:`Holding` values; :func:`placements` turns those into ``existing``
:class:`~amdgpu_virt.policy.decision.Decision` values the planner keeps,
checked against the inventories and the ledger the same way the planner
books them.

Live state is input, not truth. Whatever does not add up is a
:class:`LiveWarning` naming the consumer and the GPU, never an error and
never dropped, and the GPU stays occupied (fail closed: no new workload
is planned onto a GPU a live consumer holds):

* a consumer on a host that has no inventory, or on a GPU its host's
  inventory lacks: warned, nothing to keep (the GPU is not planned); a
  ledger entry of such a GPU is left out, warned;
* a consumer whose GPU is unknown (a device the node does not register,
  an unreadable annotation or record): every GPU of its host is kept
  occupied;
* a slice larger than its GPU (or partition), or of nothing at all
  (0 CUs, 0 MiB), CUs or VFs that overlap
  another consumer's, two consumers of one whole GPU, a consumer of the
  other cloud or of an idle GPU: the GPU is kept occupied by a
  placement named ``held/<host>/<address>`` holding what is left of it;
* a whole device (a GPU or partition claim) on a ``k8s-shared`` GPU keeps
  all of it, with a warning;
* a GPU that runs a consumer but has no role in the ledger takes the role
  of what runs there (Kubernetes whole GPU or partition:
  ``k8s-dedicated``, Kubernetes slice: ``k8s-shared``, Nova VF:
  ``nova-vf``, Nova whole GPU: ``nova-dedicated``), or ``idle`` when that
  role cannot be given on its host; either way with a warning.

Consumers are taken in a fixed order (host, GPU, name), so the same
state gives the same placements.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Kind
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import fleetstate
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.sharing import allocator

KUBERNETES = 'kubernetes'
NOVA = 'nova'
CLOUDS = (KUBERNETES, NOVA)
#: the prefix of the placements that keep an odd GPU occupied
HELD = 'held'
_K8S_ROLES = (Role.K8S_SHARED, Role.K8S_DEDICATED)
_NOVA_ROLES = (Role.NOVA_VF, Role.NOVA_DEDICATED)
_DEDICATED = (Role.NOVA_DEDICATED, Role.K8S_DEDICATED)


@dataclasses.dataclass(frozen=True)
class Holding:
    """What one consumer holds on one GPU, as a cloud reports it.

    :ivar consumer: the workload name of the consumer (``pod/<namespace>/
        <name>``, ``claim/<namespace>/<name>``, ``instance/<uuid>``).
    :ivar cloud: :data:`KUBERNETES` or :data:`NOVA`.
    :ivar address: the GPU's PCI address; None when it is unknown (then
        ``problem`` says why).
    :ivar whole: the whole GPU, or with ``partition`` a whole partition.
    :ivar partition: the compute partition the holding lives in (None: the
        GPU is not partitioned, or the holding is the whole GPU).
    :ivar compute_units: CUs of a slice.
    :ivar memory_mib: MiB of a slice.
    :ivar cus: the slice's CU ids in its partition, when the cloud knows
        them (else the lowest free ones are booked).
    :ivar vfs: VFs held (Nova, VF GPUs).
    :ivar what: how the cloud names the consumer, for reasons.
    :ivar problem: why what it holds cannot be read (the GPU, or every GPU
        of the host when ``address`` is None, is kept occupied).
    """

    consumer: str
    cloud: str
    host: str
    address: str | None
    whole: bool = False
    partition: int | None = None
    compute_units: int = 0
    memory_mib: int = 0
    cus: tuple[int, ...] | None = None
    vfs: int = 0
    what: str = ''
    problem: str | None = None

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise ValueError('cloud %r is not one of %s' % (
                self.cloud, ', '.join(CLOUDS)))
        if self.address is not None:
            try:
                object.__setattr__(self, 'address',
                                   str(PciAddress.parse(self.address)))
            except exception.InvalidPciAddress:
                object.__setattr__(self, 'problem', self.problem or (
                    'GPU %r is not a PCI address' % self.address[:64]))
                object.__setattr__(self, 'address', None)

    @property
    def label(self) -> str:
        return self.what or self.consumer


@dataclasses.dataclass(frozen=True, order=True)
class LiveWarning:
    """Something odd in the live state, naming the consumer and the GPU."""

    host: str
    gpu: str
    consumer: str
    message: str

    def __str__(self) -> str:
        return '%s on %s%s: %s' % (
            self.consumer, self.host,
            ' GPU %s' % self.gpu if self.gpu else '', self.message)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Running:
    """Running placements, the ledger they need, and the warnings.

    :ivar ledger: the given ledger plus a role for every GPU that runs a
        consumer but had none (None when there was no ledger and nothing
        runs).
    """

    ledger: av_ledger.Ledger | None
    placements: tuple[Decision, ...]
    warnings: tuple[LiveWarning, ...]


def _derived_role(gs: st.GpuState, holdings: Sequence[Holding]
                  ) -> Role | None:
    """The role of what runs on a GPU without one (None: nothing sane)."""
    clouds = {h.cloud for h in holdings}
    if len(clouds) != 1:
        return None
    if clouds == {NOVA}:
        vfs = bool(gs.gpu.vfs or gs.gpu.sriov_numvfs) or len(holdings) > 1 \
            or any(h.vfs > 1 for h in holdings)
        return Role.NOVA_VF if vfs else Role.NOVA_DEDICATED
    if any(h.whole for h in holdings):
        return Role.K8S_DEDICATED
    return Role.K8S_SHARED


class _Booking:
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
            if (mask or mib) and not self.keep(gs, h, Kind.CU, [Grant(
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
            for pool in gs.pools:
                free = pool.alloc.free_mask
                if free or pool.mem_free > 0:
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


def _merged(holdings: Sequence[Holding]) -> list[Holding]:
    """One holding per consumer and device (two containers of one pod on
    one GPU hold the sum)."""
    merged: dict[tuple[str, str, int | None], Holding] = {}
    for h in holdings:
        key = (h.consumer, h.cloud, h.partition)
        other = merged.get(key)
        if other is None:
            merged[key] = h
            continue
        cus = None
        if other.cus is not None and h.cus is not None:
            cus = tuple(sorted(set(other.cus) | set(h.cus)))
        merged[key] = dataclasses.replace(
            other, whole=other.whole or h.whole,
            compute_units=other.compute_units + h.compute_units,
            memory_mib=other.memory_mib + h.memory_mib, cus=cus,
            vfs=other.vfs + h.vfs)
    return list(merged.values())


def _cloud_of(role: Role | None) -> str | None:
    if role in _K8S_ROLES:
        return KUBERNETES
    if role in _NOVA_ROLES:
        return NOVA
    return None


def placements(conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
               ledger: av_ledger.Ledger | None,
               holdings: Iterable[Holding]) -> Running:
    """The running placements of ``holdings`` on ``hosts``.

    :param ledger: the GPU roles (the ledger ConfigMap or file); None when
        there is none (every GPU that runs something then takes the role
        of what runs there).
    :raises PlanError: the ledger does not match the inventories (naming
        the entry), as for ``plan --ledger``.
    """
    warnings: list[LiveWarning] = []
    inventories = {inv.hostname: inv for inv in hosts}
    gpus = {(inv.hostname, str(g.address)) for inv in hosts
            for g in inv.gpus}
    per_gpu: dict[tuple[str, str], list[Holding]] = {}
    blocked: dict[tuple[str, str], list[str]] = {}
    for h in sorted(holdings, key=lambda h: (h.host, h.address or '',
                                             h.consumer)):
        if h.host not in inventories:
            warnings.append(LiveWarning(h.host, h.address or '', h.consumer,
                                        'host %s has no inventory: nothing '
                                        'is kept for it' % h.host))
            continue
        if h.address is None:
            warnings.append(LiveWarning(
                h.host, '', h.consumer, '%s; it may be on any GPU of the '
                'host: every GPU of %s is kept occupied' % (
                    h.problem or 'its GPU is unknown', h.host)))
            for gpu in inventories[h.host].gpus:
                blocked.setdefault((h.host, str(gpu.address)), []).append(
                    '%s may hold it (%s)' % (h.consumer, h.problem))
            continue
        key = (h.host, h.address)
        if key not in gpus:
            warnings.append(LiveWarning(
                h.host, h.address, h.consumer, 'the inventory of host %s '
                'has no GPU at %s: nothing is kept for it' % key))
            continue
        if h.problem:
            warnings.append(LiveWarning(h.host, h.address, h.consumer,
                                        h.problem))
            blocked.setdefault(key, []).append('%s: %s' % (h.consumer,
                                                           h.problem))
            continue
        per_gpu.setdefault(key, []).append(h)
    per_gpu = {key: _merged(items) for key, items in per_gpu.items()}

    ledger = _fit_ledger(ledger, hosts, warnings)
    engine = av_engine.Engine(conf)
    ledger = _with_roles(conf, hosts, ledger, per_gpu, blocked, warnings,
                         engine)
    booking = _Booking(fleetstate.FleetState(conf, hosts, ledger,
                                             engine=engine))
    for key in sorted(set(per_gpu) | set(blocked)):
        gs = booking.fleet.gpu_at(key[0], key[1], 'live')
        holdings_here = per_gpu.get(key, [])
        reasons = list(blocked.get(key, []))
        if holdings_here:
            ok = _book_gpu(booking, gs, holdings_here)
            if not ok:
                reasons.append('its live consumers do not add up (see the '
                               'warnings)')
        if reasons:
            booking.block(gs, '; '.join(reasons))
    warnings.extend(booking.warnings)
    return Running(ledger, tuple(booking.placements()),
                   tuple(sorted(set(warnings))))


def _book_gpu(booking: _Booking, gs: st.GpuState,
              holdings: Sequence[Holding]) -> bool:
    role = gs.role
    cloud = _cloud_of(role)
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


def _fit_ledger(ledger: av_ledger.Ledger | None,
                hosts: Sequence[HostInventory],
                warnings: list[LiveWarning]) -> av_ledger.Ledger | None:
    """``ledger`` without the entries of GPUs the inventories lack (a
    cluster's ledger outlives decommissioned hosts), each warned."""
    if ledger is None:
        return None
    gpus = {(inv.hostname, g.address) for inv in hosts for g in inv.gpus}
    names = {inv.hostname for inv in hosts}
    kept = []
    for item in ledger.assignments:
        if item.key in gpus:
            kept.append(item)
            continue
        warnings.append(LiveWarning(
            item.host, str(item.address), '-', 'the ledger gives this GPU '
            'role %s, but %s: the entry is left out' % (
                item.role.value, 'the host has no inventory'
                if item.host not in names else 'its host\'s inventory has '
                'no GPU there')))
    if len(kept) == len(ledger.assignments):
        return ledger
    return av_ledger.build(kept)


def _with_roles(conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
                ledger: av_ledger.Ledger | None,
                per_gpu: dict[tuple[str, str], list[Holding]],
                blocked: dict[tuple[str, str], list[str]],
                warnings: list[LiveWarning],
                engine: av_engine.Engine) -> av_ledger.Ledger | None:
    """``ledger`` with a role for every GPU that runs something and has
    none."""
    missing = [key for key in sorted(set(per_gpu) | set(blocked))
               if ledger is None or ledger.get(*key) is None]
    if not missing:
        return ledger
    base = fleetstate.FleetState(conf, hosts, ledger, engine=engine)
    added: list[av_ledger.GpuAssignment] = []
    for key in missing:
        gs = base.gpu_at(key[0], key[1], 'live')
        holdings = per_gpu.get(key, [])
        role = _derived_role(gs, holdings) if holdings else None
        vf_count = None
        why = ''
        if role is not None:
            allowed = base.role_ok(gs, role)[0]
            if role is Role.NOVA_VF:
                vf_count = base.vf_count_on(gs)
                allowed = allowed and vf_count is not None
            if not allowed:
                why = ' (%s is not possible on host %s)' % (role.value,
                                                           key[0])
                role = None
        final = role or Role.IDLE
        consumers = [h.consumer for h in holdings] or ['-']
        if holdings:
            message = 'the GPU has no role in the ledger; it takes role %s ' \
                'from what runs there%s' % (final.value, why)
        else:
            message = 'the GPU has no role in the ledger and what runs ' \
                'there is unknown: it is kept idle'
        warnings.append(LiveWarning(key[0], key[1], ', '.join(consumers),
                                    message))
        added.append(av_ledger.GpuAssignment(
            key[0], PciAddress.parse(key[1]), final, gs.model.name,
            vf_count=vf_count if final is Role.NOVA_VF else None))
    result = av_ledger.build((ledger.assignments if ledger else ()) +
                             tuple(added))
    try:
        fleetstate.FleetState(conf, hosts, result, engine=engine)
    except exception.PlanError as err:
        # roles of two driver families on one host: keep the new ones idle
        for item in added:
            if item.role is not Role.IDLE:
                warnings.append(LiveWarning(
                    item.host, str(item.address), '-', 'role %s cannot be '
                    'given with the other roles of the host (%s); the GPU is '
                    'kept idle' % (item.role.value, err)))
        result = av_ledger.build(
            (ledger.assignments if ledger else ()) + tuple(
                dataclasses.replace(a, role=Role.IDLE, vf_count=None)
                for a in added))
    return result
