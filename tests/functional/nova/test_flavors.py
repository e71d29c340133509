"""Flavors against Nova's real compute API (microversion 2.86)."""

from __future__ import annotations

import unittest
import uuid

import testtools

from amdgpu_virt import exception
from amdgpu_virt.nova import flavors
from tests.functional.fixtures import nova_env


def _spec(name: str, **kw) -> flavors.FlavorSpec:
    values = dict(name=name, vcpus=8, ram_mib=65536, disk_gb=40,
                  alias='amd-mi300x-cpx-vf', count=2, isolate=True)
    values.update(kw)
    return flavors.FlavorSpec(**values)


@unittest.skipUnless(nova_env.AVAILABLE, nova_env.SKIP_REASON)
class TestFlavors(testtools.TestCase):

    def setUp(self):
        super().setUp()
        from tests.functional.fixtures import nova_api
        self.server = nova_api.get_server()
        self.compute = self.server.connection().compute
        self.name = 'gpu.%s' % uuid.uuid4().hex[:8]

    def test_create_then_second_run_writes_nothing(self):
        spec = _spec(self.name)
        self.assertEqual('created',
                         flavors.sync(self.compute, [spec])[0].action)
        flavor = self.compute.find_flavor(self.name)
        self.assertEqual({'pci_passthrough:alias': 'amd-mi300x-cpx-vf:2',
                          'hw:pci_numa_affinity_policy': 'preferred',
                          'group_policy': 'isolate'}, flavor.extra_specs)
        self.assertEqual((8, 65536, 40), (flavor.vcpus, flavor.ram,
                                           flavor.disk))
        self.server.counter.reset()
        (change,) = flavors.sync(self.compute, [spec])
        self.assertEqual('unchanged', change.action)
        self.assertEqual(0, self.server.counter.writes)
        self.assertGreater(self.server.counter.total, 0)

    def test_update_extra_specs_only_what_changed(self):
        flavors.sync(self.compute, [_spec(self.name)])
        self.server.counter.reset()
        (change,) = flavors.sync(self.compute, [_spec(
            self.name, count=1, isolate=False, numa_policy='required')])
        self.assertEqual('updated', change.action)
        flavor = self.compute.find_flavor(self.name)
        self.assertEqual({'pci_passthrough:alias': 'amd-mi300x-cpx-vf:1',
                          'hw:pci_numa_affinity_policy': 'required'},
                         flavor.extra_specs)
        # two changed keys, one removed key
        self.assertEqual(3, self.server.counter.writes)

    def test_shape_change_is_a_conflict_unless_replace(self):
        flavors.sync(self.compute, [_spec(self.name)])
        bigger = _spec(self.name, vcpus=16)
        (change,) = flavors.sync(self.compute, [bigger])
        self.assertEqual('conflict', change.action)
        self.assertIn('vcpus 8 -> 16', str(change))
        self.assertEqual(8, self.compute.find_flavor(self.name).vcpus)
        (change,) = flavors.sync(self.compute, [bigger], replace=True)
        self.assertEqual('replaced', change.action)
        self.assertEqual(16, self.compute.find_flavor(self.name).vcpus)

    def test_nova_rejects_what_we_pass_through_names_flavor(self):
        bad = _spec(self.name, extra=(('hw:cpu_policy', 'bogus'),))
        err = self.assertRaises(exception.NovaApiError, flavors.sync,
                                self.compute, [bad])
        self.assertIn(self.name, str(err))

    def test_non_admin_is_refused(self):
        compute = self.server.connection('alice:proj').compute
        err = self.assertRaises(exception.NovaApiError, flavors.sync,
                                compute, [_spec(self.name)])
        self.assertIn('403', str(err))
