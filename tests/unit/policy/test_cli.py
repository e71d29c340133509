"""``amdgpu-virt plan`` and ``explain``, run in-process."""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from unittest import mock
import xml.etree.ElementTree as ET

import testtools
import yaml

from amdgpu_virt.cmd import main


class CliTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(self._clean)

    def _clean(self):
        for name in os.listdir(self.tmp):
            os.unlink(os.path.join(self.tmp, name))
        os.rmdir(self.tmp)

    def path(self, name, text=None):
        path = os.path.join(self.tmp, name)
        if text is not None:
            with open(path, 'w') as handle:
                handle.write(text)
        return path

    def run_cli(self, *argv):
        app = main.AmdgpuVirtApp()
        app.stdout = io.StringIO()
        app.stderr = io.StringIO()
        # cliff logs errors to stderr through a handler made at run time
        rc = app.run(list(argv))
        return rc, app.stdout.getvalue(), app.stderr.getvalue()


class TestPlan(CliTest):

    def test_sample_table(self):
        rc, out, _err = self.run_cli('plan')
        self.assertEqual(0, rc)
        self.assertIn('GPUs\nHOST', out)
        self.assertIn('gim-0    0000:85:00.0  MI300X  nova-vf', out)
        self.assertIn('8 VFs (CPX)', out)
        self.assertIn('CPX/NPS4', out)
        self.assertIn('llm-405b-train', out)
        self.assertIn('never-fits', out)
        self.assertIn('needs 16 whole', out)
        self.assertIn('Summary', out)
        self.assertIn('capacity bound', out)
        self.assertIn('stranded', out)
        for kind in ('dedicated', 'vf', 'cu'):
            self.assertIn(' %s ' % kind, out)

    def test_json(self):
        rc, out, _err = self.run_cli('plan', '-f', 'json')
        self.assertEqual(0, rc)
        data = json.loads(out)
        self.assertEqual({'gpus', 'workloads', 'summary', 'ledger'},
                         set(data))
        self.assertEqual(36, len(data['gpus']))
        names = {w['workload']: w for w in data['workloads']}
        self.assertEqual('never-fits', names['llm-405b-train']['code'])
        self.assertEqual('vf', names['tenant-vm-1']['kind'])
        self.assertEqual('cu', names['infer-chat']['kind'])
        self.assertEqual('0-75', names['infer-chat']['grants'][0]['cus'])
        self.assertEqual('dedicated', names['customer-pod']['kind'])
        self.assertEqual(data['summary']['placed'],
                         sum(data['summary']['placed_by_kind'].values()))

    def test_yaml_and_ledger_output(self):
        ledger = self.path('state.yaml')
        rc, out, _err = self.run_cli('plan', '-f', 'yaml', '--output-ledger',
                                     ledger)
        self.assertEqual(0, rc)
        self.assertIn('summary', yaml.safe_load(out))
        with open(ledger) as handle:
            state = yaml.safe_load(handle.read())
        self.assertEqual(1, state['version'])
        self.assertIn('gim-0', state['hosts'])
        self.assertTrue(state['placements'])
        before = os.stat(ledger).st_mtime_ns
        rc, _out, _err = self.run_cli('plan', '--output-ledger', ledger)
        self.assertEqual(before, os.stat(ledger).st_mtime_ns)

    def test_incremental(self):
        state = self.path('state.yaml')
        self.run_cli('plan', '--output-ledger', state)
        extra = self.path('more.yaml', 'workloads:\n'
                          '  - {name: late-vm, platform: vm, memory: 8GiB, '
                          'compute: 19}\n')
        rc, out, _err = self.run_cli('plan', '--ledger', state,
                                     '--workloads', extra, '-f', 'json')
        self.assertEqual(0, rc)
        data = json.loads(out)
        names = {w['workload']: w for w in data['workloads']}
        self.assertEqual('placed', names['late-vm']['code'])
        self.assertTrue(names['tenant-vm-1'].get('existing'))
        self.assertEqual(1, data['summary']['workloads'])

    def test_chart_svg(self):
        chart = self.path('plan.svg')
        rc, _out, _err = self.run_cli('plan', '--chart', chart)
        self.assertEqual(0, rc)
        root = ET.parse(chart).getroot()
        self.assertEqual('{http://www.w3.org/2000/svg}svg', root.tag)
        ns = {'s': 'http://www.w3.org/2000/svg'}
        titles = [t.text for t in root.iterfind('.//s:rect/s:title', ns)]
        self.assertIn('idle', titles)
        self.assertTrue(any(t.startswith('VF 0: tenant-vm-1')
                            for t in titles))
        self.assertTrue(any(t.startswith('infer-chat: CUs 0-75')
                            for t in titles))
        self.assertTrue(any('of partition 0' in t for t in titles))
        texts = [t.text for t in root.iterfind('.//s:text', ns)]
        self.assertIn('llm-train-a', texts)

    def test_chart_png(self):
        chart = self.path('plan.png')
        rc, _out, _err = self.run_cli('plan', '--chart', chart)
        self.assertEqual(0, rc)
        with open(chart, 'rb') as handle:
            self.assertEqual(b'\x89PNG', handle.read(4))

    def test_chart_png_without_matplotlib_says_what_to_install(self):
        chart = self.path('plan.png')
        # None in sys.modules makes the import fail as if not installed.
        with mock.patch.dict(sys.modules, {'matplotlib': None}):
            rc, _out, err = self.run_cli('plan', '--chart', chart)
        self.assertNotEqual(0, rc)
        self.assertIn('PNG charts need matplotlib', err)
        self.assertIn('amdgpu_virt[chart]', err)
        self.assertFalse(os.path.exists(chart))

    def test_chart_bad_extension(self):
        rc, out, err = self.run_cli('plan', '--chart', self.path('x.gif'))
        self.assertNotEqual(0, rc)
        self.assertIn('--chart', err)
        self.assertIn('.svg or .png', err)
        # Refused before planning: no plan is printed and then failed.
        self.assertEqual('', out)

    def test_invalid_workloads_name_the_culprit(self):
        bad = self.path('bad.yaml', 'workloads:\n  - {name: a, gpus: 0, '
                        'memory: 3 parsecs}\n')
        rc, _out, err = self.run_cli('plan', '--workloads', bad)
        self.assertNotEqual(0, rc)
        self.assertIn('bad.yaml', err)
        self.assertIn('gpus', err)
        self.assertIn("unit 'parsecs'", err)

    def test_invalid_fleet(self):
        bad = self.path('fleet.yaml', 'hosts:\n  - {hostname: h, '
                        'model: MI999}\n')
        rc, _out, err = self.run_cli('plan', '--fleet', bad)
        self.assertNotEqual(0, rc)
        self.assertIn('MI999', err)
        self.assertIn('fleet.yaml: host h:', err)
        self.assertIn('known models: MI210', err)

    def test_missing_file(self):
        rc, _out, err = self.run_cli('plan', '--workloads',
                                     self.path('absent.yaml'))
        self.assertNotEqual(0, rc)
        self.assertIn('absent.yaml', err)

    def test_missing_files_say_which_input(self):
        absent = self.path('absent.yaml')
        for option, what in (('--fleet', 'fleet file'),
                             ('--workloads', 'workload file'),
                             ('--ledger', 'ledger')):
            rc, _out, err = self.run_cli('plan', option, absent)
            self.assertNotEqual(0, rc, option)
            self.assertIn('cannot read %s %s' % (what, absent), err, option)

    def test_bad_yaml_says_which_input(self):
        bad = self.path('bad.yaml', 'workloads: [\n')
        rc, _out, err = self.run_cli('plan', '--workloads', bad)
        self.assertNotEqual(0, rc)
        self.assertIn('workload file %s is not valid YAML at line 2, '
                      'column 1: ' % bad, err)
        self.assertNotIn('<unicode string>', err)

    def test_duplicate_key_names_its_line(self):
        bad = self.path('dup.yaml', 'workloads:\n  - name: a\n    name: b\n')
        rc, _out, err = self.run_cli('plan', '--workloads', bad)
        self.assertNotEqual(0, rc)
        self.assertIn('at line 3, column 5', err)
        self.assertIn("found duplicate key 'name'", err)


class TestExplain(CliTest):

    def test_trail(self):
        rc, out, _err = self.run_cli('explain', 'customer-pod')
        self.assertEqual(0, rc)
        self.assertIn('customer-pod: placed', out)
        self.assertIn('[isolation cu] NO: tenancy is isolated', out)
        self.assertIn('[weighers dedicated', out)
        self.assertIn('[planner dedicated', out)

    def test_never(self):
        rc, out, _err = self.run_cli('explain', 'llm-405b-train')
        self.assertEqual(0, rc)
        self.assertIn('never-fits', out)
        self.assertIn('[p2p vf] NO', out)
        self.assertIn('[capacity dedicated MI300X] NO', out)

    def test_unknown_workload(self):
        rc, _out, err = self.run_cli('explain', 'nobody')
        self.assertNotEqual(0, rc)
        self.assertIn("No workload named 'nobody' in the plan; known: "
                      "llm-train-a", err)
        self.assertNotIn('Invalid plan', err)


class TestInvalid(CliTest):

    def test_skip_invalid_reports_code_invalid(self):
        mixed = self.path('mixed.yaml', 'workloads:\n'
                          '  - {name: good, platform: vm}\n'
                          '  - {name: bad, gpus: 0, tenancy: friendly}\n'
                          '  - {gpus: 1}\n')
        rc, out, _err = self.run_cli('plan', '--workloads', mixed,
                                     '--skip-invalid', '-f', 'json')
        self.assertEqual(0, rc)
        data = json.loads(out)
        codes = {w['workload']: w['code'] for w in data['workloads']}
        self.assertEqual({'good': 'placed', 'bad': 'invalid',
                          'workloads[2]': 'invalid'}, codes)
        bad = [w for w in data['workloads'] if w['workload'] == 'bad'][0]
        self.assertIn('gpus', bad['reason'])
        self.assertIn('tenancy', bad['reason'])
        self.assertEqual(2, data['summary']['by_code']['invalid'])
        rc, _out, err = self.run_cli('plan', '--workloads', mixed)
        self.assertNotEqual(0, rc)
        self.assertIn('workloads[1]', err)


class TestConfigValues(CliTest):

    def test_bad_value_names_group_option_and_file(self):
        conf = self.path('bad.conf', '[policy]\ndedicated_threshold = 5\n')
        rc, out, err = self.run_cli('--config-file', conf, 'plan')
        self.assertNotEqual(0, rc)
        self.assertEqual('', out)
        self.assertIn('option [policy] dedicated_threshold: the value in %s '
                      'is not valid' % conf, err)
        self.assertIn('less than or equal to 1', err)
        self.assertNotIn('LocationInfo', err)

    def test_bad_choice_lists_the_allowed_values(self):
        conf = self.path('bad.conf', '[inventory]\ndriver = nvml\n')
        rc, _out, err = self.run_cli('--config-file', conf, 'plan')
        self.assertNotEqual(0, rc)
        self.assertIn('option [inventory] driver', err)
        self.assertIn("'nvml' is not one of sysfs, amdsmi, snapshot", err)

    def test_bad_integer_choice_lists_the_allowed_values(self):
        conf = self.path('bad.conf', '[policy]\nvf_count = 3\n')
        rc, _out, err = self.run_cli('--config-file', conf, 'plan')
        self.assertNotEqual(0, rc)
        self.assertIn('option [policy] vf_count: the value in %s is not '
                      'valid: 3 is not one of 1, 2, 4, 8' % conf, err)
        self.assertNotIn('OrderedDict', err)

    def test_good_file_passes(self):
        conf = self.path('good.conf', '[policy]\ndedicated_threshold = 0.5\n')
        rc, _out, _err = self.run_cli('--config-file', conf, 'plan')
        self.assertEqual(0, rc)
