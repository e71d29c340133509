"""The role ledger: which role each GPU of each host plays.

A ledger is the declarative split of one GPU pool between OpenStack Nova and
Kubernetes. The planner writes one; operators may write or edit one by hand.
File format (YAML)::

    version: 1
    hosts:
      compute-1:
        gpus:
          - {address: "0000:05:00.0", model: MI300X, role: nova-vf,
             vf_count: 8}
          - {address: "0000:26:00.0", model: MI300X, role: k8s-shared,
             compute_mode: SPX, memory_mode: NPS1}

Loading rejects what would be unsafe: a GPU listed twice (two roles), an
unknown role, a VF count or partition mode the model cannot take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import yamlutil
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role

LEDGER_VERSION = 1
_GPU_KEYS = {'address', 'model', 'role', 'vf_count', 'compute_mode',
             'memory_mode'}


@dataclasses.dataclass(frozen=True, order=True)
class GpuAssignment:
    """The role of one GPU, and the mode that role needs."""

    host: str
    address: PciAddress
    role: Role
    model: str
    vf_count: int | None = None
    compute_mode: str | None = None
    memory_mode: str | None = None

    @property
    def key(self) -> tuple[str, PciAddress]:
        return (self.host, self.address)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {'address': str(self.address),
                                'model': self.model,
                                'role': self.role.value}
        for name in ('vf_count', 'compute_mode', 'memory_mode'):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        return data


@dataclasses.dataclass(frozen=True)
class Ledger:
    """Every assigned GPU of a fleet, at most one assignment per GPU."""

    assignments: tuple[GpuAssignment, ...] = ()

    def __post_init__(self) -> None:
        seen: dict[tuple[str, PciAddress], GpuAssignment] = {}
        for item in self.assignments:
            other = seen.get(item.key)
            if other is not None:
                raise exception.PlanError(
                    source='ledger', reason='GPU %s of host %s has two roles '
                    '(%s and %s)' % (item.address, item.host,
                                     other.role.value, item.role.value))
            seen[item.key] = item
        object.__setattr__(self, 'assignments',
                           tuple(sorted(self.assignments)))

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({a.host for a in self.assignments}))

    def for_host(self, host: str) -> tuple[GpuAssignment, ...]:
        return tuple(a for a in self.assignments if a.host == host)

    def get(self, host: str, address: PciAddress | str
            ) -> GpuAssignment | None:
        if isinstance(address, str):
            address = PciAddress.parse(address)
        for item in self.assignments:
            if item.host == host and item.address == address:
                return item
        return None

    def to_dict(self) -> dict[str, Any]:
        hosts: dict[str, Any] = {}
        for item in self.assignments:
            hosts.setdefault(item.host, {'gpus': []})['gpus'].append(
                item.to_dict())
        return {'version': LEDGER_VERSION, 'hosts': hosts}

    def dumps(self) -> str:
        return yamlutil.dump(self.to_dict())


def _assignment(host: str, index: int, raw: Any,
                source: str) -> GpuAssignment:
    where = '%s: hosts.%s.gpus[%d]' % (source, host, index)
    if not isinstance(raw, Mapping):
        raise exception.PlanError(source=where, reason='expected a mapping')
    unknown = set(raw) - _GPU_KEYS
    if unknown:
        raise exception.PlanError(
            source=where, reason='unknown key(s) %s; allowed: %s' % (
                ', '.join(sorted(map(str, unknown))),
                ', '.join(sorted(_GPU_KEYS))))
    for required in ('address', 'role', 'model'):
        if required not in raw:
            raise exception.PlanError(source=where,
                                      reason='%s is required' % required)
    try:
        address = PciAddress.parse(str(raw['address']))
        role = Role(raw['role'])
    except exception.AmdgpuVirtError as err:
        raise exception.PlanError(source=where, reason=str(err)) from None
    except ValueError:
        raise exception.PlanError(
            source=where, reason='role %r is not one of %s' % (
                raw['role'], ', '.join(r.value for r in Role))) from None
    try:
        model = catalog.by_name(str(raw['model']))
    except exception.UnknownModel as err:
        raise exception.PlanError(source=where, reason=str(err)) from None
    vf_count = raw.get('vf_count')
    compute_mode = raw.get('compute_mode')
    memory_mode = raw.get('memory_mode')
    try:
        if role is Role.NOVA_VF:
            if not isinstance(vf_count, int) or isinstance(vf_count, bool):
                raise exception.PlanError(
                    source=where, reason='vf_count (an integer) is required '
                    'for role nova-vf')
            catalog.check_vf_count(model, vf_count)
        elif vf_count is not None:
            raise exception.PlanError(
                source=where, reason='vf_count is only valid for nova-vf')
        if compute_mode is not None or memory_mode is not None:
            catalog.check_modes(model, str(compute_mode or 'SPX'),
                                str(memory_mode or 'NPS1'))
    except exception.InvalidPartitionMode as err:
        raise exception.PlanError(source=where, reason=str(err)) from None
    return GpuAssignment(
        host=host, address=address, role=role, model=model.name,
        vf_count=vf_count,
        compute_mode=str(compute_mode).upper() if compute_mode else None,
        memory_mode=str(memory_mode).upper() if memory_mode else None)


def from_dict(data: Any, source: str = 'ledger') -> Ledger:
    """Build a :class:`Ledger` from parsed YAML, validating everything.

    :raises PlanError: naming the file, the host, the GPU entry and field.
    """
    if not isinstance(data, Mapping) or 'hosts' not in data:
        raise exception.PlanError(source=source,
                                  reason='expected a mapping with "hosts"')
    if data.get('version', LEDGER_VERSION) != LEDGER_VERSION:
        raise exception.PlanError(
            source=source, reason='version %r is not supported (expected %d)'
            % (data.get('version'), LEDGER_VERSION))
    hosts = data['hosts'] or {}
    if not isinstance(hosts, Mapping):
        raise exception.PlanError(source=source,
                                  reason='hosts must be a mapping')
    items: list[GpuAssignment] = []
    for host, body in hosts.items():
        gpus = (body or {}).get('gpus', []) if isinstance(body, Mapping) \
            else None
        if not isinstance(gpus, list):
            raise exception.PlanError(
                source='%s: hosts.%s' % (source, host),
                reason='expected a mapping with a "gpus" list')
        items.extend(_assignment(str(host), i, raw, source)
                     for i, raw in enumerate(gpus))
    try:
        return Ledger(tuple(items))
    except exception.PlanError as err:
        raise exception.PlanError(source=source,
                                  reason=err.kwargs['reason']) from None


def load(path: str) -> Ledger:
    return from_dict(yamlutil.load_file(path), source=path)


def build(assignments: Iterable[GpuAssignment]) -> Ledger:
    return Ledger(tuple(assignments))
