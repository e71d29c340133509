"""What really runs, as the planner's running placements (pure).

``plan --running-from k8s,placement`` plans new workloads around the
consumers the clouds report instead of around the placements of a state
file. The adapters (:mod:`amdgpu_virt.k8s.pool.running`,
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
* an unhealthy GPU (more uncorrectable RAS errors in its host inventory
  than ``[health] max_uncorrectable``, a verdict of its node, or a cloud
  reporting it unhealthy) is kept occupied whatever runs there (its
  ``held/`` placement says why), or idle without a role: no new work is
  planned onto it, with a warning;
* a GPU that runs a consumer but has no role in the ledger takes the role
  of what runs there (Kubernetes whole GPU or partition:
  ``k8s-dedicated``, Kubernetes slice: ``k8s-shared``, Nova VF:
  ``nova-vf``, Nova whole GPU: ``nova-dedicated``), or ``idle`` when that
  role cannot be given on its host; either way with a warning.

Consumers are taken in a fixed order (host, GPU, name), so the same
state gives the same placements. The values live in
:mod:`~amdgpu_virt.policy.live` (and are named here too); the booking of
one GPU's consumers by its role is :mod:`~amdgpu_virt.policy.livebooking`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.policy import engine as av_engine
from amdgpu_virt.policy import fleetstate
from amdgpu_virt.policy import livebooking
from amdgpu_virt.policy import state as st
from amdgpu_virt.policy.live import CLOUDS
from amdgpu_virt.policy.live import HELD
from amdgpu_virt.policy.live import Holding
from amdgpu_virt.policy.live import KUBERNETES
from amdgpu_virt.policy.live import LiveWarning
from amdgpu_virt.policy.live import NOVA
from amdgpu_virt.policy.live import Running

__all__ = ['CLOUDS', 'HELD', 'Holding', 'KUBERNETES', 'LiveWarning', 'NOVA',
           'Running', 'placements']


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


def unhealthy_gpus(hosts: Sequence[HostInventory],
                   max_uncorrectable: int | None,
                   reported: Mapping[tuple[str, str], str] | None = None
                   ) -> dict[tuple[str, str], str]:
    """(host, GPU address) -> why it is unhealthy: by its host inventory's
    health, and as a cloud ``reported`` it."""
    sick: dict[tuple[str, str], list[str]] = {}
    for inventory in hosts:
        for gpu in inventory.gpus:
            problem = gpu.health.problem(max_uncorrectable) \
                if gpu.health is not None else None
            if problem:
                sick.setdefault((inventory.hostname, str(gpu.address)),
                                []).append(problem)
    for key, reason in sorted((reported or {}).items()):
        sick.setdefault(key, []).append(reason)
    return {key: '; '.join(reasons) for key, reasons in sick.items()}


def placements(conf: cfg.ConfigOpts, hosts: Sequence[HostInventory],
               ledger: av_ledger.Ledger | None,
               holdings: Iterable[Holding],
               unhealthy: Mapping[tuple[str, str], str] | None = None
               ) -> Running:
    """The running placements of ``holdings`` on ``hosts``.

    :param ledger: the GPU roles (the ledger ConfigMap or file); None when
        there is none (every GPU that runs something then takes the role
        of what runs there).
    :param unhealthy: (host, GPU address) -> why a cloud reports it
        unhealthy; the hosts' inventories are judged too (``[health]
        max_uncorrectable``).
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
    sick = {key: why for key, why in unhealthy_gpus(
        hosts, conf.health.max_uncorrectable, unhealthy).items()
        if key in gpus}
    for key, why in sorted(sick.items()):
        warnings.append(LiveWarning(key[0], key[1], '-', 'unhealthy (%s): '
                                    'no new work is planned onto it' % why))
        blocked.setdefault(key, []).append('unhealthy: %s' % why)

    ledger = _fit_ledger(ledger, hosts, warnings)
    engine = av_engine.Engine(conf)
    ledger = _with_roles(conf, hosts, ledger, per_gpu, blocked, warnings,
                         engine)
    booking = livebooking.Booking(fleetstate.FleetState(conf, hosts, ledger,
                                             engine=engine))
    for key in sorted(set(per_gpu) | set(blocked)):
        gs = booking.fleet.gpu_at(key[0], key[1], 'live')
        holdings_here = per_gpu.get(key, [])
        reasons = list(blocked.get(key, []))
        if holdings_here:
            ok = livebooking.book_gpu(booking, gs, holdings_here)
            if not ok:
                reasons.append('its live consumers do not add up (see the '
                               'warnings)')
        if reasons:
            booking.block(gs, '; '.join(reasons))
    warnings.extend(booking.warnings)
    return Running(ledger, tuple(booking.placements()),
                   tuple(sorted(set(warnings))))


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
        elif any(b.startswith('unhealthy: ') for b in blocked.get(key, ())):
            message = 'the GPU has no role in the ledger and is ' \
                'unhealthy: it is kept idle'
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
