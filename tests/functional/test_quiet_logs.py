"""A functional test prints its result, not the servers' request logs."""

from __future__ import annotations

import os
import subprocess
import sys

import testtools

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
#: a test that runs ``plan --running-from`` in-process against the real
#: Placement server and the API server stand-in
PROBE = ('tests.functional.pool.test_live_plan.TestLivePlan.'
         'test_one_cloud_alone')


class QuietLogTest(testtools.TestCase):

    def test_a_passing_test_prints_nothing_but_its_result(self):
        # it once printed every HTTP request of the servers and clients
        # (55,000 lines for the whole suite)
        done = subprocess.run(
            [sys.executable, '-m', 'testtools.run', PROBE],
            capture_output=True, text=True, timeout=600, cwd=ROOT,
            stdin=subprocess.DEVNULL)
        self.assertEqual(0, done.returncode, done.stdout + done.stderr)
        lines = [line for line in (done.stdout + done.stderr).splitlines()
                 if line.strip() and not line.startswith(
                     ('Tests running...', 'Ran 1 test', 'OK', '.'))]
        self.assertEqual([], lines)
