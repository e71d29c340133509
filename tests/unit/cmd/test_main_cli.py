"""``amdgpu-virt`` itself: what an operator sees without a command."""

from __future__ import annotations

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
