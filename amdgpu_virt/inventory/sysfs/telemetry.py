"""Reading a GPU's telemetry and RAS files while it runs.

Below the PCI device directory of a GPU bound to ``amdgpu``
(``bus/pci/devices/<address>/``, the same as ``class/drm/cardN/device/``):

* ``mem_info_vram_used`` and ``mem_info_vram_total`` (bytes);
* ``gpu_busy_percent`` and ``mem_busy_percent`` (0..100);
* ``hwmon/hwmon<N>/``: ``temp<N>_input`` in millidegrees Celsius named by
  ``temp<N>_label`` (MI300-class GPUs hide temp1, the edge sensor, so
  sensors are named by label, never by index), and socket power in
  microwatts, ``power1_average`` or, on MI300-class GPUs,
  ``power1_input``;
* ``ras/<block>_err_count`` (see :mod:`amdgpu_virt.inventory.readings`).

Every read is bounded (one page per file, :data:`MAX_ENTRIES` names per
directory), never follows a FIFO or a device node planted in the tree,
and never raises for a bad file: what cannot be read is a problem in the
result, named by file, and the value is left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import readings
from amdgpu_virt.model import RasCount

#: bytes read of one file (the kernel serves at most a page)
MAX_BYTES = 4096
#: names looked at in one directory (ras/, hwmon/, a hwmon<N>/)
MAX_ENTRIES = 128
#: temperature sensors read per GPU
MAX_SENSORS = 8
_T = TypeVar('_T')


class _Reads:
    """The reads of one GPU; collects problems as (source, message)."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def problem(self, source: str, path: str, message: str) -> None:
        self.problems.append((source, '%s: %s' % (path, message)))

    def value(self, source: str, path: str,
              parser: Callable[..., _T], *args: object,
              missing_ok: bool = False) -> _T | None:
        try:
            raw = fileutil.read_bytes(path, 'sysfs value', MAX_BYTES,
                                      truncate=True)
        except FileNotFoundError:
            if not missing_ok:
                self.problem(source, path, 'missing')
            return None
        except exception.FileInputError as err:
            self.problem(source, path, 'unreadable: %s'
                         % err.kwargs.get('reason'))
            return None
        try:
            return parser(raw, path, *args)
        except exception.SysfsValueError as err:
            self.problem(source, path, 'bad value %r: %s' % (
                err.kwargs.get('value'), err.kwargs.get('reason')))
            return None

    def names(self, source: str, directory: str) -> list[str] | None:
        """The first :data:`MAX_ENTRIES` names of ``directory`` (sorted);
        None when it does not exist."""
        try:
            with os.scandir(directory) as entries:
                names: list[str] = []
                for entry in entries:
                    if len(names) >= MAX_ENTRIES:
                        self.problem(source, directory, 'more than %d '
                                     'entries; the rest ignored'
                                     % MAX_ENTRIES)
                        break
                    names.append(entry.name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:
            self.problem(source, directory, 'cannot list: %s'
                         % (err.strerror or err))
            return None
        return sorted(names)


def device_dir(root: str, address: str) -> str:
    return os.path.join(root, layout.PCI_DEVICES, address)


def _ras(reads: _Reads, directory: str) -> tuple[RasCount, ...] | None:
    names = reads.names('ras', os.path.join(directory, layout.RAS_DIR))
    if names is None:
        return None
    counts = []
    for name in names:
        block = readings.ras_block(name)
        if block is None:
            continue
        count = reads.value('ras', os.path.join(directory, layout.RAS_DIR,
                                                name),
                            readings.parse_ras_count, block)
        if count is not None:
            counts.append(count)
    return tuple(sorted(counts, key=lambda c: readings.ras_order(c.block)))


def read_ras(root: str, address: str
             ) -> tuple[tuple[RasCount, ...] | None, tuple[tuple[str, str],
                                                            ...]]:
    """(RAS counts per block, problems) of the GPU at ``address``; the
    counts are None when the GPU has no ``ras/`` directory."""
    reads = _Reads()
    return _ras(reads, device_dir(root, address)), tuple(reads.problems)


def _hwmon(reads: _Reads, directory: str
           ) -> tuple[tuple[tuple[str, float], ...], float | None]:
    base = os.path.join(directory, layout.HWMON_DIR)
    names = reads.names('hwmon', base)
    if not names:
        return (), None
    monitor = os.path.join(base, names[0])
    files = reads.names('hwmon', monitor) or []
    present = set(files)
    temperatures: list[tuple[str, float]] = []
    for index in range(1, MAX_SENSORS + 1):
        source = layout.TEMP_INPUT % index
        if source not in present:
            continue
        value = reads.value('hwmon', os.path.join(monitor, source),
                            readings.parse_count)
        if value is None:
            continue
        label = None
        if layout.TEMP_LABEL % index in present:
            label = reads.value('hwmon', os.path.join(
                monitor, layout.TEMP_LABEL % index), readings.parse_label)
        temperatures.append((label or 'temp%d' % index, value / 1000.0))
    power = None
    for name in (layout.POWER_AVERAGE, layout.POWER_INPUT):
        if name in present:
            microwatts = reads.value('power', os.path.join(monitor, name),
                                     readings.parse_count)
            if microwatts is not None:
                power = microwatts / 1e6
            break
    return tuple(temperatures), power


def read_gpu(root: str, address: str) -> readings.GpuReadings:
    """One read of the telemetry and RAS files of the GPU at ``address``
    (a PCI address string); never raises for a bad file."""
    reads = _Reads()
    directory = device_dir(root, address)
    used = reads.value('vram', os.path.join(
        directory, layout.MEM_INFO_VRAM_USED), readings.parse_count)
    total = reads.value('vram', os.path.join(
        directory, layout.MEM_INFO_VRAM_TOTAL), readings.parse_count)
    busy = reads.value('busy', os.path.join(
        directory, layout.GPU_BUSY_PERCENT), readings.parse_percent)
    memory_busy = reads.value('busy', os.path.join(
        directory, layout.MEM_BUSY_PERCENT), readings.parse_percent,
        missing_ok=True)
    temperatures, power = _hwmon(reads, directory)
    ras = _ras(reads, directory)
    return readings.GpuReadings(
        address=address, vram_used_bytes=used, vram_total_bytes=total,
        busy_percent=busy, memory_busy_percent=memory_busy,
        temperatures=temperatures, power_watts=power, ras=ras,
        problems=tuple(reads.problems))
