"""``amdgpu-virt`` itself: what an operator sees without a command."""

from __future__ import annotations

import json
import subprocess
import sys

import testtools

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
