"""Progress of long plans: on stderr when asked or on a terminal, never
in the output."""

from __future__ import annotations

import io
import json

import fixtures
import testtools

from amdgpu_virt import data
from amdgpu_virt.cmd import main
from amdgpu_virt.cmd import progress
from amdgpu_virt.inventory import fleet
from amdgpu_virt.policy import planner
from amdgpu_virt.policy import workload
from tests.unit.policy import utils


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TestReporter(testtools.TestCase):

    def test_lines_at_each_step_and_at_most_every_interval(self):
        out, clock = io.StringIO(), Clock()
        report = progress.Reporter(out, 'plan', False, clock)
        report('reading hosts')
        report('placing workloads', 0, 200000)
        for done in range(1000, 200000, 1000):
            clock.now += 0.5
            report('placing workloads', done, 200000)
        report('placing workloads', 200000, 200000)
        report.close()
        lines = out.getvalue().splitlines()
        self.assertEqual('plan: reading hosts, 0 s', lines[0])
        self.assertEqual('plan: placing workloads 0/200000 (0%), 0 s',
                         lines[1])
        self.assertEqual('plan: placing workloads 200000/200000 (100%), '
                         '100 s', lines[-1])
        # 100 s of placing, a line every 5 s at most
        self.assertLessEqual(len(lines), 2 + 100 // progress.INTERVAL + 1)
        self.assertIn('plan: placing workloads 10000/200000 (5%), 5 s',
                      lines)

    def test_a_terminal_gets_one_line_rewritten_then_cleared(self):
        out, clock = Terminal(), Clock()
        report = progress.Reporter(out, 'plan', True, clock)
        report('reading hosts')
        clock.now += 1
        report('placing workloads', 5, 10)
        report.close()
        text = out.getvalue()
        self.assertNotIn('\n', text)
        self.assertTrue(text.endswith('\r'))
        self.assertIn('\rplan: placing workloads 5/10 (50%), 1 s', text)


class TestPlannerSteps(testtools.TestCase):

    def test_the_planner_tells_its_steps(self):
        self.useFixture(fixtures.MonkeyPatch(
            'amdgpu_virt.policy.planner.PROGRESS_EVERY', 5))
        seen = []
        items = workload.load_workloads(data.path('sample_workloads.yaml'))
        planner.plan(utils.conf(), fleet.load_fleet(), items,
                     progress=lambda *a: seen.append(a))
        total = len(items)
        self.assertEqual(('placing workloads', 0, total), seen[0])
        self.assertIn(('placing workloads', 5, total), seen)
        self.assertIn(('placing workloads', total, total), seen)
        self.assertEqual([('bounding', 0, 0), ('reporting', 0, 0)],
                         seen[-2:])


class TestPlanProgress(testtools.TestCase):

    def run_cli(self, stderr, *argv):
        self.useFixture(fixtures.FakeLogger())
        app = main.AmdgpuVirtApp()
        app.stdout, app.stderr = io.StringIO(), stderr
        status = app.run(list(argv))
        self.assertEqual(0, status, stderr.getvalue())
        return app.stdout.getvalue(), stderr.getvalue()

    def test_on_a_terminal_stderr_and_never_in_the_output(self):
        out, err = self.run_cli(Terminal(), 'plan', '-f', 'json')
        self.assertIn('plan: placing workloads 19/19 (100%)', err)
        self.assertIn('plan: reading workloads', err)
        document = json.loads(out)
        self.assertEqual(19, document['summary']['workloads'])
        quiet_out, _err = self.run_cli(io.StringIO(), 'plan', '-f', 'json')
        self.assertEqual(out, quiet_out)

    def test_elsewhere_only_when_asked(self):
        _out, err = self.run_cli(io.StringIO(), 'plan', '--part', 'summary',
                                 '-f', 'csv')
        self.assertNotIn('plan:', err)
        _out, err = self.run_cli(io.StringIO(), 'plan', '--progress',
                                 '--part', 'summary', '-f', 'csv')
        self.assertIn('plan: reading hosts, 0 s\n', err)
        self.assertIn('plan: reporting', err)
        _out, err = self.run_cli(Terminal(), 'plan', '--no-progress')
        self.assertEqual('', err)
        _out, err = self.run_cli(io.StringIO(), 'explain', 'tenant-vm-1',
                                 '--progress')
        self.assertIn('explain: placing workloads', err)
