"""The worked examples of the hybrid and deployers guides are true: the
commands run on the embedded sample fleet print what the guides show."""

from __future__ import annotations

import io
import os
import re

import fixtures
import testtools

from amdgpu_virt.cmd import main

DOC = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'doc',
                   'source', 'admin')
APPLY = 'amdgpu-virt apply --ledger ledger.yaml --output-dir out'


def shown(name: str, command: str) -> list[list[str]]:
    """The output a guide shows under each ``$ command`` line (lines up
    to the next prompt or blank line, dedented)."""
    with open(os.path.join(DOC, name), encoding='utf-8') as handle:
        lines = handle.read().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != '$ %s' % command:
            continue
        indent = len(line) - len(line.lstrip())
        block = []
        for follow in lines[i + 1:]:
            if not follow.strip() or follow.strip().startswith('$ '):
                break
            block.append(follow[indent:])
        blocks.append(block)
    return blocks


class WorkedExampleTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.useFixture(fixtures.FakeLogger())
        cwd = os.getcwd()
        os.chdir(self.tmp)
        self.addCleanup(os.chdir, cwd)

    def run_cli(self, command: str) -> list[str]:
        app = main.AmdgpuVirtApp()
        app.stdout, app.stderr = io.StringIO(), io.StringIO()
        self.assertEqual(0, app.run(command.split()[1:]), command)
        # a terminal shows the progress line (stderr) before the files
        return (app.stderr.getvalue() + app.stdout.getvalue()).splitlines()

    def test_apply_writes_what_the_guides_show(self):
        self.run_cli('amdgpu-virt plan --output-ledger ledger.yaml')
        # the dry run's diff is shortened in the guide: its file list
        # and summary are compared
        dry = [line for line in self.run_cli(APPLY + ' --dry-run')
               if line.startswith(('would ', '5 host(s)'))]
        (block,) = shown('hybrid.rst', APPLY + ' --dry-run')
        self.assertEqual(dry, [line for line in block
                               if line.startswith(('would ', '5 host(s)'))])
        first = self.run_cli(APPLY)
        second = self.run_cli(APPLY)
        self.assertRegex(first[-1], r'^5 host\(s\): \d+ file\(s\) written')
        for guide in ('hybrid.rst', 'openstack-deployers.rst'):
            blocks = shown(guide, APPLY)
            self.assertTrue(blocks, guide)
            self.assertEqual(first, blocks[0], guide)
            if len(blocks) > 1:
                self.assertEqual(second, blocks[1], guide)
        count = int(re.search(r'(\d+) file', first[-1]).group(1))
        self.assertEqual(count, sum(1 for line in first
                                    if line.startswith('wrote ')))
