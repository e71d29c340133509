"""Exit statuses: one table for every command, through the real script.

The subprocess tests run the installed ``amdgpu-virt`` console script,
so what is asserted is what a shell (or a deployment tool) sees: the
status, the message on stderr, and no traceback unless ``--debug``.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.cmd import exitcodes
from amdgpu_virt.cmd import pool as cmd_pool

#: a bug, injected at start-up: nothing a user can type makes the
#: project raise a non-project error on purpose, so the test plants one
#: (sitecustomize runs before the script's own imports)
_BUG = '''
import amdgpu_virt.cmd.inventory as target
def take_action(self, parsed_args):
    raise RuntimeError('planted bug in take_action')
target.Inventory.take_action = take_action
'''


_LEDGER = """version: 1
hosts:
  h:
    gpus:
      - {address: "0000:05:00.0", model: MI300X, role: idle}
"""


class TestTable(testtools.TestCase):

    def test_every_project_error_has_its_status(self):
        errors = [cls for _name, cls in inspect.getmembers(
            exception, inspect.isclass)
            if issubclass(cls, exception.AmdgpuVirtError)]
        self.assertGreater(len(errors), 40)
        for cls in errors:
            status = exitcodes.status_of(cls.__new__(cls))
            self.assertIn(status, dict(exitcodes.TABLE), cls.__name__)
            if status == exitcodes.REFUSED:
                # 1 means "refused", never "some error"
                self.assertTrue(issubclass(cls, exception.UnsafeRoleChange),
                                cls.__name__)

    def test_families(self):
        cases = {
            exception.UsageError(option='--gpu', reason='x'): 64,
            exception.ConfigError(option='[a] b', reason='x'): 78,
            exception.DriverNotFound(namespace='n', name='x', known='',
                                     reason='r'): 78,
            exception.FileInputError(what='ledger', path='p', reason='r'): 66,
            exception.NothingReadable(source='s', reason='r'): 66,
            exception.PlanError(source='l', reason='r'): 65,
            exception.SnapshotError(path='p', reason='r'): 65,
            exception.AmdgpuVirtError('x.yaml is not valid YAML'): 65,
            exception.PlacementUnreachable(request='GET /', reason='r'): 69,
            exception.KubernetesUnavailable(request='GET', reason='r'): 69,
            exception.ServiceUnreachable(service='s', where='w', reason='r',
                                         options='o'): 69,
            exception.PlacementError(request='GET /', reason='403'): 76,
            exception.KubernetesError(request='GET', reason='403'): 76,
            exception.KubernetesConflict(obj='o'): 75,
            exception.UnsafeRoleChange(gpu='g', reason='r'): 1,
            RuntimeError('bug'): 70,
            KeyError('bug'): 70,
        }
        for error, status in cases.items():
            self.assertEqual(status, exitcodes.status_of(error), repr(error))

    def test_the_statuses_are_distinct_and_the_pool_uses_them(self):
        statuses = [status for status, _meaning in exitcodes.TABLE]
        self.assertEqual(len(statuses), len(set(statuses)))
        self.assertEqual(
            (0, 1, 3, 69, 75),
            (cmd_pool.EXIT_OK, cmd_pool.EXIT_REFUSED, cmd_pool.EXIT_DRIFT,
             cmd_pool.EXIT_UNREACHABLE, cmd_pool.EXIT_WAITING))


class TestConsoleScript(testtools.TestCase):
    """The installed script in a subprocess, for several commands."""

    def setUp(self):
        super().setUp()
        self.script = os.path.join(os.path.dirname(sys.executable),
                                   'amdgpu-virt')
        if not os.path.exists(self.script):
            self.skipTest('amdgpu-virt is not installed next to %s'
                          % sys.executable)
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def run_script(self, *argv, env=None):
        done = subprocess.run([self.script, *argv], capture_output=True,
                              text=True, timeout=120, cwd=self.tmp,
                              env=dict(os.environ, **(env or {})),
                              stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr

    def path(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, 'w') as handle:
            handle.write(text)
        return path

    def assertFails(self, status, culprit, *argv, env=None):
        rc, _out, err = self.run_script(*argv, env=env)
        self.assertEqual(status, rc, err)
        self.assertIn(culprit, err)
        self.assertNotIn('Traceback', err)
        return err

    def test_usage_errors_exit_64(self):
        self.assertFails(64, 'no-such-command', 'no-such-command')
        self.assertFails(64, "Unknown command ['nope']", 'help', 'nope')
        self.assertFails(64, 'the following arguments are required: --gpu',
                         'move', '--ledger', 'l.yaml', '--to', 'idle')
        self.assertFails(64, "invalid int value: 'many'", 'move',
                         '--ledger', 'l.yaml', '--gpu', 'h:0000:05:00.0',
                         '--to', 'nova-vf', '--vf-count', 'many')
        self.assertFails(64, '--gpu nohost', 'move', '--ledger',
                         self.path('l.yaml', _LEDGER),
                         '--gpu', 'nohost', '--to', 'idle')
        self.assertFails(64, '--part gpus, workloads or summary', 'plan',
                         '-f', 'csv')
        rc, out, _err = self.run_script()
        self.assertEqual(64, rc)
        self.assertIn('Commands:', out)

    def test_bad_configuration_exits_78(self):
        conf = self.path('bad.conf', '[kubernetes]\nshare_count = many\n')
        err = self.assertFails(78, '[kubernetes] share_count',
                               '--config-file', conf, 'plan')
        self.assertIn(conf, err)

    def test_missing_and_bad_inputs_exit_66_and_65(self):
        missing = os.path.join(self.tmp, 'nowhere.yaml')
        self.assertFails(66, missing, 'plan', '--fleet', missing)
        bad = self.path('fleet.yaml', 'hosts: [unclosed\n')
        self.assertFails(65, bad, 'plan', '--fleet', bad)
        self.assertFails(66, 'No AMD GPU could be read', 'inventory',
                         '--sysfs-root', os.path.join(self.tmp, 'empty'))

    def test_an_unknown_column_is_a_usage_error(self):
        err = self.assertFails(64, "no column 'Nope'", 'plan', '--part',
                               'gpus', '-c', 'Nope')
        self.assertIn('Host, Address', err)
        # one known name does not hide an unknown one
        self.assertFails(64, "no column 'Nope'", 'plan', '--part', 'gpus',
                         '-c', 'Host', '-c', 'Nope')
        rc, out, _err = self.run_script('plan', '--part', 'gpus', '-c',
                                        'host', '-f', 'value')
        self.assertEqual(0, rc)
        self.assertIn('gim-0', out)

    def test_an_unwritable_output_exits_73(self):
        blocker = self.path('file', 'x')
        self.assertFails(73, 'cannot write %s' % os.path.join(blocker, 'x'),
                         'simulate-host', '--out',
                         os.path.join(blocker, 'x'))
        self.assertFails(73, 'cannot write', 'plan', '--output-ledger',
                         os.path.join(blocker, 'ledger.yaml'))
        self.assertFails(73, 'cannot write %s' % self.tmp, 'plan',
                         '--output-ledger', self.tmp)
        self.assertFails(73, 'cannot write', 'plan', '--chart',
                         os.path.join(blocker, 'chart.svg'))

    def test_a_config_file_that_is_no_text_file_exits_78_at_once(self):
        binary = os.path.join(self.tmp, 'binary.conf')
        with open(binary, 'wb') as handle:
            handle.write(b'\xc3\x28[DEFAULT]\x00\xff')
        err = self.assertFails(78, binary, '--config-file', binary, 'plan')
        self.assertIn('error: ', err)
        self.assertIn('not UTF-8', err)
        fifo = os.path.join(self.tmp, 'fifo.conf')
        os.mkfifo(fifo)
        # oslo.config would open the FIFO and wait for a writer for ever
        done = subprocess.run([self.script, '--config-file', fifo, 'plan'],
                              capture_output=True, text=True, timeout=60,
                              cwd=self.tmp, stdin=subprocess.DEVNULL)
        self.assertEqual(78, done.returncode, done.stderr)
        self.assertIn('%s: it is a FIFO' % fifo, done.stderr)
        self.assertFails(78, '/dev/zero', '--config-file', '/dev/zero',
                         'plan')

    def test_missing_snapshots_exit_66(self):
        missing = os.path.join(self.tmp, 'nowhere')
        self.assertFails(66, 'cannot read --snapshot-dir %s: no such '
                         'directory' % missing, 'plan', '--snapshot-dir',
                         missing)
        self.assertFails(66, 'it is not a directory', 'plan',
                         '--snapshot-dir', self.path('plain', 'x'))
        self.assertFails(66, missing, 'inventory', '--driver', 'snapshot',
                         '--snapshot', missing)

    def test_an_internal_error_exits_70_with_a_traceback_only_in_debug(self):
        site = os.path.join(self.tmp, 'site')
        os.makedirs(site)
        self.path('site/sitecustomize.py', _BUG)
        env = {'PYTHONPATH': site}
        root = os.path.join(self.tmp, 'root')
        err = self.assertFails(70, 'internal error in inventory: '
                               'RuntimeError: planted bug in take_action',
                               'inventory', '--sysfs-root', root, env=env)
        self.assertIn('--debug', err)
        rc, _out, err = self.run_script('--debug', 'inventory',
                                        '--sysfs-root', root, env=env)
        self.assertEqual(70, rc)
        self.assertIn('Traceback', err)
        self.assertIn('planted bug', err)

    def test_help_prints_the_table(self):
        rc, out, _err = self.run_script('--help')
        self.assertEqual(0, rc)
        self.assertIn('Exit statuses:', out)
        for status, meaning in exitcodes.TABLE:
            self.assertIn('%-3d %s' % (status, meaning[:30]), out)
