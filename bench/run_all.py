"""Run every benchmark in this directory (or the named ones) with its
default sizes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def available() -> list[str]:
    return sorted(name[:-3] for name in os.listdir(HERE)
                  if name.endswith('.py') and name != 'run_all.py'
                  and not name.startswith('_'))


def main(argv: list[str]) -> int:
    known = available()
    parser = argparse.ArgumentParser(
        description='Run the benchmarks one after the other, each with '
                    'its default sizes (see bench/README.rst); the exit '
                    'status is non-zero when one failed. For smaller sizes '
                    'run one script with its own options.')
    parser.add_argument('names', nargs='*', metavar='NAME',
                        help='benchmarks to run (%s); default: all'
                        % ', '.join(known))
    names = parser.parse_args(argv).names or known
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error('unknown benchmark(s) %s; known: %s' % (
            ', '.join(unknown), ', '.join(known)))
    status = 0
    for name in names:
        print('=== %s' % name, flush=True)
        result = subprocess.run([sys.executable,
                                 os.path.join(HERE, name + '.py')],
                                check=False)
        status = status or result.returncode
    return status


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
