"""Nova ``[pci]`` configuration: ``device_spec`` and ``alias`` (pure).

Rules the rendering keeps (Nova refuses or misbehaves otherwise):

* ``[pci] report_in_placement = True``; one ``device_spec`` per group of
  devices sharing a resource class and traits. VFs are selected by vendor and
  VF product id plus an address glob covering exactly the PCI slots their own
  PF's VFs occupy (``0000:85:02.*``); a whole GPU by vendor, PF product id
  and its exact address. A PF is never listed together with its own VFs, and
  all VFs of one PF get the same resource class and traits.
* Every alias carries ``vendor_id``, ``product_id``, ``device_type`` and
  ``numa_policy``: Nova without ``pci_in_placement`` refuses aliases without
  ids, and aliases sharing a name must agree on type and policy.
* Nova silently accepts unknown ``device_spec`` keys (``resouce_class`` is a
  no-op there), so every key is checked against the ones Nova reads.
* ``managed`` is ``no`` by default: devices are bound to vfio-pci at boot and
  libvirt must not rebind them at runtime (rebinding AMD VFs/PFs at runtime
  has hung hosts).

Output is sorted and stable, so a second run renders the same bytes.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.ledger import Ledger
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.naming import CUSTOM_NAME_RE
from amdgpu_virt.nova.naming import gpu_alias
from amdgpu_virt.nova.naming import Naming
from amdgpu_virt.nova.plan import GpuOffer
from amdgpu_virt.nova.plan import HostPlan

#: Keys Nova 34 reads from a ``[pci] device_spec`` entry.
DEVICE_SPEC_KEYS = frozenset({
    'vendor_id', 'product_id', 'address', 'devname', 'physical_network',
    'trusted', 'remote_managed', 'managed', 'live_migratable',
    'resource_class', 'traits', 'one_time_use'})
#: Keys Nova 34 accepts in a ``[pci] alias`` entry.
ALIAS_KEYS = frozenset({
    'name', 'vendor_id', 'product_id', 'device_type', 'numa_policy',
    'resource_class', 'traits', 'live_migratable'})
DEVICE_TYPES = ('type-PCI', 'type-PF', 'type-VF')
NUMA_POLICIES = ('required', 'legacy', 'preferred', 'socket')
_BOOL_TAGS = ('trusted', 'remote_managed', 'managed', 'live_migratable',
              'one_time_use')
_HEX4_RE = re.compile(r'^(0x)?[0-9a-fA-F]{1,4}$')
_ALIAS_HEX_RE = re.compile(r'^[0-9a-fA-F]{4}$')
_STANDARD_TRAIT_RE = re.compile(r'^[A-Z][A-Z0-9_]*$')

CONFIG_FILE_NAME = 'amdgpu-virt-pci.conf'


def _unknown_key(keys: Iterable[str], allowed: frozenset[str], what: str,
                 host: str) -> None:
    for key in sorted(keys):
        if key in allowed:
            continue
        close = difflib.get_close_matches(key, sorted(allowed), n=1)
        hint = ('; did you mean %r?' % close[0]) if close else ''
        raise exception.NovaConfigError(
            host=host, reason='unknown %s key %r (Nova would silently ignore '
            'it)%s; allowed keys: %s' % (what, key, hint,
                                         ', '.join(sorted(allowed))))


def _check_traits(value: Any, what: str, host: str) -> None:
    if not isinstance(value, str) or not value:
        raise exception.NovaConfigError(
            host=host, reason='%s traits must be a non-empty string, got %r'
            % (what, value))
    for name in value.split(','):
        if name != name.strip() or not name:
            raise exception.NovaConfigError(
                host=host, reason='%s traits %r: Nova does not trim trait '
                'names; remove spaces and empty items' % (what, value))
        if name.startswith('CUSTOM_'):
            if not CUSTOM_NAME_RE.match(name) or len(name) > 255:
                raise exception.NovaConfigError(
                    host=host, reason='%s trait %r is not a valid custom '
                    'trait (^CUSTOM_[A-Z0-9_]+$)' % (what, name))
        elif not _STANDARD_TRAIT_RE.match(name):
            raise exception.NovaConfigError(
                host=host, reason='%s trait %r: use upper case letters, '
                'digits and _' % (what, name))


def validate_device_spec(spec: Mapping[str, Any], host: str = '-') -> None:
    """Check one ``device_spec`` entry as Nova with Placement needs it.

    :raises NovaConfigError: naming the host, the key and what is wrong.
    """
    _unknown_key(spec, DEVICE_SPEC_KEYS, 'device_spec', host)
    for key in ('vendor_id', 'product_id'):
        if key in spec and not (isinstance(spec[key], str)
                                and _HEX4_RE.match(spec[key])):
            raise exception.NovaConfigError(
                host=host, reason='device_spec %s %r is not a hex id' % (
                    key, spec[key]))
    if 'devname' in spec:
        raise exception.NovaConfigError(
            host=host, reason='device_spec key devname cannot be used with '
            '[pci] report_in_placement')
    if 'address' not in spec and 'vendor_id' not in spec:
        raise exception.NovaConfigError(
            host=host, reason='device_spec %s selects every PCI device; give '
            'an address or vendor_id' % json.dumps(dict(spec), sort_keys=True))
    if 'resource_class' in spec:
        rc = spec['resource_class']
        if not isinstance(rc, str) or not CUSTOM_NAME_RE.match(rc) \
                or len(rc) > 255:
            raise exception.NovaConfigError(
                host=host, reason='device_spec resource_class %r is not a '
                'valid custom resource class' % (rc,))
    if 'traits' in spec:
        _check_traits(spec['traits'], 'device_spec', host)
    for key in _BOOL_TAGS:
        if key in spec and str(spec[key]).lower() not in (
                'true', 'false', 'yes', 'no', '1', '0', 'on', 'off'):
            raise exception.NovaConfigError(
                host=host, reason='device_spec %s %r is not a boolean' % (
                    key, spec[key]))


def validate_alias(alias: Mapping[str, Any], host: str = '-') -> None:
    """Check one ``[pci] alias`` entry; see :data:`ALIAS_KEYS`.

    :raises NovaConfigError: naming the alias and the key.
    """
    _unknown_key(alias, ALIAS_KEYS, 'alias', host)
    name = alias.get('name')
    if not isinstance(name, str) or not name or len(name) > 256:
        raise exception.NovaConfigError(
            host=host, reason='alias name %r must be 1..256 characters'
            % (name,))
    for key in ('vendor_id', 'product_id'):
        value = alias.get(key)
        if not isinstance(value, str) or not _ALIAS_HEX_RE.match(value):
            raise exception.NovaConfigError(
                host=host, reason='alias %s: %s %r must be exactly 4 hex '
                'digits (always given, so Nova accepts the alias without '
                'pci_in_placement)' % (name, key, value))
    if alias.get('device_type') not in DEVICE_TYPES:
        raise exception.NovaConfigError(
            host=host, reason='alias %s: device_type %r must be one of %s'
            % (name, alias.get('device_type'), ', '.join(DEVICE_TYPES)))
    if alias.get('numa_policy') not in NUMA_POLICIES:
        raise exception.NovaConfigError(
            host=host, reason='alias %s: numa_policy %r must be one of %s'
            % (name, alias.get('numa_policy'), ', '.join(NUMA_POLICIES)))
    if 'resource_class' in alias and not CUSTOM_NAME_RE.match(
            str(alias['resource_class'])):
        raise exception.NovaConfigError(
            host=host, reason='alias %s: resource_class %r is not a valid '
            'custom resource class' % (name, alias['resource_class']))
    if 'traits' in alias:
        _check_traits(alias['traits'], 'alias %s' % name, host)


def dumps(entry: Mapping[str, Any]) -> str:
    """One config value: compact JSON with sorted keys."""
    return json.dumps(dict(entry), sort_keys=True, separators=(',', ':'))


def _hex(value: int) -> str:
    return '%04x' % value


def _address_selectors(offer: GpuOffer,
                       others: frozenset[tuple[int, int, int]]
                       ) -> list[str | dict[str, str]]:
    """Address matchers that select exactly ``offer``'s VFs.

    One glob per PCI slot the VFs occupy; if a slot is shared with a function
    that is not one of these VFs, a regex on the function numbers instead.
    """
    slots: dict[tuple[int, int, int], list[int]] = {}
    for vf in offer.vf_addresses:
        slots.setdefault((vf.domain, vf.bus, vf.device), []).append(
            vf.function)
    result: list[str | dict[str, str]] = []
    for (domain, bus, device), functions in sorted(slots.items()):
        if (domain, bus, device) not in others:
            result.append('%04x:%02x:%02x.*' % (domain, bus, device))
        else:
            result.append({'domain': '%04x' % domain, 'bus': '%02x' % bus,
                           'slot': '%02x' % device,
                           'function': '[%s]' % ''.join(
                               str(f) for f in sorted(functions))})
    return result


def _slots_of_other_functions(all_functions: Iterable[PciAddress],
                              offer: GpuOffer
                              ) -> frozenset[tuple[int, int, int]]:
    mine = set(offer.vf_addresses)
    return frozenset((a.domain, a.bus, a.device) for a in all_functions
                     if a not in mine)


def host_functions(inventory: HostInventory) -> tuple[PciAddress, ...]:
    """Every PCI function (PFs and VFs) of a host's GPUs."""
    return tuple(sorted([g.address for g in inventory.gpus]
                        + [vf.address for g in inventory.gpus
                           for vf in g.vfs]))


def device_specs(plan: HostPlan, managed: bool = False,
                 extra_tags: Mapping[str, Any] | None = None,
                 all_functions: Iterable[PciAddress] = ()
                 ) -> tuple[dict[str, Any], ...]:
    """The ``device_spec`` entries of a host, validated and sorted.

    :param all_functions: every PCI function of the host's GPUs (PFs and
        VFs), so that a VF glob never covers a function of another device.
    :raises NovaConfigError: an entry Nova would reject or misread.
    """
    functions = tuple(all_functions)
    if not functions:
        functions = tuple(o.address for o in plan.offers) + tuple(
            vf for o in plan.offers for vf in o.vf_addresses)
    extra = dict(extra_tags or {})
    specs: list[dict[str, Any]] = []
    for offer in plan.offers:
        base: dict[str, Any] = dict(extra)
        base.update({
            'vendor_id': _hex(offer.vendor_id),
            'product_id': _hex(offer.product_id),
            'resource_class': offer.resource_class,
            'traits': ','.join(offer.traits),
            'managed': 'yes' if managed else 'no'})
        if offer.role is Role.NOVA_VF:
            others = _slots_of_other_functions(functions, offer)
            for selector in _address_selectors(offer, others):
                specs.append(dict(base, address=selector))
        else:
            specs.append(dict(base, address=str(offer.address)))
    for spec in specs:
        validate_device_spec(spec, plan.hostname)
    _check_no_pf_with_its_vfs(plan)
    return tuple(sorted(specs, key=dumps))


def _check_no_pf_with_its_vfs(plan: HostPlan) -> None:
    seen: dict[PciAddress, GpuOffer] = {}
    for offer in plan.offers:
        other = seen.get(offer.address)
        if other is not None:
            raise exception.NovaConfigError(
                host=plan.hostname, reason='GPU %s is offered both as %s and '
                '%s; Nova refuses a PF together with its own VFs' % (
                    offer.address, other.role.value, offer.role.value))
        seen[offer.address] = offer


@dataclasses.dataclass(frozen=True, order=True)
class AliasSpec:
    name: str
    vendor_id: int
    product_id: int
    device_type: str
    resource_class: str
    #: required traits (comma separated); a per-GPU alias requires the
    #: GPU's trait so that each of its request groups matches one provider.
    traits: str = ''

    def to_dict(self, numa_policy: str) -> dict[str, Any]:
        entry = {'name': self.name, 'vendor_id': _hex(self.vendor_id),
                 'product_id': _hex(self.product_id),
                 'device_type': self.device_type,
                 'numa_policy': numa_policy,
                 'resource_class': self.resource_class}
        if self.traits:
            entry['traits'] = self.traits
        return entry


def alias_of(offer: GpuOffer) -> AliasSpec:
    """The alias of every GPU like ``offer``'s (any GPU of a host)."""
    return AliasSpec(name=offer.alias, vendor_id=offer.vendor_id,
                     product_id=offer.product_id,
                     device_type=offer.device_type,
                     resource_class=offer.resource_class)


def aliases_of(offer: GpuOffer) -> list[AliasSpec]:
    """The alias of ``offer`` and, with a per-GPU trait, its per-GPU
    alias ``<alias>-gpu<n>`` requiring that trait."""
    result = [alias_of(offer)]
    if offer.gpu_trait is not None and offer.gpu_index is not None:
        result.append(dataclasses.replace(
            result[0], name=gpu_alias(offer.alias, offer.gpu_index),
            traits=offer.gpu_trait))
    return result


def aliases(specs: Iterable[AliasSpec], numa_policy: str = 'preferred',
            host: str = '-') -> tuple[dict[str, Any], ...]:
    """Validated, de-duplicated ``[pci] alias`` entries.

    :raises NovaConfigError: two different definitions share a name.
    """
    by_name: dict[str, AliasSpec] = {}
    for spec in specs:
        other = by_name.setdefault(spec.name, spec)
        if other != spec:
            raise exception.NovaConfigError(
                host=host, reason='alias %s would mean both %s and %s; make '
                'the alias templates tell them apart' % (
                    spec.name, other, spec))
    result = [by_name[name].to_dict(numa_policy) for name in sorted(by_name)]
    for entry in result:
        validate_alias(entry, host)
    return tuple(result)


def ledger_alias_specs(ledger: Ledger, naming: Naming,
                       device_type: str = 'auto') -> list[AliasSpec]:
    """Alias definitions for every Nova role of a ledger (for controllers)."""
    return [spec for plan in nova_plan.plan_from_ledger(
        ledger, naming, device_type) for offer in plan.offers
        for spec in aliases_of(offer)]


def _header(title: str, notes: Iterable[str]) -> list[str]:
    lines = ['# %s' % title,
             '# Generated by amdgpu-virt; edits are overwritten.']
    notes = list(notes)
    if notes:
        lines.append('#')
        lines.extend('# %s' % note for note in notes)
    return lines


def render_compute(plan: HostPlan, numa_policy: str = 'preferred',
                   managed: bool = False,
                   extra_tags: Mapping[str, Any] | None = None,
                   all_functions: Iterable[PciAddress] = ()) -> str:
    """The ``nova.conf.d`` snippet of one compute host."""
    specs = device_specs(plan, managed, extra_tags, all_functions)
    alias_entries = aliases((a for o in plan.offers for a in aliases_of(o)),
                            numa_policy, plan.hostname)
    notes = ['%s: %s' % (p.address, p.reason) for p in plan.pending]
    lines = _header('Nova PCI passthrough of AMD GPUs on %s' % plan.hostname,
                    notes)
    lines += ['', '[pci]', 'report_in_placement = True']
    if not specs:
        lines.append('# no GPU of this host is offered to Nova')
    lines += ['device_spec = %s' % dumps(s) for s in specs]
    lines += ['alias = %s' % dumps(a) for a in alias_entries]
    return '\n'.join(lines) + '\n'


def render_aliases(entries: Sequence[Mapping[str, Any]],
                   title: str = 'Nova PCI aliases of AMD GPUs') -> str:
    """The ``nova.conf.d`` snippet for API, scheduler and conductor hosts."""
    lines = _header(title, [
        'Set [filter_scheduler] pci_in_placement = True only once every',
        'compute host reports its PCI devices to Placement.'])
    lines += ['', '[pci]']
    lines += ['alias = %s' % dumps(a) for a in entries]
    return '\n'.join(lines) + '\n'
