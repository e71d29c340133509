"""Configuration: every group registers, files are read, bad values fail."""

import os

import fixtures
import testtools
from oslo_config import cfg

from amdgpu_virt import conf
from amdgpu_virt.conf import opts


class TestConf(testtools.TestCase):

    def _file(self, text):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'amdgpu_virt.conf')
        with open(path, 'w') as handle:
            handle.write(text)
        return path

    def test_defaults_need_no_file(self):
        c = conf.new_conf()
        self.assertEqual('sysfs', c.inventory.driver)
        self.assertEqual('/sys', c.inventory.sysfs_root)

    def test_file_is_read(self):
        path = self._file('[inventory]\ndriver = snapshot\n'
                          'snapshot_path = /tmp/x.json\n')
        c = conf.new_conf(default_config_files=[path])
        self.assertEqual('snapshot', c.inventory.driver)
        self.assertEqual('/tmp/x.json', c.inventory.snapshot_path)

    def test_bad_choice_names_the_option(self):
        path = self._file('[inventory]\ndriver = lspci\n')
        c = conf.new_conf(default_config_files=[path])
        err = self.assertRaises(cfg.ConfigFileValueError,
                                getattr, c.inventory, 'driver')
        self.assertIn('lspci', str(err))

    def test_test_runner_argv_is_never_parsed(self):
        # new_conf() parses [] unless told otherwise.
        c = conf.new_conf()
        self.assertEqual([], c.config_file)

    def test_list_opts_covers_every_group(self):
        groups = [group.name for group, _opts in opts.list_opts()]
        self.assertEqual(len(groups), len(set(groups)))
        self.assertIn('inventory', groups)
        self.assertIn('sharing', groups)
        for _group, options in opts.list_opts():
            for opt in options:
                self.assertTrue(opt.help, '%s has no help' % opt.name)

