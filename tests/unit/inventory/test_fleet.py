"""Fleet files: YAML lists of simulated hosts."""

from __future__ import annotations

import os
import tracemalloc

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
            # tests of readers may build what the catalog lacks; files not
            ('hosts:\n  - {hostname: a, off_catalog: true}',
             'hosts[0]: unknown key(s) off_catalog'),
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

    def test_a_huge_gpu_count_is_refused_before_anything_is_built(self):
        # it once built one mode per GPU first: 72 s and 7.9 GB for 10^9
        path = self.write('hosts:\n  - {hostname: a, gpus: 1000000000}\n')
        tracemalloc.start()
        try:
            err = self.assertRaises(exception.SimulationError,
                                    fleet.load_fleet, path)
            _size, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertIn('hosts[0]: gpus 1000000000 is out of range; '
                      'allowed: 1..16', str(err))
        self.assertLess(peak, 16 * 1024 * 1024)

    def test_fields_of_the_wrong_type_name_the_field(self):
        cases = (
            ('{hostname: a, gpus: many}', 'gpus must be an integer'),
            ('{hostname: a, gpus: true}', 'gpus must be an integer'),
            ('{hostname: a, mode: [spx]}', 'mode must be a string'),
            ('{hostname: 7}', 'hostname must be a string'),
            ('{hostname: a, gpu_modes: spx}', 'gpu_modes must be a list'),
            ('{hostname: a, gpu_modes: [%s]}' % ', '.join(['spx'] * 17),
             'gpu_modes lists 17 GPUs; at most 16'),
        )
        for entry, message in cases:
            path = self.write('hosts:\n  - %s\n' % entry)
            err = self.assertRaises(exception.SimulationError,
                                    fleet.load_fleet, path)
            self.assertIn('%s: hosts[0]: %s' % (path, message), str(err))

    def test_a_vf_count_the_catalog_does_not_list_is_refused(self):
        for model, mode, allowed in (('MI300X', 'gim-qpx', '1, 8'),
                                     ('MI300X', 'gim-dpx', '1, 8'),
                                     ('MI210', 'gim-cpx', '1')):
            path = self.write('hosts:\n  - {hostname: a, model: %s, '
                              'mode: %s}\n' % (model, mode))
            err = self.assertRaises(exception.SimulationError,
                                    fleet.load_fleet, path)
            self.assertIn('host a: mode %s: %s does not support VF count'
                          % (mode, model), str(err))
            self.assertIn('allowed: %s' % allowed, str(err))
        # what the catalog lists is built
        path = self.write('hosts:\n  - {hostname: a, model: MI355X, '
                          'mode: gim-dpx}\n')
        (host,) = fleet.load_fleet(path)
        self.assertEqual(16, host.vf_count)

    def test_every_named_kind_is_catalog_hardware(self):
        from amdgpu_virt.inventory import simulate
        for name, spec in simulate.KINDS.items():
            self.assertTrue(simulate.design_host(spec).gpus, name)
