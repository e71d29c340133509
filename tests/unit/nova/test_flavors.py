"""Flavor definitions: parsing and validation."""

from __future__ import annotations

import os
import textwrap

import testtools
import yaml

from amdgpu_virt import exception
from amdgpu_virt.nova import flavors

GOOD = {'name': 'gpu.1', 'vcpus': 8, 'ram_mib': 1024, 'disk_gb': 40,
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

    def test_several_devices_of_the_plain_alias_get_group_policy_none(self):
        # one request group per device: with two or more and no policy
        # Nova warns at every scheduling
        (two, one) = flavors.parse({'flavors': [
            dict(GOOD, name='two', count=2),
            dict(GOOD, name='one', count=1)]})
        self.assertEqual({'pci_passthrough:alias': 'amd-mi300x-cpx-vf:2',
                          'hw:pci_numa_affinity_policy': 'preferred',
                          'group_policy': 'none'}, two.extra_specs())
        self.assertNotIn('group_policy', one.extra_specs())

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
            ({'flavors': [dict(GOOD, disk_gb=-1)]}, 'flavors[0].disk_gb',
             '>= 0'),
            ({'flavors': [dict(GOOD, count=8, gpus=3)]}, 'flavors[0].gpus',
             'multiple of the 3 GPUs'),
            ({'flavors': [dict(GOOD, count=4, gpus=[1, 1])]},
             'flavors[0].gpus', 'distinct'),
            ({'flavors': [dict(GOOD, count=4, gpus=True)]},
             'flavors[0].gpus', 'True'),
            ({'flavors': [dict(GOOD, count=4, gpus=0)]},
             'flavors[0].gpus', 'GPU count'),
            ({'flavors': [dict(GOOD, count=16, gpus=8, isolate=True)]},
             'flavors[0].isolate', '2 per GPU'),
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

    def test_zero_disk_refused_naming_nova_policy(self):
        no_disk = {k: v for k, v in GOOD.items() if k != 'disk_gb'}
        for raw, word in ((no_disk, 'missing'), (dict(GOOD, disk_gb=0), '0')):
            err = self.assertRaises(exception.ConfigError, flavors.parse,
                                    {'flavors': [raw]}, 'f.yaml')
            self.assertIn('flavors[0].disk_gb: %s' % word, str(err))
            self.assertIn(flavors.ZERO_DISK_POLICY, str(err))
            self.assertIn('--allow-zero-disk', str(err))
        (spec,) = flavors.parse({'flavors': [no_disk]},
                                allow_zero_disk=True)
        self.assertEqual(0, spec.disk_gb)
        self.assertEqual(('gpu.1',), flavors.zero_disk([spec]))

    def test_gpus_spread_over_per_gpu_aliases(self):
        (eight, sixteen, upper) = flavors.parse({'flavors': [
            dict(GOOD, name='a', count=8, gpus=8, isolate=True),
            dict(GOOD, name='b', count=16, gpus=8),
            dict(GOOD, name='c', count=8, gpus=[7, 4, 5, 6])]})
        self.assertEqual(','.join('amd-mi300x-cpx-vf-gpu%d:1' % i
                                  for i in range(8)),
                         eight.extra_specs()['pci_passthrough:alias'])
        self.assertEqual('isolate', eight.extra_specs()['group_policy'])
        self.assertEqual(','.join('amd-mi300x-cpx-vf-gpu%d:2' % i
                                  for i in range(8)),
                         sixteen.extra_specs()['pci_passthrough:alias'])
        self.assertEqual('none', sixteen.extra_specs()['group_policy'])
        self.assertEqual(tuple('amd-mi300x-cpx-vf-gpu%d' % i
                               for i in (4, 5, 6, 7)), upper.aliases())

    def test_gpus_needs_rendered_per_gpu_aliases(self):
        err = self.assertRaises(
            exception.ConfigError, flavors.parse,
            {'flavors': [dict(GOOD, count=2, gpus=2)]}, 'f.yaml',
            known_aliases=['amd-mi300x-cpx-vf', 'amd-mi300x-cpx-vf-gpu0'])
        self.assertIn('alias amd-mi300x-cpx-vf-gpu1 is not rendered',
                      str(err))


class TestDocumentedExamples(testtools.TestCase):
    """The flavor files the docs show are valid, disk size included."""

    def _blocks(self, text: str, marker: str) -> list[str]:
        blocks = []
        for part in text.split(marker)[1:]:
            lines = part.split('\n')[1:]
            block = []
            for line in lines:
                if line.strip() and not line.startswith(' '):
                    break
                block.append(line)
            blocks.append(textwrap.dedent('\n'.join(block)))
        return blocks

    def test_admin_guide_flavors(self):
        path = os.path.join(os.path.dirname(__file__), '..', '..', '..',
                            'doc', 'source', 'admin', 'nova.rst')
        with open(path) as handle:
            text = handle.read()
        (block,) = self._blocks(text, 'Flavors are defined in ``[nova] '
                                      'flavors_file``::')
        specs = flavors.parse(yaml.safe_load(block))
        self.assertEqual(3, len(specs))
        self.assertTrue(all(s.disk_gb > 0 for s in specs))
        self.assertEqual(tuple(range(8)), specs[2].gpus)

    def test_option_help_and_module_examples(self):
        from amdgpu_virt.conf import nova as nova_conf
        (opt,) = [o for o in nova_conf.nova_opts if o.name == 'flavors_file']
        for text in (opt.help, flavors.__doc__):
            block = text.split('::\n', 1)[1].split('\n\n')[0]
            spec = flavors.parse(yaml.safe_load(textwrap.dedent(block)))
            self.assertGreater(spec[0].disk_gb, 0)
