"""How long ``amdgpu-virt`` takes to start, per command.

Runs ``amdgpu-virt`` (this Python, the installed package) ``--runs`` times
per command line and prints the median and best wall time and the median
CPU time of the child process (user + system, from its resource usage:
on a shared machine it moves less than wall time). ``--baseline DIR``
runs the same command lines with another source tree of the package
first on the path (e.g. ``git archive <commit> | tar -x -C DIR``) and
prints its figures side by side. ``--imports`` adds the modules that cost
the most to import for one command line, from Python's ``-X importtime``.
Quick run: ``--runs 3``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

#: (label, argv): what starts and does nothing (help, version) and one
#: small real run per family of commands
COMMANDS = (
    ('--version', ['--version']),
    ('help (lists every command)', ['help']),
    ('simulate-host --help', ['simulate-host', '--help']),
    ('inventory --help', ['inventory', '--help']),
    ('plan --help', ['plan', '--help']),
    ('nova config --help', ['nova', 'config', '--help']),
    ('k8s agent --help', ['k8s', 'agent', '--help']),
    ('audit --help', ['audit', '--help']),
    ('status --help', ['status', '--help']),
    ('plan (sample fleet)', ['plan', '--part', 'summary', '-f', 'value']),
)


#: what the console script runs
MAIN = ('import sys; from amdgpu_virt.cmd import main; '
        'sys.exit(main.main(sys.argv[1:]))')


def _run(argv: list[str], source: str | None = None
         ) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of the command line, with
    the package of ``source`` (a source tree) or the installed one."""
    env = dict(os.environ)
    if source:
        env['PYTHONPATH'] = source
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # -P: not the current directory first on the path (the baseline is)
    subprocess.run([sys.executable, '-P', '-c', MAIN, *argv],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   stdin=subprocess.DEVNULL, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime
                                                - before.ru_stime)
    return wall, cpu


def imports(argv: list[str], top: int) -> list[tuple[int, str]]:
    """The ``top`` modules with the largest cumulative import time (µs)
    when the script runs ``argv``."""
    done = subprocess.run(
        [sys.executable, '-P', '-X', 'importtime', '-c', MAIN, *argv],
        capture_output=True, text=True, check=False)
    found = []
    for line in done.stderr.splitlines():
        parts = line.split('|')
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip())) // 2
        if depth <= 1:
            found.append((int(parts[1]), name.strip()))
    return sorted(found, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--runs', type=int, default=10,
                        help='runs per command line (default 10)')
    parser.add_argument('--imports', metavar='COMMAND', nargs='?',
                        const='plan --help',
                        help='also list the costliest imports of this '
                             'command line (default "plan --help")')
    parser.add_argument('--baseline', metavar='DIR',
                        help='also run a source tree of the package (the '
                             'directory holding amdgpu_virt/) and print '
                             'its figures first')
    args = parser.parse_args(argv)
    trees = ([('baseline', args.baseline)] if args.baseline else []) + [
        ('installed', None)]
    print('%-28s %-10s %10s %10s %10s' % ('command', 'package', 'median s',
                                          'best s', 'CPU s'))
    for label, command in COMMANDS:
        for name, source in trees:
            # alternately, so that both see the same machine
            runs = [_run(command, source) for _ in range(max(1, args.runs))]
            print('%-28s %-10s %10.3f %10.3f %10.3f' % (
                label, name, statistics.median(w for w, _c in runs),
                min(w for w, _c in runs),
                statistics.median(c for _w, c in runs)))
    if args.imports:
        print('\ncostliest imports of "amdgpu-virt %s" (cumulative ms):'
              % args.imports)
        for micros, name in imports(args.imports.split(), 15):
            print('  %8.1f  %s' % (micros / 1000, name))
    return 0


if __name__ == '__main__':
    sys.exit(main())
