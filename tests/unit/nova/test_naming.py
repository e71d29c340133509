"""The naming scheme of resource classes, traits and aliases."""

from __future__ import annotations

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.nova import naming


class TestNaming(testtools.TestCase):

    def test_defaults(self):
        n = naming.Naming()
        self.assertEqual('CUSTOM_AMD_MI300X_CPX_VF',
                         n.vf_resource_class('MI300X', 'cpx', 'NPS4', 8))
        self.assertEqual('CUSTOM_AMD_MI300X_HF',
                         n.dedicated_resource_class('MI300X HF'))
        self.assertEqual('CUSTOM_AMD_MI250X_MI250',
                         n.dedicated_resource_class('MI250X/MI250'))
        self.assertEqual('amd-mi300x-hf-cpx-vf',
                         n.vf_alias('MI300X HF', 'CPX', 'NPS4', 8))
        self.assertEqual(('CUSTOM_AMD_MEMORY_NPS4', 'CUSTOM_AMD_MODEL_MI300X',
                          'CUSTOM_AMD_PARTITION_CPX'),
                         n.traits('MI300X', 'CPX', 'NPS4'))

    def test_every_catalog_model_gives_valid_names(self):
        n = naming.Naming()
        for model in catalog.MODELS:
            for count, mode in catalog.VF_COUNT_MODES.items():
                rc = n.vf_resource_class(model.name, mode, 'NPS1', count)
                self.assertRegex(rc, naming.CUSTOM_NAME_RE)
            for trait in n.traits(model.name, 'SPX', 'NPS1'):
                self.assertRegex(trait, naming.CUSTOM_NAME_RE)

    def test_bad_templates_name_their_option(self):
        cases = {
            'vf_resource_class_template': dict(
                vf_resource_class_template='AMD_{model}'),
            'dedicated_resource_class_template': dict(
                dedicated_resource_class_template='CUSTOM_{nope}'),
            'vf_alias_template': dict(vf_alias_template='amd {model}'),
            'trait_prefix': dict(trait_prefix='AMD_'),
        }
        for option, kwargs in cases.items():
            err = self.assertRaises(exception.ConfigError, naming.Naming,
                                    **kwargs)
            self.assertIn(option, str(err))

    def test_too_long_name(self):
        err = self.assertRaises(
            exception.ConfigError, naming.Naming,
            dedicated_resource_class_template='CUSTOM_' + 'X' * 250 +
            '{model}')
        self.assertIn('255', str(err))

    def test_provider_name(self):
        self.assertEqual('compute-1_0000:C5:00.0',
                         naming.provider_name('compute-1', '0000:c5:00.0'))

    @given(st.text(min_size=1, max_size=40))
    def test_slug_is_always_placement_safe(self, text):
        value = naming.slug(text)
        if value:
            self.assertRegex('CUSTOM_' + value, naming.CUSTOM_NAME_RE)
