"""``amdgpu-virt nova config`` / ``gim-config`` with a ledger, in-process,
on a simulated host tree (there is no AMD GPU on a test machine)."""

from __future__ import annotations

import os

from tests.unit.cmd import test_inventory_cli

LEDGER = """\
version: 1
hosts:
  gim-0:
    gpus:
      - {address: "0000:05:00.0", model: MI300X, role: nova-vf,
         vf_count: 8}
"""


class TestLedgerHost(test_inventory_cli.CliTestCase):

    def setUp(self):
        super().setUp()
        self.root, _out = self.simulate('--gpus', '1', '--mode', 'gim-cpx')
        self.ledger = os.path.join(self.tmp, 'ledger.yaml')
        with open(self.ledger, 'w') as handle:
            handle.write(LEDGER)

    def test_host_missing_from_ledger_is_warned_about(self):
        for command in ('config', 'gim-config'):
            status, out, err = self.run_cli(
                'nova', command, '--sysfs-root', self.root,
                '--hostname', 'compute-9', '--ledger', self.ledger)
            self.assertEqual(0, status, command)
            self.assertIn('warning: host compute-9 is not in ledger %s '
                          '(hosts: gim-0), so no GPU is offered to Nova; '
                          'give the ledger\'s name with --host'
                          % self.ledger, err, command)

    def test_host_in_ledger_renders_without_warning(self):
        status, out, err = self.run_cli(
            'nova', 'config', '--sysfs-root', self.root,
            '--hostname', 'compute-9', '--ledger', self.ledger,
            '--host', 'gim-0')
        self.assertEqual(0, status)
        self.assertNotIn('warning', err)
        self.assertIn('"address":"0000:05:02.*"', out)


class TestDrainCheck(test_inventory_cli.CliTestCase):

    def test_bad_address_is_refused_before_any_request(self):
        # No [nova] options are set: reaching the connection would fail
        # with a configuration error instead of naming the address.
        status, _out, _err = self.run_cli('nova', 'drain-check',
                                          '--gpu', '85:00')
        self.assertEqual(65, status)
        self.assertIn("'85:00' is not a PCI address", self.logger.output)
        self.assertNotIn('[nova] cloud', self.logger.output)
