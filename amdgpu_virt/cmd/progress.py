"""Progress of long work on stderr, never in the command's output.

``plan`` and ``explain`` of a large fleet (200,000 workloads run for
minutes) say what they are doing: on stderr when it is a terminal, or
when ``--progress`` asks for it (a log collecting stderr); never with
``--no-progress``. The output on stdout (a table, JSON, YAML, CSV) is the
same either way.

On a terminal one line is rewritten in place and cleared at the end;
elsewhere a line is written at each step and at most every
:data:`INTERVAL` seconds within one.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import IO
from typing import Any

#: least seconds between two lines of one step (not on a terminal)
INTERVAL = 5.0
#: least seconds between two rewrites of the line on a terminal
TTY_INTERVAL = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--progress`` and ``--no-progress`` (default: when stderr is a
    terminal)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument('--progress', dest='progress', action='store_true',
                       default=None,
                       help='report progress on stderr even when it is not '
                            'a terminal (default: only on a terminal)')
    group.add_argument('--no-progress', dest='progress',
                       action='store_false',
                       help='never report progress')


class Reporter:
    """Writes ``<what>: <step> <done>/<total> (<percent>), <seconds> s``.

    :param stream: where (stderr).
    :param what: the command (``plan``).
    :param terminal: rewrite one line in place.
    :param clock: seconds, monotonic (tests give their own).
    """

    def __init__(self, stream: IO[str], what: str, terminal: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.what = what
        self.terminal = terminal
        self.clock = clock
        self.start = clock()
        self._step: str | None = None
        self._last = float('-inf')
        self._width = 0

    def _text(self, step: str, done: int, total: int) -> str:
        elapsed = self.clock() - self.start
        if total:
            return '%s: %s %d/%d (%d%%), %.0f s' % (
                self.what, step, done, total, 100 * done // total, elapsed)
        return '%s: %s, %.0f s' % (self.what, step, elapsed)

    def __call__(self, step: str, done: int = 0, total: int = 0) -> None:
        now = self.clock()
        new_step = step != self._step
        finished = bool(total) and done >= total
        interval = TTY_INTERVAL if self.terminal else INTERVAL
        if not (new_step or finished or now - self._last >= interval):
            return
        self._step, self._last = step, now
        text = self._text(step, done, total)
        if self.terminal:
            self.stream.write('\r%s%s' % (
                text, ' ' * max(0, self._width - len(text))))
            self._width = len(text)
        else:
            self.stream.write(text + '\n')
        self.stream.flush()

    def close(self) -> None:
        """Clear the line on a terminal (the output follows)."""
        if self.terminal and self._width:
            self.stream.write('\r%s\r' % (' ' * self._width))
            self.stream.flush()
            self._width = 0


def reporter(app: Any, args: argparse.Namespace, what: str
             ) -> Reporter | None:
    """The reporter ``--progress``/``--no-progress`` and stderr ask for
    (None: report nothing)."""
    stream = app.stderr
    asked = getattr(args, 'progress', None)
    terminal = bool(getattr(stream, 'isatty', lambda: False)())
    if asked is False or (asked is None and not terminal):
        return None
    return Reporter(stream, what, terminal)
