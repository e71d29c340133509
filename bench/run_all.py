"""Run every benchmark in this directory with its default sizes."""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str]) -> int:
    names = argv or sorted(name[:-3] for name in os.listdir(HERE)
                           if name.endswith('.py') and name != 'run_all.py'
                           and not name.startswith('_'))
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
