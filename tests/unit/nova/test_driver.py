"""The stevedore backend and its configuration."""

from __future__ import annotations

import testtools

from amdgpu_virt import conf as av_conf
from amdgpu_virt import exception
from amdgpu_virt import plugins
from amdgpu_virt.inventory.simulate import HostSpec
from amdgpu_virt.inventory.simulate import design_host
from amdgpu_virt.nova import client
from amdgpu_virt.nova.driver import NovaBackend


class TestBackend(testtools.TestCase):

    def test_loaded_by_name(self):
        backend = plugins.load_driver('amdgpu_virt.backends', 'nova',
                                      av_conf.new_conf())
        self.assertIsInstance(backend, NovaBackend)

    def test_templates_from_conf(self):
        conf = av_conf.new_conf()
        conf.set_override('vf_resource_class_template',
                          'CUSTOM_GPU_{model}_{vf_count}VF', group='nova')
        conf.set_override('numa_policy', 'required', group='nova')
        backend = NovaBackend(conf)
        text = backend.render_compute(design_host(HostSpec('h', gpus=1,
                                                           mode='gim-cpx')))
        self.assertIn('"resource_class":"CUSTOM_GPU_MI300X_8VF"', text)
        self.assertIn('"numa_policy":"required"', text)

    def test_bad_template_option_named(self):
        conf = av_conf.new_conf()
        conf.set_override('dedicated_resource_class_template', 'GPU_{model}',
                          group='nova')
        err = self.assertRaises(exception.ConfigError, NovaBackend, conf)
        self.assertIn('[nova] dedicated_resource_class_template', str(err))

    def test_extra_spec_tags_checked(self):
        conf = av_conf.new_conf()
        conf.set_override('extra_spec_tags', {'trusted_': 'true'},
                          group='nova')
        err = self.assertRaises(
            exception.NovaConfigError, NovaBackend(conf).render_compute,
            design_host(HostSpec('h', gpus=1, mode='vfio')))
        self.assertIn("'trusted_'", str(err))

    def test_no_cloud_configured(self):
        err = self.assertRaises(exception.ConfigError, client.connect,
                                av_conf.new_conf())
        self.assertIn('[nova] cloud', str(err))


class _Unreachable:
    """An openstacksdk connection whose service proxies fail discovery,
    as they do when the endpoint does not answer (no server is needed)."""

    @property
    def placement(self):
        raise RuntimeError('Unable to find a version discovery document.')

    compute = placement


class TestUnreachable(testtools.TestCase):

    def test_placement_names_endpoint_and_options(self):
        conf = av_conf.new_conf()
        conf.set_override('placement_endpoint', 'http://placement.test',
                          group='nova')
        backend = NovaBackend(conf, connection=_Unreachable())
        err = self.assertRaises(exception.ServiceUnreachable,
                                backend.drain_check, 'compute-1',
                                '0000:05:00.0')
        self.assertEqual(
            'Cannot reach the Placement API at http://placement.test: '
            'RuntimeError: Unable to find a version discovery document; '
            'check [nova] placement_endpoint and token', str(err))

    def test_cloud_names_the_cloud(self):
        conf = av_conf.new_conf()
        conf.set_override('cloud', 'prod', group='nova')
        backend = NovaBackend(conf, connection=_Unreachable())
        err = self.assertRaises(exception.ServiceUnreachable,
                                backend.sync_flavors, [], False)
        self.assertIn('Nova compute API at the endpoint of cloud prod',
                      str(err))
        self.assertIn('check [nova] cloud and its clouds.yaml entry',
                      str(err))
