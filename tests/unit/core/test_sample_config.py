"""The committed sample configuration must match the options in the code."""

import os

import fixtures
import testtools
from oslo_config import cfg
from oslo_config import generator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
GENERATOR_CONF = os.path.join(ROOT, 'etc', 'amdgpu_virt',
                              'amdgpu-virt-config-generator.conf')
SAMPLE = os.path.join(ROOT, 'etc', 'amdgpu_virt', 'amdgpu_virt.conf.sample')


class TestSampleConfig(testtools.TestCase):

    def test_sample_is_current(self):
        out = os.path.join(self.useFixture(fixtures.TempDir()).path,
                           'sample.conf')
        conf = cfg.ConfigOpts()
        generator.register_cli_opts(conf)
        conf(['--config-file', GENERATOR_CONF, '--output-file', out])
        generator.generate(conf)
        with open(out) as handle:
            fresh = handle.read()
        with open(SAMPLE) as handle:
            committed = handle.read()
        self.assertEqual(fresh, committed,
                         'etc/amdgpu_virt/amdgpu_virt.conf.sample is out of '
                         'date: run "tox -e genconfig" and commit the result')
