"""Flavor definitions: parsing and validation."""

from __future__ import annotations

import testtools

from amdgpu_virt import exception
from amdgpu_virt.nova import flavors

GOOD = {'name': 'gpu.1', 'vcpus': 8, 'ram_mib': 1024,
        'alias': 'amd-mi300x-cpx-vf'}


class TestParse(testtools.TestCase):

    def test_defaults(self):
        (spec,) = flavors.parse({'flavors': [GOOD]},
                                default_numa_policy='socket')
        self.assertEqual({'pci_passthrough:alias': 'amd-mi300x-cpx-vf:1',
                          'hw:pci_numa_affinity_policy': 'socket'},
                         spec.extra_specs())

    def test_isolate_and_extra(self):
        (spec,) = flavors.parse({'flavors': [dict(
            GOOD, count=4, isolate=True,
            extra_specs={'hw:cpu_policy': 'dedicated'})]})
        self.assertEqual('isolate', spec.extra_specs()['group_policy'])
        self.assertEqual('dedicated', spec.extra_specs()['hw:cpu_policy'])

    def test_bad_input_names_the_field(self):
        cases = [
            ({'flavors': [dict(GOOD, vcpu=1)]}, 'flavors[0]', 'vcpu'),
            ({'flavors': [dict(GOOD, vcpus=0)]}, 'flavors[0].vcpus', '>= 1'),
            ({'flavors': [dict(GOOD, count='2')]}, 'flavors[0].count', "'2'"),
            ({'flavors': [dict(GOOD, alias='a:1')]}, 'flavors[0].alias',
             'one alias'),
            ({'flavors': [dict(GOOD, numa_policy='strict')]},
             'flavors[0].numa_policy', 'strict'),
            ({'flavors': [dict(GOOD, isolate='yes')]}, 'flavors[0].isolate',
             'yes'),
            ({'flavors': [GOOD, GOOD]}, 'flavors[1].name', 'twice'),
            ({'flavors': [dict(GOOD, extra_specs={'group_policy': 'none'})]},
             'flavors[0].extra_specs', 'group_policy'),
            ({'flavors': [{'name': 'x'}]}, 'flavors[0]', 'vcpus is required'),
            ({'flavor': []}, 'f.yaml', '"flavors" list'),
        ]
        for data, where, needle in cases:
            err = self.assertRaises(exception.ConfigError, flavors.parse,
                                    data, 'f.yaml')
            self.assertIn(where, str(err))
            self.assertIn(needle, str(err))

    def test_unknown_alias(self):
        err = self.assertRaises(exception.ConfigError, flavors.parse,
                                {'flavors': [GOOD]}, 'f.yaml',
                                known_aliases=['amd-mi300x'])
        self.assertIn('amd-mi300x-cpx-vf', str(err))
        self.assertIn('known: amd-mi300x', str(err))
