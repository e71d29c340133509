"""Is a GPU unit usable on this node? Health checks of the node side.

A :data:`HealthCheck` answers for one unit; the device plugin lists a
unit whose check fails as ``Unhealthy``, the agent registers it with
``health: false`` and the DRA plugin reports it on kubelet's health
stream and stops offering it. All three use the same checks.

:class:`HealthMonitor` judges from what the node can read (``[health]``
options):

* the unit's device nodes under ``device_root``: ``/dev/kfd``, its card
  and render nodes exist, and its render node opens (an unplugged or
  unbound GPU answers ENODEV or ENXIO; a container the device cgroup
  keeps out, EPERM or EACCES, cannot tell and falls back to existence);
* the GPU's RAS counters (``ras/<block>_err_count``, read through
  :mod:`amdgpu_virt.inventory.sysfs.telemetry`): more uncorrectable
  errors than ``max_uncorrectable``, or correctable errors faster than
  ``max_correctable_per_hour`` over ``correctable_window``;
* optionally AMD's device metrics exporter (``gpu_health`` 0, see
  :mod:`.dme`).

A file that cannot be read judges nothing (its block is left out and the
failure counted); an exporter that does not answer judges nothing. A
GPU's RAS and exporter verdict is kept ``interval`` seconds (the device
plugin asks every second); device nodes are checked on every call.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.inventory.sysfs import telemetry as sysfs_telemetry
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import dme
from amdgpu_virt.model import GpuHealth
from amdgpu_virt.model import RasCount

LOG = logging.getLogger(__name__)

#: unit -> healthy?
HealthCheck = Callable[[devices.GpuUnit], bool]
#: the longest reason text (custominfo ``healthReason``, Events)
MAX_REASON = 200
#: correctable-count samples kept per GPU
MAX_SAMPLES = 4096
#: errno values of a device node whose driver is gone
_GONE = frozenset({errno.ENODEV, errno.ENXIO, errno.EIO, errno.ENOENT})


def device_node_health(device_root: str) -> HealthCheck:
    """A health check: the unit's device nodes exist under ``device_root``.

    A GPU that fell off the bus or whose driver was unbound loses its DRM
    nodes; without ``/dev/kfd`` no GPU is usable.
    """

    def check(unit: devices.GpuUnit) -> bool:
        return device_problem(device_root, unit, False) is None

    return check


def reason_of(check: HealthCheck, unit: devices.GpuUnit) -> str:
    """Why ``check`` finds ``unit`` unhealthy ('' when it does not say:
    a plain check)."""
    explain = getattr(check, 'reason', None)
    if not callable(explain):
        return ''
    try:
        return _short(str(explain(unit)))
    except Exception:  # a reason is a nicety; never fail for it
        LOG.exception('Health reason of GPU %s failed', unit.rocr_id)
        return ''


def device_problem(device_root: str, unit: devices.GpuUnit,
                   open_render: bool) -> str | None:
    """Why the unit's device nodes are unusable, or None."""
    for path in (devices.KFD_PATH, unit.card_path, unit.render_path):
        if not os.path.exists(os.path.join(device_root, path.lstrip('/'))):
            return '%s is missing' % path
    if not open_render:
        return None
    full = os.path.join(device_root, unit.render_path.lstrip('/'))
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY |
                     os.O_CLOEXEC)
    except OSError as err:
        if err.errno in _GONE:
            return '%s does not answer (%s)' % (
                unit.render_path, errno.errorcode.get(err.errno, err.errno))
        return None  # EPERM/EACCES: the device cgroup keeps us out
    os.close(fd)
    return None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Healthy or not, and why not (short text)."""

    healthy: bool
    reason: str = ''


HEALTHY = Verdict(True)


@dataclasses.dataclass(frozen=True)
class HealthPolicy:
    """The ``[health]`` thresholds."""

    max_uncorrectable: int = 0
    max_correctable_per_hour: int = 0
    correctable_window: float = 3600.0
    interval: float = 10.0
    open_render_nodes: bool = True

    @classmethod
    def from_conf(cls, conf: Any) -> HealthPolicy:
        group = conf.health
        return cls(max_uncorrectable=group.max_uncorrectable,
                   max_correctable_per_hour=group.max_correctable_per_hour,
                   correctable_window=float(group.correctable_window),
                   interval=float(group.interval),
                   open_render_nodes=group.open_render_nodes)


class CorrectableRate:
    """Correctable errors per hour of one GPU over a sliding window.

    The rate is the errors counted within the last ``window`` seconds
    divided by the window (never by less, so the first minutes of a node
    do not extrapolate a short burst). The counts are cumulative since
    the driver loaded: a count that goes down (the driver was reloaded)
    starts the window again.
    """

    def __init__(self, window: float) -> None:
        self.window = window
        self.samples: collections.deque[tuple[float, int]] = \
            collections.deque(maxlen=MAX_SAMPLES)

    def add(self, now: float, total: int) -> float | None:
        """Record ``total`` at ``now``; the rate per hour, or None before
        a second sample."""
        if self.samples and total < self.samples[-1][1]:
            self.samples.clear()
        self.samples.append((now, total))
        while len(self.samples) > 1 and \
                now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        first_time, first_total = self.samples[0]
        if now <= first_time:
            return None
        span = max(now - first_time, self.window)
        return (total - first_total) * 3600.0 / span


#: address -> RAS counts (None: none shown) and problems
RasReader = Callable[[str], tuple[tuple[RasCount, ...] | None,
                                  tuple[tuple[str, str], ...]]]


class ErrorCounts:
    """Failures to read, per source (a bounded set); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def add(self, source: str, message: str = '') -> None:
        with self._lock:
            self.counts[source] = self.counts.get(source, 0) + 1
        if message:
            LOG.debug('telemetry source %s: %s', source, message)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


class HealthMonitor:
    """Judges GPU units by their device nodes, RAS counts and, optionally,
    AMD's exporter; callable as a :data:`HealthCheck`.

    :param units: the node's units (the exporter's ``gpu_id`` is the
        position of a GPU among their addresses in PCI order).
    :param sysfs_root: where the RAS files are read.
    :param device_root: where the device nodes are checked.
    :param exporter: AMD's exporter; None: not asked.
    :param errors: failures to read are counted here.
    :param clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, units: Sequence[devices.GpuUnit], sysfs_root: str,
                 device_root: str, policy: HealthPolicy | None = None,
                 exporter: dme.ExporterHealth | None = None,
                 errors: ErrorCounts | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ras_reader: RasReader | None = None) -> None:
        self.units = tuple(units)
        self.sysfs_root = sysfs_root
        self.device_root = device_root
        self.policy = policy or HealthPolicy()
        self.exporter = exporter
        self.errors = errors or ErrorCounts()
        self.clock = clock
        self.ras_reader = ras_reader or (
            lambda address: sysfs_telemetry.read_ras(sysfs_root, address))
        self.addresses = tuple(sorted({u.gpu_address for u in self.units}))
        self._lock = threading.Lock()
        self._gpu: dict[str, tuple[float, Verdict]] = {}
        self._ras: dict[str, GpuHealth] = {}
        self._rates = {a: CorrectableRate(self.policy.correctable_window)
                       for a in self.addresses}
        self._exporter: tuple[float, dict[int, bool] | None] | None = None

    # the HealthCheck contract -----------------------------------------
    def __call__(self, unit: devices.GpuUnit) -> bool:
        return self.unit_verdict(unit).healthy

    def reason(self, unit: devices.GpuUnit) -> str:
        return self.unit_verdict(unit).reason

    # verdicts -----------------------------------------------------------
    def unit_verdict(self, unit: devices.GpuUnit) -> Verdict:
        """The unit's device nodes (checked on every call: a stat and an
        open each), then its GPU's verdict."""
        problem = device_problem(self.device_root, unit,
                                 self.policy.open_render_nodes)
        if problem is not None:
            return Verdict(False, _short('device: %s' % problem))
        return self.gpu_verdict(unit.gpu_address)

    def gpu_verdict(self, address: str) -> Verdict:
        """The GPU's RAS and exporter verdict (kept ``interval`` s)."""
        now = self.clock()
        with self._lock:
            cached = self._gpu.get(address)
        if cached is not None and now - cached[0] < self.policy.interval:
            return cached[1]
        verdict = self._judge(address, now)
        with self._lock:
            self._gpu[address] = (now, verdict)
        return verdict

    def ras(self, address: str) -> GpuHealth | None:
        """The RAS counts of the last verdict (None: none read), with the
        verdict's reason when it is unhealthy."""
        self.gpu_verdict(address)
        with self._lock:
            health = self._ras.get(address)
            cached = self._gpu.get(address)
        if health is None:
            return None
        if cached is not None and not cached[1].healthy:
            return dataclasses.replace(health, unhealthy=cached[1].reason)
        return health

    def _judge(self, address: str, now: float) -> Verdict:
        counts, problems = self.ras_reader(address)
        for _source, message in problems:
            self.errors.add('ras', message)
        reasons = []
        if counts is not None:
            health = GpuHealth(ras=counts)
            with self._lock:
                self._ras[address] = health
            problem = health.problem(self.policy.max_uncorrectable)
            if problem:
                reasons.append('ras: %s' % problem)
            limit = self.policy.max_correctable_per_hour
            rate = self._rates.setdefault(
                address, CorrectableRate(self.policy.correctable_window)
            ).add(now, health.correctable)
            if limit and rate is not None and rate > limit:
                reasons.append('ras: %.0f correctable errors per hour, more '
                               'than %d' % (rate, limit))
        exported = self._exported(now)
        if exported is not None and address in self.addresses:
            healthy = exported.get(self.addresses.index(address))
            if healthy is False:
                reasons.append('exporter: gpu_health 0')
        if not reasons:
            return HEALTHY
        verdict = Verdict(False, _short('; '.join(reasons)))
        LOG.debug('GPU %s is unhealthy: %s', address, verdict.reason)
        return verdict

    def _exported(self, now: float) -> dict[int, bool] | None:
        if self.exporter is None:
            return None
        with self._lock:
            cached = self._exporter
        if cached is not None and now - cached[0] < self.policy.interval:
            return cached[1]
        try:
            found: dict[int, bool] | None = self.exporter.read()
        except exception.TelemetryError as err:
            self.errors.add('exporter', str(err))
            LOG.warning('No GPU health from the device metrics exporter: '
                        '%s', err)
            found = None
        with self._lock:
            self._exporter = (now, found)
        return found


def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON else \
        text[:MAX_REASON - 3] + '...'


def monitor_from_conf(conf: Any, units: Sequence[devices.GpuUnit],
                      errors: ErrorCounts | None = None) -> HealthMonitor:
    """The monitor of the ``[health]``, ``[kubernetes] device_root`` and
    ``[inventory] sysfs_root`` options."""
    group = conf.health
    exporter = None
    if group.exporter_url:
        exporter = dme.ExporterHealth(group.exporter_url,
                                      group.exporter_timeout)
    return HealthMonitor(units, conf.inventory.sysfs_root,
                         conf.kubernetes.device_root,
                         HealthPolicy.from_conf(conf), exporter, errors)
