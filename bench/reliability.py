"""Benchmark: the reliability runs of the Kubernetes side, timed.

Runs ``tests/functional/k8s/scheduler/test_reliability.py`` (two extender
processes, four kube-scheduler workers and 20 kubelets with their device
plugins placing seeded pods on 20 nodes of 8 GPUs) with the sizes given, each
``--runs`` times, and prints per run whether every invariant held, the wall
time, pods bound, rejected and retried, and the faults the proxy injected. The
test asserts the invariants and never a time; this prints the times.

Usage::

    python bench/reliability.py [--pods 1000] [--fault-pods 1000]
                                [--runs 1] [--only plain|faults]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import unittest
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import testtools  # noqa: E402

TEST = 'tests.functional.k8s.scheduler.test_reliability.ReliabilityTest.%s'
NAMES = {'plain': 'test_many_pods_many_workers',
         'faults': 'test_many_pods_through_api_faults'}


class _Result(testtools.TestResult):
    """Keeps the details of passed tests too (the run's figures)."""

    def __init__(self) -> None:
        super().__init__()
        self.figures = ''
        self.passed = False

    def addSuccess(self, test: Any, details: Any = None) -> None:
        super().addSuccess(test, details)
        self.passed = True
        self._keep(details)

    def addFailure(self, test: Any, err: Any = None,
                   details: Any = None) -> None:
        super().addFailure(test, err, details)
        self._keep(details)

    def addError(self, test: Any, err: Any = None,
                 details: Any = None) -> None:
        super().addError(test, err, details)
        self._keep(details)

    def _keep(self, details: Any) -> None:
        if details and 'figures' in details:
            self.figures = details['figures'].as_text()


def run_once(which: str) -> tuple[bool, float, str, str]:
    """(passed, seconds, figures, failure text) of one test run."""
    test = unittest.defaultTestLoader.loadTestsFromName(TEST % NAMES[which])
    result = _Result()
    started = time.monotonic()
    test.run(result)
    elapsed = time.monotonic() - started
    problems = '\n'.join(text for _test, text in
                         result.errors + result.failures)
    return result.passed, elapsed, result.figures, problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--pods', type=int, default=1000,
                        help='pods of the fault-free run (default 1000)')
    parser.add_argument('--fault-pods', type=int, default=1000,
                        help='pods of the run through the fault proxy '
                        '(default 1000)')
    parser.add_argument('--runs', type=int, default=1,
                        help='runs of each (default 1)')
    parser.add_argument('--only', choices=sorted(NAMES),
                        help='one of the two runs only')
    args = parser.parse_args(argv)
    # the warnings of the device plugins (API faults, retried) are not the
    # figures: keep them off the terminal
    logging.getLogger().addHandler(logging.NullHandler())
    os.environ['AMDGPU_VIRT_RELIABILITY_PODS'] = str(args.pods)
    os.environ['AMDGPU_VIRT_RELIABILITY_FAULT_PODS'] = str(args.fault_pods)
    status = 0
    for which in [args.only] if args.only else ['plain', 'faults']:
        for number in range(args.runs):
            passed, elapsed, figures, problems = run_once(which)
            print('%-6s run %d: %s in %.1f s (setup and checks included): '
                  '%s' % (which, number + 1, 'PASSED' if passed else
                          'FAILED', elapsed, figures or '-'), flush=True)
            if not passed:
                status = 1
                print(problems[-4000:], flush=True)
    return status


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
