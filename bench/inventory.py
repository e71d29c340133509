"""Benchmark: how long one sysfs scan of a simulated host takes.

Builds a simulated host of each kind (8 GPUs; 4 APUs for MI300A) in a
temporary directory, scans it ``--runs`` times with the sysfs driver and
prints the median and 95th percentile scan time per kind. Also times the
snapshot round trip (JSON dump + load) of each scanned inventory.

Usage::

    python bench/inventory.py [--runs 50] [--kinds mi300x-gim-cpx,...]
                              [--gpus 8] [--tmpdir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

from amdgpu_virt import conf
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.inventory import sysfs


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _default_tmpdir() -> str | None:
    # A tmpfs keeps tree creation fast; scans read from the page cache
    # either way.
    shm = '/dev/shm'
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--runs', type=int, default=50,
                        help='scans per kind (default 50)')
    parser.add_argument('--kinds', default='',
                        help='comma-separated kinds (default: all of %s)'
                        % ', '.join(simulate.KINDS))
    parser.add_argument('--gpus', type=int, default=0,
                        help='GPUs per host instead of each kind\'s own')
    parser.add_argument('--tmpdir', default=_default_tmpdir(),
                        help='where to build the trees')
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(',') if k] or list(simulate.KINDS)
    options = conf.new_conf()
    print('%-22s %5s %6s %5s %10s %10s %12s' % (
        'kind', 'gpus', 'parts', 'vfs', 'median ms', 'p95 ms',
        'snapshot ms'))
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        for kind in kinds:
            spec = simulate.KINDS[kind]
            if args.gpus and not spec.gpu_modes:
                spec = dataclasses.replace(spec, gpus=args.gpus)
            root = os.path.join(tmp, kind)
            expected = simulate.simulate_host(spec, root)
            driver = sysfs.SysfsInventory(options, root, spec.hostname)
            times = []
            found = None
            for _run in range(args.runs):
                start = time.perf_counter()
                found = driver.scan()
                times.append((time.perf_counter() - start) * 1000)
            assert found is not None
            if found.gpus != expected.gpus:
                print('%s: scan differs from the simulated host' % kind,
                      file=sys.stderr)
            start = time.perf_counter()
            snapshot.loads(snapshot.dumps(found), kind)
            snap_ms = (time.perf_counter() - start) * 1000
            print('%-22s %5d %6d %5d %10.2f %10.2f %12.2f' % (
                kind, len(found.gpus), found.partition_count,
                found.vf_count, statistics.median(times),
                _percentile(times, 0.95), snap_ms))
    return 0


if __name__ == '__main__':
    sys.exit(main())
