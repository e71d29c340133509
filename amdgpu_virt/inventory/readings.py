"""What a node reads about its GPUs while they run: values and parsers.

Pure: the values (:class:`GpuReadings`, :class:`ContainerCgroup`) and the
parsers of the files :mod:`amdgpu_virt.inventory.sysfs.telemetry` and
:mod:`amdgpu_virt.inventory.sysfs.cgroup` read. Each parser takes the raw
content of one file and the path it came from and returns a value or
raises :class:`~amdgpu_virt.exception.SysfsValueError` naming the path;
nothing else, whatever the input.

Formats (Linux ``amdgpu``, ``Documentation/gpu/amdgpu`` and the cgroup v2
guide):

* RAS ``ras/<block>_err_count``: ``ue: <n>\\nce: <n>\\n`` and, on newer
  kernels for UMC, ``de: <n>``; while RAS is being recovered it reads
  ``Query currently inaccessible``;
* ``dmem.current`` / ``dmem.max``: one ``<region> <bytes|max>`` line per
  region, regions named ``drm/<PCI address>/vram`` for amdgpu.

Where kubelet's container cgroups are is
:mod:`amdgpu_virt.inventory.podcgroups`.
"""

from __future__ import annotations

import dataclasses
import re

from amdgpu_virt import exception
from amdgpu_virt.model import RasCount

#: RAS block names in the kernel's order (``ras_block_string``), which is
#: the order counts are reported in; others follow by name
RAS_BLOCKS = ('umc', 'sdma', 'gfx', 'mmhub', 'athub', 'pcie_bif', 'hdp',
              'xgmi_wafl', 'df', 'smn', 'sem', 'mp0', 'mp1', 'fuse', 'mca',
              'vcn', 'jpeg', 'ih', 'mpio')
#: lines of one RAS count file and of one dmem file a reader accepts
MAX_RAS_LINES = 8
MAX_DMEM_LINES = 256
#: the largest count or byte value accepted (2^63 - 1)
MAX_VALUE = (1 << 63) - 1

_RAS_BLOCK = re.compile(r'^[a-z][a-z0-9_]{0,31}$')
_RAS_LINE = re.compile(r'^(ue|ce|de): ?([0-9]{1,19})$')
_REGION = re.compile(r'^[A-Za-z0-9_./:-]{1,128}$')
_DECIMAL = re.compile(r'^[0-9]{1,19}$')


@dataclasses.dataclass(frozen=True)
class GpuReadings:
    """One read of one GPU's telemetry files (None: not shown or bad).

    :ivar temperatures: (sensor label, degrees Celsius), sensor order.
    :ivar problems: (source, message) of every file that could not be
        read or parsed; the source is one of :data:`SOURCES`.
    """

    address: str
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None
    busy_percent: int | None = None
    memory_busy_percent: int | None = None
    temperatures: tuple[tuple[str, float], ...] = ()
    power_watts: float | None = None
    ras: tuple[RasCount, ...] | None = None
    problems: tuple[tuple[str, str], ...] = ()


#: the sources of reading problems (a bounded label set)
SOURCES = ('vram', 'busy', 'hwmon', 'power', 'ras', 'cgroup', 'dmem')


@dataclasses.dataclass(frozen=True, order=True)
class ContainerCgroup:
    """A container cgroup kubelet made, named by what its path says.

    :ivar path: relative to the cgroup root.
    :ivar container_id: the runtime's id (64 hex digits).
    """

    pod_uid: str
    container_id: str
    path: str
    qos: str


def _text(raw: bytes | str, path: str, limit: int) -> str:
    if isinstance(raw, bytes):
        try:
            raw = raw.decode('ascii')
        except UnicodeDecodeError:
            raise exception.SysfsValueError(
                value=raw[:64], path=path, reason='not ASCII text') from None
    if len(raw) > limit:
        raise exception.SysfsValueError(
            value=raw[:64] + '...', path=path,
            reason='longer than %d characters' % limit)
    return raw


def ras_block(file_name: str) -> str | None:
    """The block of a ``<block>_err_count`` file name, or None."""
    if not file_name.endswith('_err_count'):
        return None
    block = file_name[:-len('_err_count')]
    return block if _RAS_BLOCK.match(block) else None


def ras_order(block: str) -> tuple[int, str]:
    """Sort key: the kernel's block order, unknown blocks last by name."""
    try:
        return RAS_BLOCKS.index(block), block
    except ValueError:
        return len(RAS_BLOCKS), block


def parse_ras_count(raw: bytes | str, path: str, block: str) -> RasCount:
    """A ``<block>_err_count`` file.

    :raises SysfsValueError: not ``ue:``/``ce:`` lines (``Query currently
        inaccessible`` included), a line twice, or a count out of range.
    """
    text = _text(raw, path, 256)
    lines = [line.strip() for line in text.strip().splitlines()]
    if len(lines) > MAX_RAS_LINES:
        raise exception.SysfsValueError(
            value=text[:64], path=path,
            reason='more than %d lines' % MAX_RAS_LINES)
    counts: dict[str, int] = {}
    for line in lines:
        match = _RAS_LINE.match(line)
        if match is None:
            raise exception.SysfsValueError(
                value=line[:64], path=path,
                reason='not a "ue: N", "ce: N" or "de: N" line')
        key, value = match.group(1), int(match.group(2))
        if key in counts:
            raise exception.SysfsValueError(value=line, path=path,
                                            reason='%s given twice' % key)
        if value > MAX_VALUE:
            raise exception.SysfsValueError(value=line, path=path,
                                            reason='count out of range')
        counts[key] = value
    if 'ue' not in counts or 'ce' not in counts:
        raise exception.SysfsValueError(value=text[:64], path=path,
                                        reason='no ue and ce counts')
    return RasCount(block, counts['ue'], counts['ce'], counts.get('de', 0))


def parse_percent(raw: bytes | str, path: str) -> int:
    """A ``*_busy_percent`` file: 0..100."""
    text = _text(raw, path, 64).strip()
    if not _DECIMAL.match(text) or int(text) > 100:
        raise exception.SysfsValueError(value=text, path=path,
                                        reason='not a percentage 0..100')
    return int(text)


def parse_count(raw: bytes | str, path: str) -> int:
    """A non-negative decimal (bytes, millidegrees, microwatts)."""
    text = _text(raw, path, 64).strip()
    if not _DECIMAL.match(text) or int(text) > MAX_VALUE:
        raise exception.SysfsValueError(
            value=text, path=path,
            reason='not a decimal number 0..%d' % MAX_VALUE)
    return int(text)


def parse_label(raw: bytes | str, path: str) -> str:
    """A ``temp<N>_label``: a short lower-case word (``junction``)."""
    text = _text(raw, path, 64).strip()
    if not re.match(r'^[a-z][a-z0-9_]{0,15}$', text):
        raise exception.SysfsValueError(value=text, path=path,
                                        reason='not a sensor label')
    return text


def parse_dmem(raw: bytes | str, path: str) -> dict[str, int | None]:
    """A ``dmem.current``/``dmem.max``/``dmem.capacity`` file: region ->
    bytes (None for ``max``: no limit).

    :raises SysfsValueError: a malformed line, a region twice, or more
        than :data:`MAX_DMEM_LINES` lines.
    """
    text = _text(raw, path, 64 * 1024)
    result: dict[str, int | None] = {}
    lines = text.splitlines()
    if len(lines) > MAX_DMEM_LINES:
        raise exception.SysfsValueError(
            value=text[:64], path=path,
            reason='more than %d lines' % MAX_DMEM_LINES)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not _REGION.match(parts[0]):
            raise exception.SysfsValueError(
                value=line[:64], path=path,
                reason='line %d is not "<region> <bytes|max>"' % number)
        if parts[1] != 'max' and not (_DECIMAL.match(parts[1]) and
                                      int(parts[1]) <= MAX_VALUE):
            raise exception.SysfsValueError(
                value=parts[1][:64], path=path,
                reason='line %d: not a byte count' % number)
        if parts[0] in result:
            raise exception.SysfsValueError(
                value=line[:64], path=path,
                reason='line %d: region %s given twice' % (number,
                                                           parts[0]))
        result[parts[0]] = None if parts[1] == 'max' else int(parts[1])
    return result


def vram_region(address: str) -> str:
    """The dmem region of a GPU's VRAM: ``drm/0000:85:00.0/vram``."""
    return 'drm/%s/vram' % address


def region_address(region: str) -> str | None:
    """The PCI address of a ``drm/<address>/vram`` region, or None."""
    parts = region.split('/')
    if len(parts) == 3 and parts[0] == 'drm' and parts[2] == 'vram':
        return parts[1]
    return None
