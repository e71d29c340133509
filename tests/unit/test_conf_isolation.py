"""Two configurations never share option overrides."""

from __future__ import annotations

import testtools

from amdgpu_virt import conf


class TestIsolation(testtools.TestCase):

    def test_override_does_not_leak_into_another_conf(self):
        first, second = conf.new_conf(), conf.new_conf()
        first.set_override('snapshot_path', '/a.json', group='inventory')
        self.assertEqual('/a.json', first.inventory.snapshot_path)
        self.assertIsNone(second.inventory.snapshot_path)
        self.assertIsNone(conf.new_conf().inventory.snapshot_path)
