"""Fleet files: YAML lists of simulated hosts."""

from __future__ import annotations

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import fleet


class TestFleet(testtools.TestCase):

    def write(self, text):
        path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                            'fleet.yaml')
        with open(path, 'w') as handle:
            handle.write(text)
        return path

    def test_sample_fleet(self):
        hosts = fleet.load_fleet()
        self.assertEqual(['gim-0', 'gim-1', 'bm-0', 'bm-1', 'mi210-0'],
                         [h.hostname for h in hosts])
        self.assertEqual(64, hosts[0].vf_count)
        self.assertEqual(63, hosts[3].partition_count)

    def test_gpu_modes_set_the_count(self):
        path = self.write('hosts:\n  - {hostname: m, gpu_modes: '
                          '[gim-cpx, spx, vfio]}\n')
        (host,) = fleet.load_fleet(path)
        self.assertEqual(3, len(host.gpus))

    def test_bad_files_name_the_culprit(self):
        cases = (
            ('[]', 'expected a mapping with a "hosts" list'),
            ('hosts: {}', 'expected a mapping with a "hosts" list'),
            ('hosts: [3]', 'hosts[0]: expected a mapping'),
            ('hosts:\n  - {model: MI300X}', 'hosts[0]: hostname is required'),
            ('hosts:\n  - {hostname: a, colour: red}',
             'hosts[0]: unknown key(s) colour'),
            ('hosts:\n  - {hostname: a}\n  - {hostname: a}',
             'hosts[1]: host a is listed twice'),
            ('hosts:\n  - {hostname: a, hostname: b}', 'duplicate key'),
            ('hosts: [', 'is not valid YAML'),
        )
        for text, message in cases:
            path = self.write(text)
            err = self.assertRaises(exception.AmdgpuVirtError,
                                    fleet.load_specs, path)
            self.assertIn(path, str(err), text)
            self.assertIn(message, str(err), text)

    def test_impossible_host(self):
        path = self.write('hosts:\n  - {hostname: a, model: MI250X, '
                          'mode: gim-cpx}\n')
        err = self.assertRaises(exception.SimulationError, fleet.load_fleet,
                                path)
        self.assertIn('MI250X has no SR-IOV VFs', str(err))

    def test_missing_file(self):
        err = self.assertRaises(exception.AmdgpuVirtError, fleet.load_specs,
                                '/nonexistent/fleet.yaml')
        self.assertIn('cannot read fleet file /nonexistent/fleet.yaml',
                      str(err))

    def test_impossible_host_names_file_and_host(self):
        path = self.write('hosts:\n  - {hostname: ok, gpus: 1}\n'
                          '  - {hostname: bad, model: MI999}\n')
        err = self.assertRaises(exception.SimulationError, fleet.load_fleet,
                                path)
        self.assertIn('%s: host bad: Unknown GPU model' % path, str(err))
        path = self.write('hosts:\n  - {hostname: b2, model: MI250X, '
                          'mode: gim-cpx}\n')
        err = self.assertRaises(exception.SimulationError, fleet.load_fleet,
                                path)
        # The reason once, not "Cannot simulate host" twice.
        self.assertEqual(1, str(err).count('Cannot simulate host'))
        self.assertIn('host b2: MI250X has no SR-IOV VFs', str(err))

    def test_gpu_count_out_of_range(self):
        for gpus in (0, 17, -1):
            path = self.write('hosts:\n  - {hostname: a, gpus: %d}\n' % gpus)
            err = self.assertRaises(exception.SimulationError,
                                    fleet.load_fleet, path)
            self.assertIn('gpus %d is out of range; allowed: 1..16' % gpus,
                          str(err))
