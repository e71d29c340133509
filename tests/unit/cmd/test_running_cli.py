"""``--running-from``: the sources of live running placements."""

from __future__ import annotations

import argparse

import testtools

from amdgpu_virt import exception
from amdgpu_virt.cmd import running as cmd_running


class ParseSourcesTest(testtools.TestCase):

    def test_sources(self):
        self.assertEqual(('k8s', 'placement'),
                         cmd_running.parse_sources('k8s, Placement,k8s'))
        self.assertEqual(('placement',),
                         cmd_running.parse_sources('placement'))

    def test_an_unknown_or_empty_source_is_refused_naming_it(self):
        for value, culprit in (('k8s,nova', "'nova'"), ('', "''"),
                               ('k8s,', "''")):
            err = self.assertRaises(argparse.ArgumentTypeError,
                                    cmd_running.parse_sources, value)
            self.assertEqual('%s is not a source of running placements '
                             '(choose from k8s, placement)' % culprit,
                             str(err))

    def test_plan_without_the_application_refuses(self):
        from amdgpu_virt.cmd import plan as cmd_plan
        from tests.unit.policy import utils
        args = argparse.Namespace(
            fleet=None, snapshot_dir=None, sysfs_root=None, workloads=None,
            ledger=None, running_from=('k8s',))
        err = self.assertRaises(exception.AmdgpuVirtError, cmd_plan.make_plan,
                                utils.conf(), args)
        self.assertIn('--running-from needs', str(err))
