"""Per-decision timing for the benchmarks: wall and CPU time, and the
cyclic garbage collector's share, kept apart.

On a machine shared with other work, wall time measures the machine as
much as the code: a decision that is descheduled for 20 ms shows 20 ms.
The CPU time of the measuring thread (``time.thread_time``) counts only
what the decision itself computed. A collection of the cyclic garbage
collector that happens to start inside a decision is counted in both, so
its time is also recorded on its own (``gc.callbacks``), and the figures
without it are printed next to the others.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1,
                       int(round(fraction * (len(ordered) - 1))))]


class DecisionClock:
    """Wall time, CPU time and collector time of each timed decision.

    Use :meth:`start` and :meth:`stop` around each decision, and
    :meth:`close` at the end (it removes the collector hook).
    """

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        #: time the cyclic collector ran inside each decision
        self.collector: list[float] = []
        self._in_gc = 0.0
        self._gc_start = 0.0
        self._wall = self._cpu = 0.0
        gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if phase == 'start':
            self._gc_start = time.perf_counter()
        else:
            self._in_gc += time.perf_counter() - self._gc_start

    def start(self) -> None:
        self._in_gc = 0.0
        self._cpu = time.thread_time()
        self._wall = time.perf_counter()

    def stop(self) -> float:
        """End one decision; returns its wall time."""
        wall = time.perf_counter() - self._wall
        self.cpu.append(time.thread_time() - self._cpu)
        self.wall.append(wall)
        self.collector.append(self._in_gc)
        return wall

    def close(self) -> None:
        if self._hook in gc.callbacks:
            gc.callbacks.remove(self._hook)

    def __len__(self) -> int:
        return len(self.wall)

    def figures(self) -> dict[str, float]:
        """p50, p99 and max of wall and CPU time (seconds), the same
        without the collector's time, and how many decisions saw it."""
        no_gc_wall = [w - g for w, g in zip(self.wall, self.collector,
                                            strict=True)]
        no_gc_cpu = [max(0.0, c - g) for c, g in zip(self.cpu,
                                                    self.collector,
                                                    strict=True)]
        result = {'runs': float(len(self.wall)),
                  'collected': float(sum(1 for g in self.collector if g)),
                  'gc_max': max(self.collector, default=0.0)}
        for label, values in (('wall', self.wall), ('cpu', self.cpu),
                              ('wall_no_gc', no_gc_wall),
                              ('cpu_no_gc', no_gc_cpu)):
            result[label + '_p50'] = percentile(values, 0.5)
            result[label + '_p99'] = percentile(values, 0.99)
            result[label + '_max'] = max(values, default=0.0)
        return result


#: what the columns of :func:`row` mean
LEGEND = ('cpu: CPU time of the thread; gc n: decisions a collection ran '
          'in, gc max: its longest; p99 no gc: CPU p99 without the '
          'collector')


def header(label: str = '') -> str:
    """The column heads of :func:`row`."""
    return ('%-11s %6s %8s %8s %8s %8s %8s %8s %5s %7s %9s'
            % (label, 'runs', 'wall p50', 'wall p99', 'wall max', 'cpu p50',
               'cpu p99', 'cpu max', 'gc n', 'gc max', 'p99 no gc'))


def row(label: str, clock: DecisionClock) -> str:
    """One line of figures in ms, under :func:`header` (the last: the CPU
    time at p99 once the collector's time is taken out)."""
    f = clock.figures()
    return ('%-11s %6d %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %5d %7.3f %9.3f'
            % (label, f['runs'], f['wall_p50'] * 1e3, f['wall_p99'] * 1e3,
               f['wall_max'] * 1e3, f['cpu_p50'] * 1e3, f['cpu_p99'] * 1e3,
               f['cpu_max'] * 1e3, f['collected'], f['gc_max'] * 1e3,
               f['cpu_no_gc_p99'] * 1e3))


def ratio(ours: DecisionClock, base: DecisionClock) -> str:
    """p50 and p99 of ``ours`` over ``base``, by wall and CPU time."""
    a, b = ours.figures(), base.figures()

    def over(key: str) -> float:
        return a[key] / b[key] if b[key] else float('nan')

    return ('wall p50 x%.2f, p99 x%.2f; cpu p50 x%.2f, p99 x%.2f'
            % (over('wall_p50'), over('wall_p99'), over('cpu_p50'),
               over('cpu_p99')))
