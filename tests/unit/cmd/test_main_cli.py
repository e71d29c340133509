"""``amdgpu-virt`` itself: what an operator sees without a command."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import testtools

from amdgpu_virt.cmd import main
from tests.unit.cmd import test_inventory_cli


class TestNoCommand(test_inventory_cli.CliTestCase):

    def test_prints_help_instead_of_a_shell(self):
        # stdin is never read: an interactive shell would wait on it.
        status, out, _err = self.run_cli()
        self.assertEqual(64, status)   # EX_USAGE
        self.assertTrue(out.startswith('usage: '), out)
        self.assertIn('Commands:', out)
        for command in ('plan', 'inventory', 'simulate-host', 'k8s agent',
                        'nova config', 'apply', 'audit', 'move'):
            self.assertIn(command, out)


#: run in a fresh interpreter: which modules a command line imported
_PROBE = '''
import json, sys
from amdgpu_virt.cmd import main
try:
    main.main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
'''

#: what no command needs until it talks to a cloud (each costs a large
#: share of the start: see bench/README.rst, startup.py)
HEAVY = ('openstack', 'keystoneauth1', 'kubernetes', 'grpc',
         'google.protobuf', 'prometheus_client')


class TestStartup(testtools.TestCase):

    def imported(self, *argv):
        done = subprocess.run(
            [sys.executable, '-c', _PROBE, *argv], capture_output=True,
            text=True, timeout=120, stdin=subprocess.DEVNULL)
        return set(json.loads(done.stdout.splitlines()[-1]))

    def test_only_the_command_run_is_imported(self):
        modules = self.imported('simulate-host', '--help')
        self.assertIn('amdgpu_virt.cmd.simulate', modules)
        others = sorted(m for m in modules if m.startswith('amdgpu_virt.cmd.')
                        and m not in ('amdgpu_virt.cmd.main',
                                      'amdgpu_virt.cmd.exitcodes',
                                      'amdgpu_virt.cmd.simulate'))
        self.assertEqual([], others)

    def test_no_cloud_client_is_imported_to_start_a_command(self):
        for argv in (('--version',), ('plan', '--help'),
                     ('nova', 'config', '--help'), ('k8s', 'agent', '--help'),
                     ('audit', '--help'), ('status', '--help'),
                     ('plan', '--part', 'summary', '-f', 'value')):
            modules = self.imported(*argv)
            self.assertEqual([], sorted(
                m for m in modules if m.split('.')[0] in HEAVY
                or m in HEAVY), argv)


class TestLogging(testtools.TestCase):

    def test_a_run_leaves_the_process_logging_as_it_was(self):
        root = logging.getLogger()
        self.addCleanup(root.setLevel, root.level)
        root.setLevel(logging.WARNING)
        handlers = list(root.handlers)
        for argv in (['plan', '--part', 'summary', '-f', 'value'],
                     ['-v', '-v', 'simulate-host', '--help'],
                     ['--config-file', '/nonexistent', 'plan']):
            app = main.AmdgpuVirtApp()
            app.stdout, app.stderr = io.StringIO(), io.StringIO()
            app.run(argv)
            self.assertEqual(logging.WARNING, root.level, argv)
            self.assertEqual(handlers, root.handlers, argv)

    def test_while_it_runs_the_root_is_no_lower_than_its_handlers(self):
        seen = []
        app = main.AmdgpuVirtApp()
        app.stdout, app.stderr = io.StringIO(), io.StringIO()
        real = app.initialize_app

        def spy(argv):
            seen.append(logging.getLogger().level)
            real(argv)

        app.initialize_app = spy
        app.run(['plan', '--part', 'summary', '-f', 'value'])
        self.assertEqual([logging.INFO], seen)
