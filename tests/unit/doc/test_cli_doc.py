"""The command line reference lists the exit statuses the code uses."""

from __future__ import annotations

import configparser
import os
import re

import testtools

from amdgpu_virt.cmd import exitcodes

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..')
DOC = os.path.join(ROOT, 'doc', 'source', 'reference', 'cli.rst')


def commands() -> list[str]:
    """Every command of setup.cfg's ``amdgpu_virt.cli`` entry points, as
    typed (underscores are spaces)."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, 'setup.cfg'))
    lines = parser['entry_points']['amdgpu_virt.cli'].strip().splitlines()
    return sorted(line.split('=')[0].strip().replace('_', ' ')
                  for line in lines)


class CliDocTest(testtools.TestCase):

    def test_the_exit_status_table_is_the_code_s(self):
        with open(DOC, encoding='utf-8') as handle:
            text = handle.read()
        table = text[text.index('.. list-table:: Exit statuses'):]
        documented = [(int(status), name.split()[0]) for status, name in
                      re.findall(r'^   \* - (\d+)\n     - (\S+(?: \S+)?)$',
                                 table, re.MULTILINE)]
        in_code = [(status, name) for name, status in vars(
            exitcodes).items() if name.isupper() and isinstance(status, int)]
        self.assertEqual(sorted(in_code), documented)
        self.assertEqual([s for s, _m in exitcodes.TABLE],
                         [s for s, _n in documented])


class CommandListTest(testtools.TestCase):

    def test_every_command_is_listed_in_the_reference_and_the_readme(self):
        found = commands()
        self.assertIn('status', found)
        with open(DOC, encoding='utf-8') as handle:
            text = handle.read()
        table = text[text.index('.. list-table:: Commands'):
                     text.index('\nErrors\n')]
        listed = set(re.findall(r'``([a-z][a-z0-9 -]*)``', table))
        self.assertEqual([], [c for c in found if c not in listed])
        with open(os.path.join(ROOT, 'README.rst'), encoding='utf-8') as f:
            readme = f.read()
        described = readme[readme.index('\nReading the plan\n'):
                           readme.index('\nDocumentation\n')]


        def mentioned(command: str) -> bool:
            group, _sep, sub = command.rpartition(' ')
            return bool(
                re.search(r'amdgpu-virt %s\b' % re.escape(command),
                          described)
                or re.search(r'``%s\b' % re.escape(command), described)
                or (group and re.search(
                    r'amdgpu-virt %s [a-z|-]*\b%s\b' % (
                        re.escape(group), re.escape(sub)), described)))

        self.assertEqual([], [c for c in found if not mentioned(c)])
