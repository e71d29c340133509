"""Placement audit: do Nova's PCI providers match the plan? (read-only)

For each host, the providers Nova reports for PCI devices (named
``<node>_<PCI ADDRESS upper-cased>``) are compared with the offers of the
host's plan: resource class, total, and traits. Differences are typed
:class:`Finding` objects; usage per GPU is reported as :class:`GpuUsage`.

API calls (GET only):

* one call for the whole fleet: every provider with the
  ``COMPUTE_MANAGED_PCI_DEVICE`` trait (names, uuids, roots);
* per host, one allocation-candidates query for one unit of an expected
  resource class in the host's tree: its provider summaries carry every
  provider's capacities, usage and traits;
* only when that query has no candidate (no free unit of the class, or the
  class is missing), three calls per provider of the host (inventories,
  usages, traits).

So a converged host with a free unit costs one call (plus its share of the
fleet call); a host with no provider at all costs none.

Placement does not show a device's type, so the rendered alias
``device_type`` of every whole GPU is checked against the host's inventory
when one was read (:func:`device_type_findings`): nova-compute reports a
GPU with ``sriov_totalvfs`` > 0 as ``type-PF``, any other as ``type-PCI``,
and an alias of the other type never matches the device.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Iterable, Sequence

from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Role
from amdgpu_virt.nova import naming
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.placement import PCI_TRAIT
from amdgpu_virt.nova.placement import PlacementReader
from amdgpu_virt.nova.placement import Provider
from amdgpu_virt.nova.placement import ProviderState
from amdgpu_virt.nova.plan import GpuOffer
from amdgpu_virt.nova.plan import HostPlan

LOG = logging.getLogger(__name__)


class FindingKind(str, enum.Enum):
    MISSING_PROVIDER = 'missing-provider'
    EXTRA_PROVIDER = 'extra-provider'
    WRONG_RESOURCE_CLASS = 'wrong-resource-class'
    WRONG_TOTAL = 'wrong-total'
    WRONG_TRAITS = 'wrong-traits'
    WRONG_DEVICE_TYPE = 'wrong-device-type'


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One difference between the plan and Placement."""

    host: str
    provider: str
    kind: FindingKind
    expected: str
    actual: str

    def __str__(self) -> str:
        return '%s %s: %s (expected %s, found %s)' % (
            self.host, self.provider, self.kind.value, self.expected,
            self.actual)


@dataclasses.dataclass(frozen=True, order=True)
class GpuUsage:
    host: str
    address: str
    provider: str
    resource_class: str
    total: int
    used: int


@dataclasses.dataclass(frozen=True)
class HostAudit:
    host: str
    findings: tuple[Finding, ...] = ()
    usage: tuple[GpuUsage, ...] = ()
    api_calls: int = 0

    @property
    def converged(self) -> bool:
        return not self.findings


@dataclasses.dataclass(frozen=True)
class AuditReport:
    hosts: tuple[HostAudit, ...]
    api_calls: int

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for h in self.hosts for f in h.findings)

    @property
    def usage(self) -> tuple[GpuUsage, ...]:
        return tuple(u for h in self.hosts for u in h.usage)


def _address_of(provider_name: str, host: str) -> str:
    return provider_name[len(host) + 1:].lower()


def _fmt(values: Iterable[str]) -> str:
    return ','.join(sorted(values)) or '-'


def _compare(host: str, offer: GpuOffer, name: str,
             state: ProviderState) -> list[Finding]:
    findings = []
    totals = dict(state.totals)
    if offer.resource_class not in totals:
        findings.append(Finding(host, name, FindingKind.WRONG_RESOURCE_CLASS,
                                offer.resource_class, _fmt(totals)))
    elif totals[offer.resource_class] != offer.total:
        findings.append(Finding(host, name, FindingKind.WRONG_TOTAL,
                                str(offer.total),
                                str(totals[offer.resource_class])))
    expected = set(offer.traits) | {PCI_TRAIT}
    # Nova adds standard traits of its own (OWNER_NOVA, HW_PCI_*); only
    # custom traits must match exactly.
    actual_custom = {t for t in state.traits if t.startswith('CUSTOM_')}
    missing = expected - state.traits
    extra = actual_custom - expected
    if missing or extra:
        findings.append(Finding(host, name, FindingKind.WRONG_TRAITS,
                                _fmt(expected),
                                _fmt(actual_custom | (state.traits & {
                                    PCI_TRAIT}))))
    return findings


def _audit_host(plan: HostPlan, providers: Sequence[Provider],
                reader: PlacementReader) -> HostAudit:
    host = plan.hostname
    start = reader.calls
    expected = {naming.provider_name(host, str(o.address)): o
                for o in plan.offers}
    actual = {p.name: p for p in providers}
    findings: list[Finding] = []
    usage: list[GpuUsage] = []
    for name in sorted(set(expected) - set(actual)):
        offer = expected[name]
        findings.append(Finding(host, name, FindingKind.MISSING_PROVIDER,
                                '%s:%d' % (offer.resource_class, offer.total),
                                '-'))
    states: dict[str, ProviderState] | None = None
    if actual and expected:
        root = next(iter(actual.values())).root_uuid
        rc = sorted({o.resource_class for o in expected.values()})[0]
        states = reader.tree_states(root, rc)
    for name in sorted(actual):
        provider = actual[name]
        state = None
        if states is not None:
            state = states.get(provider.uuid)
        if state is None:
            state = reader.provider_state(provider.uuid)
        found = expected.get(name)
        if found is None:
            findings.append(Finding(host, name, FindingKind.EXTRA_PROVIDER,
                                    '-', _fmt('%s:%d' % item for item in
                                              state.totals.items())))
            for rc, total in sorted(state.totals.items()):
                usage.append(GpuUsage(host, _address_of(name, host), name,
                                      rc, total, state.used.get(rc, 0)))
            continue
        findings.extend(_compare(host, found, name, state))
        for rc, total in sorted(state.totals.items()):
            usage.append(GpuUsage(host, str(found.address), name, rc, total,
                                  state.used.get(rc, 0)))
    return HostAudit(host=host, findings=tuple(sorted(findings)),
                     usage=tuple(sorted(usage)),
                     api_calls=reader.calls - start)


def _with(host: HostAudit, findings: Iterable[Finding]) -> HostAudit:
    extra = tuple(findings)
    if not extra:
        return host
    return dataclasses.replace(host, findings=tuple(sorted(
        host.findings + extra)))


def device_type_findings(plans: Iterable[HostPlan],
                         inventories: Iterable[HostInventory]
                         ) -> tuple[Finding, ...]:
    """Whole-GPU offers whose alias ``device_type`` the host contradicts.

    Expected is what nova-compute will report for the device (from
    ``sriov_totalvfs``, :func:`~amdgpu_virt.nova.plan.host_device_type`),
    actual the rendered alias's type. Hosts without an inventory are
    skipped (pure).
    """
    by_host = {inv.hostname: inv for inv in inventories}
    findings = []
    for plan in plans:
        inventory = by_host.get(plan.hostname)
        if inventory is None:
            continue
        gpus = {gpu.address: gpu for gpu in inventory.gpus}
        for offer in plan.offers:
            gpu = gpus.get(offer.address)
            if offer.role is not Role.NOVA_DEDICATED or gpu is None:
                continue
            want = nova_plan.host_device_type(gpu)
            if offer.device_type != want:
                findings.append(Finding(
                    plan.hostname,
                    naming.provider_name(plan.hostname, str(offer.address)),
                    FindingKind.WRONG_DEVICE_TYPE,
                    '%s (sriov_totalvfs %s)' % (want, gpu.sriov_totalvfs),
                    '%s (alias %s)' % (offer.device_type, offer.alias)))
    return tuple(sorted(findings))


def audit(plans: Sequence[HostPlan], reader: PlacementReader,
          inventories: Iterable[HostInventory] = ()) -> AuditReport:
    """Compare every host's plan with Placement and, for the hosts whose
    inventory is given, every whole GPU's alias type with the host.

    :raises PlacementError: a Placement request failed (naming it).
    """
    start = reader.calls
    by_host: dict[str, list[Provider]] = {p.hostname: [] for p in plans}
    for provider in reader.pci_providers():
        host, sep, _address = provider.name.rpartition('_')
        if sep and host in by_host:
            by_host[host].append(provider)
    types: dict[str, list[Finding]] = {}
    for finding in device_type_findings(plans, inventories):
        types.setdefault(finding.host, []).append(finding)
    hosts = tuple(_with(_audit_host(plan, by_host[plan.hostname], reader),
                        types.get(plan.hostname, ()))
                  for plan in sorted(plans, key=lambda p: p.hostname))
    LOG.debug('audited %d hosts with %d Placement calls', len(hosts),
             reader.calls - start)
    return AuditReport(hosts=hosts, api_calls=reader.calls - start)
