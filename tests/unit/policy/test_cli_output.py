"""``plan`` output through cliff's formatters, and ``explain``'s reasons."""

from __future__ import annotations

import csv
import io
import json

import yaml

from tests.unit.policy.test_cli import CliTest


class TestPlanParts(CliTest):

    def test_default_is_the_three_part_human_table(self):
        rc, out, _err = self.run_cli('plan')
        self.assertEqual(0, rc)
        for title in ('GPUs\n', 'Workloads\n', 'Summary\n'):
            self.assertIn(title, out)
        self.assertIn('"explain NAME" or "--part workloads" prints them in '
                      'full', out)

    def test_part_workloads_csv_columns_and_full_reasons(self):
        rc, out, _err = self.run_cli('plan', '--part', 'workloads',
                                     '-f', 'csv', '-c', 'Name', '-c',
                                     'Reason')
        self.assertEqual(0, rc)
        rows = list(csv.reader(io.StringIO(out)))
        self.assertEqual(['Name', 'Reason'], rows[0])
        reasons = dict(rows[1:])
        _rc, explained, _err = self.run_cli('explain', 'llm-405b-train')
        full = reasons['llm-405b-train']
        self.assertGreater(len(full), 60)
        self.assertNotIn('...', full)
        # explain prints the same reason, whole
        self.assertIn('  reason: %s\n' % full, explained)

    def test_part_gpus_json_is_rows_with_vram(self):
        rc, out, _err = self.run_cli('plan', '--part', 'gpus', '-f', 'json')
        self.assertEqual(0, rc)
        rows = json.loads(out)
        self.assertEqual({'Host', 'Address', 'Model', 'Role', 'Mode', 'CUs',
                          'VRAM MiB', 'Used by', 'Unverified'},
                         set(rows[0]))
        mi300x = [r for r in rows if r['Model'] == 'MI300X'][0]
        self.assertEqual(196608, mi300x['VRAM MiB'])

    def test_part_gpus_value_one_column_sorted(self):
        rc, out, _err = self.run_cli('plan', '--part', 'gpus', '-f',
                                     'value', '-c', 'Host',
                                     '--sort-column', 'Host',
                                     '--sort-descending')
        self.assertEqual(0, rc)
        hosts = out.split()
        self.assertEqual(sorted(hosts, reverse=True), hosts)

    def test_part_summary_is_one_object(self):
        rc, out, _err = self.run_cli('plan', '--part', 'summary', '-f',
                                     'yaml')
        self.assertEqual(0, rc)
        summary = yaml.safe_load(out)
        self.assertEqual(19, summary['workloads'])
        self.assertIn('bound.placed', summary)
        rc, out, _err = self.run_cli('plan', '--part', 'summary', '-f',
                                     'value', '-c', 'placed')
        self.assertEqual('%d\n' % summary['placed'], out)

    def test_json_without_part_is_the_whole_document(self):
        rc, out, _err = self.run_cli('plan', '-f', 'json')
        self.assertEqual(0, rc)
        self.assertEqual({'gpus', 'workloads', 'summary', 'ledger'},
                         set(json.loads(out)))

    def test_one_table_formats_need_a_part(self):
        for argv in (('-f', 'csv'), ('-f', 'value'), ('-c', 'Host')):
            rc, out, err = self.run_cli('plan', *argv)
            self.assertEqual(64, rc, argv)   # EX_USAGE
            self.assertEqual('', out)
            self.assertIn('--part gpus, workloads or summary', err)

    def test_unknown_column_is_named(self):
        rc, _out, err = self.run_cli('plan', '--part', 'gpus', '-c', 'Nope')
        self.assertNotEqual(0, rc)
        self.assertIn('Nope', err)
