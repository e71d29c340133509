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
unknown role, a VF count or partition mode the model cannot take. Given the
hosts' inventories, loading also rejects a role the GPU itself cannot take
(a GPU the host does not have, VFs on a GPU without SR-IOV or with fewer
VFs than asked, a partition mode the GPU does not list) and a host whose
GPUs would need different memory (NPS) modes: the NPS mode is set for a
whole XGMI hive (by GIM for the whole host).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import yamlutil
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role

LEDGER_VERSION = 1
_GPU_KEYS = {'address', 'model', 'role', 'vf_count', 'compute_mode',
             'memory_mode'}


@dataclasses.dataclass(frozen=True, order=True, slots=True)
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

    @property
    def gpu(self) -> str:
        """``host:address``, as commands and messages name a GPU."""
        return '%s:%s' % (self.host, self.address)

    def required_memory_mode(self) -> str | None:
        """The NPS mode this role needs (None when it needs none).

        A ``nova-vf`` GPU runs in the mode GIM uses for its VF count
        unless the entry says otherwise.
        """
        if self.memory_mode:
            return self.memory_mode
        if self.role is Role.NOVA_VF and self.vf_count:
            return catalog.gim_memory_mode(catalog.by_name(self.model),
                                           self.vf_count)
        return None

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

    @functools.cached_property
    def _by_host(self) -> dict[str, tuple[GpuAssignment, ...]]:
        index: dict[str, list[GpuAssignment]] = {}
        for item in self.assignments:
            index.setdefault(item.host, []).append(item)
        return {host: tuple(items) for host, items in index.items()}

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted(self._by_host))

    def for_host(self, host: str) -> tuple[GpuAssignment, ...]:
        return self._by_host.get(host, ())

    def get(self, host: str, address: PciAddress | str
            ) -> GpuAssignment | None:
        if isinstance(address, str):
            address = PciAddress.parse(address)
        for item in self.for_host(host):
            if item.address == address:
                return item
        return None

    def replace(self, assignment: GpuAssignment) -> Ledger:
        """This ledger with ``assignment`` instead of its GPU's entry."""
        return Ledger(tuple(a for a in self.assignments
                            if a.key != assignment.key) + (assignment,))

    def restrict(self, hosts: Iterable[str]) -> Ledger:
        """Only the entries of ``hosts``."""
        wanted = set(hosts)
        return Ledger(tuple(a for a in self.assignments if a.host in wanted))

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
    address_raw = raw['address']
    if not isinstance(address_raw, str):
        raise exception.PlanError(source=where, reason=(
            'field address: %r is a number: YAML reads an unquoted address '
            'such as 0000:05:00.0 as one (base 60); write it quoted, as '
            'address: "0000:05:00.0"' if isinstance(address_raw, (int, float))
            and not isinstance(address_raw, bool) else
            'field address: %r is not a PCI address string') % (address_raw,))
    try:
        address = PciAddress.parse(address_raw)
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
    if 'version' not in data:
        raise exception.PlanError(
            source=source, reason='no "version": a ledger starts with '
            '"version: %d" (is this a ledger? "amdgpu-virt plan '
            '--output-ledger FILE" writes one)' % LEDGER_VERSION)
    if data.get('version') != LEDGER_VERSION:
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


def _gpu_problem(item: GpuAssignment, gpu: Gpu) -> tuple[str, str] | None:
    """(field, reason) when ``gpu`` cannot take ``item``'s role."""
    model = gpu.model
    if model.known and model.name != item.model:
        return 'model', 'the ledger says %s, the host has %s' % (
            item.model, model.name)
    if item.role is Role.NOVA_VF:
        try:
            catalog.check_vf_count(model, item.vf_count or 0)
        except exception.InvalidPartitionMode as err:
            return 'vf_count', str(err)
        if gpu.sriov_totalvfs is not None and \
                gpu.sriov_totalvfs < (item.vf_count or 0):
            return 'vf_count', 'the GPU offers at most %d VFs (sriov_' \
                'totalvfs)' % gpu.sriov_totalvfs
    if item.role is Role.NOVA_DEDICATED and not model.known:
        return 'role', 'nova-dedicated needs a GPU model the catalog knows ' \
            '(device id %04x is not in it)' % gpu.device_id
    if item.role in (Role.K8S_SHARED, Role.K8S_DEDICATED):
        for field, want, have in (
                ('compute_mode', item.compute_mode,
                 gpu.available_compute_partitions),
                ('memory_mode', item.memory_mode,
                 gpu.available_memory_partitions)):
            listed = {m.upper() for m in have}
            if want and listed and want not in listed:
                return field, 'role %s needs %s, the GPU offers only %s' % (
                    item.role.value, want, ', '.join(sorted(listed)))
    return None


def check_hardware(ledger: Ledger, inventories: Iterable[HostInventory],
                   source: str = 'ledger') -> None:
    """Reject roles the hosts' GPUs cannot take.

    Hosts without an inventory are not checked. Errors name the file, the
    host, the GPU and the field.

    :raises PlanError: a GPU the host does not have, a role its model or
        the GPU itself cannot take, or one host (or XGMI hive) whose GPUs
        need different memory (NPS) modes.
    """
    by_host = {inv.hostname: inv for inv in inventories}
    for host in ledger.hosts:
        inventory = by_host.get(host)
        if inventory is None:
            continue
        gpus = {gpu.address: gpu for gpu in inventory.gpus}
        groups: dict[object, list[tuple[GpuAssignment, str]]] = {}
        gim = any(a.role is Role.NOVA_VF for a in ledger.for_host(host))
        for item in ledger.for_host(host):
            where = '%s: host %s GPU %s' % (source, host, item.address)
            gpu = gpus.get(item.address)
            if gpu is None:
                raise exception.PlanError(
                    source=where, reason='field address: the host has no '
                    'GPU there (it has %s)' % (', '.join(
                        str(a) for a in sorted(gpus)) or 'none'))
            problem = _gpu_problem(item, gpu)
            if problem is not None:
                raise exception.PlanError(
                    source=where, reason='field %s: %s' % problem)
            mode = item.required_memory_mode()
            if mode:
                # NPS is per XGMI hive; GIM sets it for the whole host,
                # and a host without hive information is one domain.
                hive = gpu.hive_id if gpu.hive_id and not gim else 'host'
                groups.setdefault(hive, []).append((item, mode))
        for members in groups.values():
            modes = sorted({mode for _item, mode in members})
            if len(modes) > 1:
                raise exception.PlanError(
                    source='%s: host %s' % (source, host),
                    reason='field memory_mode: the memory (NPS) mode is one '
                    'per host (XGMI hive), but its GPUs need %s' % '; '.join(
                        '%s %s (%s)' % (item.address, mode, item.role.value)
                        for item, mode in members))


def load(path: str, inventories: Iterable[HostInventory] | None = None
         ) -> Ledger:
    """Load and validate the ledger file ``path`` (with a version and at
    least one GPU).

    :param inventories: when given, also :func:`check_hardware`.
    :raises PlanError: naming the file, host, GPU and field.
    """
    ledger = from_dict(yamlutil.load_file(path, 'ledger'), source=path)
    if not ledger.assignments:
        # a GPU without an entry is no GPU of the pool: an empty file
        # would withdraw (apply) or flag (audit) every GPU
        raise exception.PlanError(
            source=path, reason='it gives no GPU a role (hosts is empty); '
            'list every GPU of the pool, idle ones with role idle')
    if inventories is not None:
        check_hardware(ledger, inventories, path)
    return ledger


def save(ledger: Ledger, path: str, extra: Mapping[str, Any] | None = None
         ) -> bool:
    """Write ``ledger`` to ``path`` atomically, unless already equal.

    :param extra: other top-level keys to keep (e.g. ``placements``).
    :returns: True when the file was written.
    :raises OutputError: the file cannot be written (naming it).
    """
    data = ledger.to_dict()
    data.update({k: v for k, v in (extra or {}).items()
                 if k not in data})
    return fileutil.write_if_changed(path, yamlutil.dump(data))


def build(assignments: Iterable[GpuAssignment]) -> Ledger:
    return Ledger(tuple(assignments))
