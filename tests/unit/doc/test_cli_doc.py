"""The command line reference lists the exit statuses the code uses."""

from __future__ import annotations

import os
import re

import testtools

from amdgpu_virt.cmd import exitcodes

DOC = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'doc',
                   'source', 'reference', 'cli.rst')


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
