"""Workload specifications: what one VM or pod needs from GPUs.

A workload is written in YAML (or built in Python) as::

    name: llm-train
    platform: vm            # vm | pod | any
    tenancy: isolated       # isolated | trusted
    gpus: 4                 # GPUs (or VFs, or CU slices on distinct GPUs)
    memory: whole           # per GPU: 24GiB, 30 GB, 4096MiB, or whole
    compute: whole          # per GPU: CUs (76), a whole percentage ("25%"),
                            # or whole
    p2p: true               # needs GPU peer-to-peer DMA between its GPUs
    sensitivity: high       # interference sensitivity: low | medium | high
    model: MI300X           # optional: a model name or a list of them
    numa_node: 0            # optional: every GPU on this NUMA node
    same_numa: false        # optional: all GPUs on one NUMA node
    priority: 100           # higher is placed first

Validation collects every problem of a workload before it fails, and each
problem names its field and the values allowed there.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt import yamlutil
from amdgpu_virt.model import GpuModel
from amdgpu_virt.sharing import hami

MAX_GPUS = 64
#: The largest per-GPU memory a spec may ask for (1 TiB).
MAX_MEMORY_MIB = 1024 * 1024
MAX_CUS = 1024
MAX_PRIORITY = 1_000_000
_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$')
_SIZE_RE = re.compile(r'^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]*)\s*$')
_PCT_RE = re.compile(r'^\s*(?P<num>\d+(?:\.\d+)?)\s*%\s*$')
#: unit -> MiB per unit
UNITS: Mapping[str, float] = {
    'mib': 1.0, 'gib': 1024.0, 'tib': 1024.0 * 1024,
    'mb': 1e6 / 2 ** 20, 'gb': 1e9 / 2 ** 20, 'tb': 1e12 / 2 ** 20,
}
_UNIT_NAMES = 'MiB, GiB, TiB, MB, GB, TB'
WHOLE = 'whole'


class Platform(str, enum.Enum):
    # members hash as their value, in C (an Enum's own hash is Python
    # code, and workload shapes are hashed at every placement)
    __hash__ = str.__hash__

    VM = 'vm'
    POD = 'pod'
    ANY = 'any'


class Tenancy(str, enum.Enum):
    #: does not trust its neighbours (or is not trusted by them)
    ISOLATED = 'isolated'
    #: shares a GPU cooperatively with other trusted workloads
    TRUSTED = 'trusted'

    __hash__ = str.__hash__


class Sensitivity(str, enum.Enum):
    __hash__ = str.__hash__

    LOW = 'low'
    MEDIUM = 'medium'
    HIGH = 'high'

    @property
    def level(self) -> int:
        return ('low', 'medium', 'high').index(self.value)


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """What one workload needs. Sizes are per GPU.

    ``memory_mib`` None means the whole memory of the GPU; ``cus`` and
    ``percent`` both None mean all its compute units.
    """

    name: str
    platform: Platform = Platform.ANY
    tenancy: Tenancy = Tenancy.ISOLATED
    gpus: int = 1
    memory_mib: int | None = None
    cus: int | None = None
    percent: int | None = None
    p2p: bool = False
    sensitivity: Sensitivity = Sensitivity.MEDIUM
    models: tuple[str, ...] = ()
    numa_node: int | None = None
    same_numa: bool = False
    priority: int = 0

    def __post_init__(self) -> None:
        problems = _check(self)
        if problems:
            raise exception.WorkloadSpecError(self.name, problems)

    # -- derived sizes ------------------------------------------------------

    @property
    def whole_compute(self) -> bool:
        return self.cus is None and self.percent is None

    @property
    def whole_memory(self) -> bool:
        return self.memory_mib is None

    @property
    def whole(self) -> bool:
        """Asks for every CU and all memory of each GPU."""
        return self.whole_compute and self.whole_memory

    def cus_on(self, model: GpuModel) -> int:
        """CUs per GPU on ``model``.

        A percentage is converted as the extender does
        (:func:`amdgpu_virt.sharing.hami.percent_to_cus`: HAMi's
        ``floor(pct * total / 100)`` clamped to ``[1, total]``, in whole
        allocation units of the model), of the whole physical GPU.
        """
        total = model.compute_units or 0
        if self.cus is not None:
            return self.cus
        if self.percent is not None:
            if total <= 0:
                return 0
            return hami.percent_to_cus(self.percent, total,
                                       model.cu_alloc_unit)
        return total

    def memory_on(self, model: GpuModel) -> int:
        """MiB per GPU on ``model`` (``whole`` is all of its VRAM)."""
        if self.memory_mib is not None:
            return self.memory_mib
        return model.vram_mib or 0

    def fraction_on(self, model: GpuModel) -> float:
        """The larger of the CU and memory share of one GPU of ``model``."""
        total = model.compute_units or 1
        vram = model.vram_mib or 1
        return max(self.cus_on(model) / total, self.memory_on(model) / vram)

    def allows_model(self, model: GpuModel) -> bool:
        return not self.models or model.name in self.models

    @property
    def wants_vm(self) -> bool:
        return self.platform is not Platform.POD

    @property
    def wants_pod(self) -> bool:
        return self.platform is not Platform.VM

    def shape(self) -> tuple[Any, ...]:
        """Everything but the name and priority (a cache key)."""
        return (self.platform, self.tenancy, self.gpus, self.memory_mib,
                self.cus, self.percent, self.p2p, self.sensitivity,
                self.models, self.numa_node, self.same_numa)

    # -- display ------------------------------------------------------------

    def describe_compute(self) -> str:
        if self.cus is not None:
            return '%d CUs' % self.cus
        if self.percent is not None:
            return '%d%% of the CUs' % self.percent
        return 'all CUs'

    def describe_memory(self) -> str:
        if self.memory_mib is None:
            return 'all memory'
        return '%d MiB' % self.memory_mib

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            'name': self.name, 'platform': self.platform.value,
            'tenancy': self.tenancy.value, 'gpus': self.gpus,
            'memory': WHOLE if self.memory_mib is None
            else '%dMiB' % self.memory_mib,
            'compute': (self.cus if self.cus is not None else
                        '%d%%' % self.percent if self.percent is not None
                        else WHOLE),
            'p2p': self.p2p, 'sensitivity': self.sensitivity.value,
            'priority': self.priority}
        if self.models:
            data['model'] = list(self.models)
        if self.numa_node is not None:
            data['numa_node'] = self.numa_node
        if self.same_numa:
            data['same_numa'] = True
        return data


def _check(w: Workload) -> list[str]:
    """Problems of an already typed workload (ranges, combinations)."""
    problems = []
    if not isinstance(w.name, str) or not _NAME_RE.match(w.name):
        problems.append('name: %r must be 1-128 letters, digits, "_", "." '
                        'or "-", starting with a letter or digit' % (w.name,))
    if not 1 <= w.gpus <= MAX_GPUS:
        problems.append('gpus: %r is out of range; allowed: 1..%d'
                        % (w.gpus, MAX_GPUS))
    if w.memory_mib is not None and not 1 <= w.memory_mib <= MAX_MEMORY_MIB:
        problems.append('memory: %r MiB is out of range; allowed: 1 MiB..'
                        '1 TiB per GPU, or "whole"' % (w.memory_mib,))
    if w.cus is not None and not 1 <= w.cus <= MAX_CUS:
        problems.append('compute: %r CUs is out of range; allowed: 1..%d '
                        'CUs, a percentage 1%%..100%%, or "whole"'
                        % (w.cus, MAX_CUS))
    if w.percent is not None:
        try:
            hami.parse_percent(w.percent, 'compute')
        except exception.HamiProtocolError:
            problems.append('compute: %r%% is out of range; allowed: a '
                            'whole percentage 1%%..100%%' % (w.percent,))
    if w.cus is not None and w.percent is not None:
        problems.append('compute: give CUs or a percentage, not both')
    if w.numa_node is not None and not 0 <= w.numa_node <= 63:
        problems.append('numa_node: %r is out of range; allowed: 0..63'
                        % (w.numa_node,))
    if not -MAX_PRIORITY <= w.priority <= MAX_PRIORITY:
        problems.append('priority: %r is out of range; allowed: %d..%d'
                        % (w.priority, -MAX_PRIORITY, MAX_PRIORITY))
    known = set(catalog.names())
    for model in w.models:
        if model not in known:
            problems.append('model: %r is not a known model; allowed: %s'
                            % (model, ', '.join(catalog.names())))
    return problems


# -- parsing ------------------------------------------------------------------

FIELDS = ('name', 'platform', 'tenancy', 'gpus', 'memory', 'compute', 'p2p',
          'sensitivity', 'model', 'numa_node', 'same_numa', 'priority')


def parse_memory(value: Any) -> int | None:
    """MiB from ``24GiB``, ``30 GB``, ``4096MiB``, an int (MiB) or whole.

    :raises ValueError: with the reason.
    """
    if isinstance(value, bool):
        raise ValueError('%r is not a size' % value)
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise ValueError('%r is not a size' % (value,))
    if value.strip().lower() == WHOLE:
        return None
    match = _SIZE_RE.match(value)
    if match is None:
        raise ValueError('%r is not a size' % value)
    unit = match['unit'].lower()
    if unit not in UNITS:
        raise ValueError('unit %r of %r is unknown' % (match['unit'], value))
    return int(float(match['num']) * UNITS[unit])


def parse_compute(value: Any) -> tuple[int | None, int | None]:
    """(CUs, percent) from ``76``, ``"25%"`` or ``whole``.

    Percentages are whole, 1..100, as ``amd.com/gpucores`` (checked by
    :func:`amdgpu_virt.sharing.hami.parse_percent`).

    :raises ValueError: with the reason.
    """
    if isinstance(value, bool):
        raise ValueError('%r is not a CU count' % value)
    if isinstance(value, int):
        return value, None
    if isinstance(value, str):
        if value.strip().lower() == WHOLE:
            return None, None
        match = _PCT_RE.match(value)
        if match is not None:
            try:
                return None, hami.parse_percent(match['num'] + '%',
                                                'compute')
            except exception.HamiProtocolError:
                raise ValueError('%r is not a whole percentage in '
                                 '1%%..100%%' % value) from None
        if value.strip().isdigit():
            return int(value), None
    raise ValueError('%r is neither a CU count nor a percentage' % (value,))


def _enum(raw: Mapping[str, Any], field: str, cls: type[enum.Enum],
          default: enum.Enum, problems: list[str]) -> Any:
    value = raw.get(field, default.value)
    try:
        return cls(value)
    except ValueError:
        problems.append('%s: %r is not allowed; allowed: %s' % (
            field, value, ', '.join(str(m.value) for m in cls)))
        return default


def _int(raw: Mapping[str, Any], field: str, default: int | None,
         problems: list[str]) -> int | None:
    value = raw.get(field, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append('%s: %r is not an integer' % (field, value))
        return default
    return value


def _bool(raw: Mapping[str, Any], field: str, problems: list[str]) -> bool:
    value = raw.get(field, False)
    if not isinstance(value, bool):
        problems.append('%s: %r is not allowed; allowed: true, false'
                        % (field, value))
        return False
    return value


def from_dict(raw: Any, where: str = 'workload') -> Workload:
    """Build a :class:`Workload` from parsed YAML, checking every field.

    :param where: names the source in errors (e.g. ``file: workloads[3]``).
    :raises WorkloadSpecError: listing every problem found.
    """
    if not isinstance(raw, Mapping):
        raise exception.WorkloadSpecError(where, ['expected a mapping'])
    name = raw.get('name')
    label = str(name) if name is not None else where
    problems: list[str] = []
    if name is None:
        problems.append('name: is required')
    unknown = sorted(str(k) for k in raw if k not in FIELDS)
    if unknown:
        problems.append('%s: unknown field(s); allowed: %s' % (
            ', '.join(unknown), ', '.join(FIELDS)))
    platform = _enum(raw, 'platform', Platform, Platform.ANY, problems)
    tenancy = _enum(raw, 'tenancy', Tenancy, Tenancy.ISOLATED, problems)
    sensitivity = _enum(raw, 'sensitivity', Sensitivity, Sensitivity.MEDIUM,
                        problems)
    gpus = _int(raw, 'gpus', 1, problems)
    priority = _int(raw, 'priority', 0, problems)
    numa_node = _int(raw, 'numa_node', None, problems)
    p2p = _bool(raw, 'p2p', problems)
    same_numa = _bool(raw, 'same_numa', problems)
    memory_mib: int | None = None
    try:
        memory_mib = parse_memory(raw.get('memory', WHOLE))
    except ValueError as err:
        problems.append('memory: %s; allowed: a number with a unit (%s), '
                        'an integer (MiB) or "whole"' % (err, _UNIT_NAMES))
    cus: int | None = None
    percent: int | None = None
    try:
        cus, percent = parse_compute(raw.get('compute', WHOLE))
    except ValueError as err:
        problems.append('compute: %s; allowed: a CU count, a percentage '
                        'like "25%%", or "whole"' % err)
    models_raw = raw.get('model', ())
    if isinstance(models_raw, str):
        models_raw = [models_raw]
    models: list[str] = []
    if not isinstance(models_raw, (list, tuple)):
        problems.append('model: %r is not a model name or a list of them'
                        % (models_raw,))
    else:
        for item in models_raw:
            try:
                models.append(catalog.by_name(str(item)).name)
            except exception.UnknownModel:
                problems.append('model: %r is not a known model; allowed: %s'
                                % (item, ', '.join(catalog.names())))
    workload: Workload | None = None
    try:
        workload = Workload(
            name=str(name) if name is not None else 'unnamed',
            platform=platform, tenancy=tenancy,
            gpus=gpus if gpus is not None else 1, memory_mib=memory_mib,
            cus=cus, percent=percent, p2p=p2p, sensitivity=sensitivity,
            models=tuple(models), numa_node=numa_node, same_numa=same_numa,
            priority=priority if priority is not None else 0)
    except exception.WorkloadSpecError as err:
        problems.extend(p for p in err.problems if p not in problems)
    if problems or workload is None:
        raise exception.WorkloadSpecError(
            label if where == 'workload' else '%s (%s)' % (label, where),
            problems)
    return workload


def list_from_dict(raw: Any, source: str) -> list[Workload]:
    """Workloads of a list file (``workloads: [...]``).

    :raises WorkloadSpecError: naming the file, the entry and every problem
        (of the first invalid entry); also for a name used twice.
    """
    workloads, invalid = parse_list(raw, source)
    if invalid:
        raise invalid[0][1]
    return workloads


def parse_list(raw: Any, source: str
               ) -> tuple[list[Workload],
                          list[tuple[str, exception.WorkloadSpecError]]]:
    """Valid workloads of a list file, and the invalid entries.

    :returns: the valid workloads, and ``(name, error)`` for each invalid
        entry (the name it gave, or its position in the file).
    :raises WorkloadSpecError: the file itself has the wrong shape.
    """
    if not isinstance(raw, Mapping) or not isinstance(raw.get('workloads'),
                                                      list):
        raise exception.WorkloadSpecError(
            source, ['expected a mapping with a "workloads" list'])
    unknown = sorted(str(k) for k in raw if k != 'workloads')
    if unknown:
        raise exception.WorkloadSpecError(
            source, ['%s: unknown top-level key(s); allowed: workloads'
                     % ', '.join(unknown)])
    result: list[Workload] = []
    invalid: list[tuple[str, exception.WorkloadSpecError]] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw['workloads']):
        where = '%s: workloads[%d]' % (source, i)
        name = (str(entry['name']) if isinstance(entry, Mapping)
                and entry.get('name') is not None else 'workloads[%d]' % i)
        try:
            workload = from_dict(entry, where)
            if workload.name in seen:
                raise exception.WorkloadSpecError(
                    '%s (%s)' % (workload.name, where),
                    ['name: %r is used by an earlier workload; names must '
                     'be unique' % workload.name])
        except exception.WorkloadSpecError as err:
            invalid.append((name, err))
            continue
        seen.add(workload.name)
        result.append(workload)
    return result, invalid


def load_workloads(path: str) -> list[Workload]:
    """Workloads of the list file ``path``.

    :raises WorkloadSpecError: naming the file and entry.
    :raises AmdgpuVirtError: unreadable file or invalid YAML.
    """
    return list_from_dict(yamlutil.load_file(path, 'workload file'), path)


def load_workloads_lenient(path: str
                           ) -> tuple[list[Workload],
                                      list[tuple[str,
                                                 exception.WorkloadSpecError]]]:
    """Like :func:`load_workloads`, returning invalid entries instead."""
    return parse_list(yamlutil.load_file(path, 'workload file'), path)
