"""Nova flavors for GPU VFs and whole GPUs, created or updated idempotently.

Flavors are defined in a YAML file (``[nova] flavors_file``)::

    flavors:
      - name: gpu.mi300x.cpx.1
        vcpus: 16
        ram_mib: 131072
        disk_gb: 100
        alias: amd-mi300x-cpx-vf
        count: 1
        numa_policy: preferred      # optional, default [nova] numa_policy
        isolate: false              # optional: group_policy=isolate
        # gpus: 8                   # optional: count over GPUs 0..7
        extra_specs: {}             # optional, any other extra specs

Each becomes ``pci_passthrough:alias=<alias>:<count>``,
``hw:pci_numa_affinity_policy=<policy>`` and, with ``isolate: true`` (several
VFs that must come from different GPUs), ``group_policy=isolate``; any
other flavor of more than one device gets ``group_policy=none`` (Nova makes
one request group per device and warns at every scheduling of a flavor
with several groups and no policy).

``gpus`` (a count N for GPUs 0..N-1, or a list of GPU indexes) asks
``count / N`` devices of each of those GPUs through their per-GPU aliases
(``<alias>-gpu<n>:<k>,...``, ``[nova] per_gpu_traits``): Nova sends one
request group per device, and with the plain alias each group matches
every identical provider of a host, so Placement enumerates N^count
combinations and a VF on each of 8 GPUs never gets candidates; per-GPU
aliases make every group match exactly one provider.

``disk_gb`` 0 is refused unless allowed explicitly: Nova's default policy
``os_compute_api:servers:create:zero_disk_flavor`` (admin only) refuses
non-admin users to boot such a flavor from an image; it suits
volume-backed instances only.

Nova cannot change a flavor's vCPUs, RAM or disk in place; such a difference
is reported (or, when asked, the flavor is deleted and created again). Extra
specs are updated key by key. A second run with nothing changed makes no
write request.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import yamlutil
from amdgpu_virt.nova.naming import gpu_alias

LOG = logging.getLogger(__name__)

ALIAS_KEY = 'pci_passthrough:alias'
NUMA_KEY = 'hw:pci_numa_affinity_policy'
GROUP_POLICY_KEY = 'group_policy'
MANAGED_KEYS = (ALIAS_KEY, NUMA_KEY, GROUP_POLICY_KEY)
NUMA_POLICIES = ('required', 'legacy', 'preferred', 'socket')
_KEYS = {'name', 'vcpus', 'ram_mib', 'disk_gb', 'alias', 'count',
         'numa_policy', 'isolate', 'gpus', 'extra_specs', 'description'}
#: Nova policy that refuses image boots of ``disk: 0`` flavors to
#: non-admin users by default (rule ``admin``).
ZERO_DISK_POLICY = 'os_compute_api:servers:create:zero_disk_flavor'
#: GPU indexes a flavor may name (per-GPU traits ``..._GPU_<n>``).
MAX_GPU_INDEX = 63
_REQUIRED = ('name', 'vcpus', 'ram_mib', 'alias')


@dataclasses.dataclass(frozen=True)
class FlavorSpec:
    name: str
    vcpus: int
    ram_mib: int
    alias: str
    count: int = 1
    disk_gb: int = 0
    numa_policy: str = 'preferred'
    isolate: bool = False
    extra: tuple[tuple[str, str], ...] = ()
    description: str | None = None
    #: GPU indexes to spread ``count`` over (per-GPU aliases); () = any.
    gpus: tuple[int, ...] = ()

    def alias_value(self) -> str:
        """``pci_passthrough:alias``: one alias, or one per GPU."""
        if not self.gpus:
            return '%s:%d' % (self.alias, self.count)
        each = self.count // len(self.gpus)
        return ','.join('%s:%d' % (gpu_alias(self.alias, i), each)
                        for i in self.gpus)

    def aliases(self) -> tuple[str, ...]:
        """Every alias name the flavor asks for."""
        if not self.gpus:
            return (self.alias,)
        return tuple(gpu_alias(self.alias, i) for i in self.gpus)

    def extra_specs(self) -> dict[str, str]:
        specs = dict(self.extra)
        specs[ALIAS_KEY] = self.alias_value()
        specs[NUMA_KEY] = self.numa_policy
        if self.isolate:
            specs[GROUP_POLICY_KEY] = 'isolate'
        elif self.count > 1:
            # Nova makes one request group per device: with more than one
            # and no policy it warns at every scheduling (and Placement
            # would refuse the query); ``none`` lets devices share a GPU
            specs[GROUP_POLICY_KEY] = 'none'
        return specs


def _int(raw: Mapping[str, Any], key: str, where: str, minimum: int,
         default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) \
            or value < minimum:
        raise exception.ConfigError(
            option='%s.%s' % (where, key),
            reason='%r is not an integer >= %d' % (value, minimum))
    return value


def _gpus(raw: Mapping[str, Any], where: str, count: int,
          isolate: bool) -> tuple[int, ...]:
    value = raw.get('gpus')
    if value is None:
        return ()
    option = '%s.gpus' % where
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_GPU_INDEX + 1:
            raise exception.ConfigError(
                option=option, reason='%r is not a GPU count 1..%d' % (
                    value, MAX_GPU_INDEX + 1))
        indexes = tuple(range(value))
    elif isinstance(value, list) and value and all(
            isinstance(i, int) and not isinstance(i, bool)
            and 0 <= i <= MAX_GPU_INDEX for i in value) \
            and len(set(value)) == len(value):
        indexes = tuple(sorted(value))
    else:
        raise exception.ConfigError(
            option=option, reason='%r is neither a GPU count nor a list of '
            'distinct GPU indexes 0..%d' % (value, MAX_GPU_INDEX))
    if count % len(indexes):
        raise exception.ConfigError(
            option=option, reason='count %d is not a multiple of the %d '
            'GPUs' % (count, len(indexes)))
    if isolate and count > len(indexes):
        raise exception.ConfigError(
            option='%s.isolate' % where, reason='isolate puts every device '
            'on its own GPU, but gpus asks %d per GPU'
            % (count // len(indexes)))
    return indexes


def parse(data: Any, source: str = 'flavors',
          default_numa_policy: str = 'preferred',
          known_aliases: Iterable[str] | None = None,
          allow_zero_disk: bool = False
          ) -> tuple[FlavorSpec, ...]:
    """Validate flavor definitions (parsed YAML).

    :param allow_zero_disk: accept ``disk_gb: 0`` (volume-backed
        instances only, see :data:`ZERO_DISK_POLICY`); otherwise refused.
    :raises ConfigError: naming the file, the entry and the field.
    """
    if not isinstance(data, Mapping) or not isinstance(
            data.get('flavors'), list):
        raise exception.ConfigError(option=source,
                                    reason='expected a mapping with a '
                                    '"flavors" list')
    aliases = set(known_aliases) if known_aliases is not None else None
    result: list[FlavorSpec] = []
    seen: set[str] = set()
    for index, raw in enumerate(data['flavors']):
        where = '%s: flavors[%d]' % (source, index)
        if not isinstance(raw, Mapping):
            raise exception.ConfigError(option=where,
                                        reason='expected a mapping')
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise exception.ConfigError(
                option=where, reason='unknown key(s) %s; allowed: %s' % (
                    ', '.join(map(str, unknown)), ', '.join(sorted(_KEYS))))
        for key in _REQUIRED:
            if key not in raw:
                raise exception.ConfigError(option=where,
                                            reason='%s is required' % key)
        name = raw['name']
        if not isinstance(name, str) or not name or name in seen:
            raise exception.ConfigError(
                option='%s.name' % where,
                reason='%r is empty, not a string or defined twice' % (name,))
        seen.add(name)
        alias = raw['alias']
        if not isinstance(alias, str) or ':' in alias or ',' in alias:
            raise exception.ConfigError(
                option='%s.alias' % where,
                reason='%r must be one alias name (no ":" or ",")' % (alias,))
        numa = raw.get('numa_policy', default_numa_policy)
        if numa not in NUMA_POLICIES:
            raise exception.ConfigError(
                option='%s.numa_policy' % where,
                reason='%r is not one of %s' % (numa,
                                                ', '.join(NUMA_POLICIES)))
        isolate = raw.get('isolate', False)
        if not isinstance(isolate, bool):
            raise exception.ConfigError(option='%s.isolate' % where,
                                        reason='%r is not true/false'
                                        % (isolate,))
        extra = raw.get('extra_specs', {}) or {}
        if not isinstance(extra, Mapping):
            raise exception.ConfigError(option='%s.extra_specs' % where,
                                        reason='expected a mapping')
        clash = sorted(set(extra) & set(MANAGED_KEYS))
        if clash:
            raise exception.ConfigError(
                option='%s.extra_specs' % where,
                reason='%s are set from alias/count/numa_policy/isolate'
                % ', '.join(clash))
        count = _int(raw, 'count', where, 1, 1)
        vcpus = _int(raw, 'vcpus', where, 1)
        ram_mib = _int(raw, 'ram_mib', where, 1)
        disk = _int(raw, 'disk_gb', where, 0, 0)
        if disk == 0 and not allow_zero_disk:
            raise exception.ConfigError(
                option='%s.disk_gb' % where,
                reason='%s (give a root disk size): Nova\'s default policy '
                '%s allows only admins to boot a flavor with disk 0 from an '
                'image; for volume-backed instances only, allow it '
                'explicitly (--allow-zero-disk)' % (
                    'missing' if 'disk_gb' not in raw else '0',
                    ZERO_DISK_POLICY))
        spec = FlavorSpec(
            name=name, vcpus=vcpus, ram_mib=ram_mib, disk_gb=disk,
            alias=alias,
            count=count, numa_policy=numa, isolate=isolate,
            extra=tuple(sorted((str(k), str(v)) for k, v in extra.items())),
            description=raw.get('description'),
            gpus=_gpus(raw, where, count, isolate))
        missing = [a for a in spec.aliases()
                   if aliases is not None and a not in aliases]
        if missing:
            raise exception.ConfigError(
                option='%s.alias' % where,
                reason='alias %s is not rendered by amdgpu-virt; known: %s'
                % (', '.join(missing), ', '.join(sorted(aliases or ()))
                   or 'none'))
        result.append(spec)
    return tuple(result)


def zero_disk(specs: Iterable[FlavorSpec]) -> tuple[str, ...]:
    """Names of the flavors with ``disk_gb`` 0 (to warn about)."""
    return tuple(s.name for s in specs if s.disk_gb == 0)


def load(path: str, default_numa_policy: str = 'preferred',
         known_aliases: Iterable[str] | None = None,
         allow_zero_disk: bool = False) -> tuple[FlavorSpec, ...]:
    return parse(yamlutil.load_file(path, 'flavors file'), path,
                 default_numa_policy, known_aliases, allow_zero_disk)


@dataclasses.dataclass(frozen=True)
class FlavorChange:
    name: str
    action: str          # created | updated | unchanged | replaced | conflict
    details: tuple[str, ...] = ()

    def __str__(self) -> str:
        return '%s: %s%s' % (self.name, self.action, (
            ' (%s)' % '; '.join(self.details)) if self.details else '')


def _shape_diff(spec: FlavorSpec, flavor: Any) -> list[str]:
    diffs = []
    for label, want, have in (('vcpus', spec.vcpus, flavor.vcpus),
                              ('ram', spec.ram_mib, flavor.ram),
                              ('disk', spec.disk_gb, flavor.disk)):
        if int(have or 0) != want:
            diffs.append('%s %s -> %s' % (label, have, want))
    return diffs


def _create(compute: Any, spec: FlavorSpec) -> None:
    attrs: dict[str, Any] = dict(name=spec.name, vcpus=spec.vcpus,
                                 ram=spec.ram_mib, disk=spec.disk_gb)
    if spec.description:
        attrs['description'] = spec.description
    flavor = compute.create_flavor(**attrs)
    compute.create_flavor_extra_specs(flavor, spec.extra_specs())


def sync_one(compute: Any, spec: FlavorSpec,
             replace: bool = False) -> FlavorChange:
    """Make one flavor match ``spec``.

    :param compute: ``connection.compute`` of an openstacksdk connection
        (compute API microversion 2.61 or later, so that flavors carry
        their extra specs).
    :param replace: delete and re-create a flavor whose vCPUs, RAM or disk
        differ (existing instances keep their copy of the old flavor).
    """
    flavor = compute.find_flavor(spec.name, ignore_missing=True)
    if flavor is None:
        _create(compute, spec)
        return FlavorChange(spec.name, 'created')
    shape = _shape_diff(spec, flavor)
    if shape:
        if not replace:
            return FlavorChange(spec.name, 'conflict', tuple(
                shape + ['Nova cannot change these in place; use --replace '
                         'or a new flavor name']))
        compute.delete_flavor(flavor)
        _create(compute, spec)
        return FlavorChange(spec.name, 'replaced', tuple(shape))
    have = dict(flavor.extra_specs or {})
    want = spec.extra_specs()
    details = []
    for key in sorted(want):
        if have.get(key) != want[key]:
            compute.update_flavor_extra_specs_property(flavor, key,
                                                       want[key])
            details.append('%s=%s' % (key, want[key]))
    for key in MANAGED_KEYS:
        if key in have and key not in want:
            compute.delete_flavor_extra_specs_property(flavor, key)
            details.append('-%s' % key)
    if details:
        return FlavorChange(spec.name, 'updated', tuple(details))
    return FlavorChange(spec.name, 'unchanged')


def sync(compute: Any, specs: Iterable[FlavorSpec],
         replace: bool = False) -> tuple[FlavorChange, ...]:
    """Create or update every flavor; a converged cloud gets no write."""
    # imported here: openstacksdk is heavy, and rendering needs none of it
    from openstack import exceptions as sdk_exceptions

    changes = []
    for spec in specs:
        try:
            change = sync_one(compute, spec, replace)
        except sdk_exceptions.SDKException as err:
            raise exception.NovaApiError(
                request='flavor %s' % spec.name, reason=str(err)) from None
        LOG.debug('flavor %s', change)
        changes.append(change)
    return tuple(changes)
