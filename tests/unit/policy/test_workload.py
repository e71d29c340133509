"""Workload specs: parsing, units, and validation naming every problem."""

from __future__ import annotations

import os
import tempfile

import testtools

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.policy import workload as wl
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Sensitivity
from amdgpu_virt.policy.workload import Tenancy

MI300X = catalog.by_name('MI300X')


class TestSizes(testtools.TestCase):

    def test_memory_units(self):
        self.assertEqual(24 * 1024, wl.parse_memory('24GiB'))
        self.assertEqual(4096, wl.parse_memory('4096MiB'))
        self.assertEqual(4096, wl.parse_memory(4096))
        # 30 GB = 30e9 bytes = 28610.2 MiB
        self.assertEqual(28610, wl.parse_memory('30 GB'))
        self.assertEqual(1024 * 1024, wl.parse_memory('1TiB'))
        self.assertIsNone(wl.parse_memory('whole'))
        self.assertIsNone(wl.parse_memory('WHOLE'))

    def test_memory_errors(self):
        for bad in ('24 parsecs', 'lots', '', True, 1.5, '-3GiB'):
            self.assertRaises(ValueError, wl.parse_memory, bad)

    def test_compute(self):
        self.assertEqual((76, None), wl.parse_compute(76))
        self.assertEqual((None, 25), wl.parse_compute('25%'))
        self.assertEqual((None, 12), wl.parse_compute('12 %'))
        # whole percentages only, as amd.com/gpucores (no rounding)
        for bad in ('12.5 %', '0%', '101%'):
            self.assertRaises(ValueError, wl.parse_compute, bad)
        self.assertEqual((None, None), wl.parse_compute('whole'))
        self.assertEqual((38, None), wl.parse_compute('38'))
        self.assertRaises(ValueError, wl.parse_compute, 'half')
        self.assertRaises(ValueError, wl.parse_compute, False)

    def test_percent_follows_hami(self):
        # floor(pct * 304 / 100), clamped to [1, 304]
        for pct, cus in ((1, 3), (25, 76), (33, 100), (50, 152), (67, 203),
                         (100, 304)):
            w = wl.Workload('w', percent=pct)
            self.assertEqual(cus, w.cus_on(MI300X), pct)
        self.assertRaises(exception.WorkloadSpecError, wl.Workload, 'w',
                          percent=0.5)

    def test_whole(self):
        w = wl.Workload('w')
        self.assertTrue(w.whole)
        self.assertEqual(304, w.cus_on(MI300X))
        self.assertEqual(192 * 1024, w.memory_on(MI300X))
        self.assertEqual(1.0, w.fraction_on(MI300X))

    def test_fraction_is_the_larger_share(self):
        w = wl.Workload('w', cus=38, memory_mib=96 * 1024)
        self.assertEqual(0.5, w.fraction_on(MI300X))


class TestFromDict(testtools.TestCase):

    def test_full_spec(self):
        w = wl.from_dict({
            'name': 'train', 'platform': 'vm', 'tenancy': 'trusted',
            'gpus': 4, 'memory': '24GiB', 'compute': '25%', 'p2p': True,
            'sensitivity': 'high', 'model': 'mi300x', 'numa_node': 1,
            'same_numa': True, 'priority': 7})
        self.assertEqual(Platform.VM, w.platform)
        self.assertEqual(Tenancy.TRUSTED, w.tenancy)
        self.assertEqual(4, w.gpus)
        self.assertEqual(24576, w.memory_mib)
        self.assertEqual(25.0, w.percent)
        self.assertTrue(w.p2p)
        self.assertEqual(Sensitivity.HIGH, w.sensitivity)
        self.assertEqual(('MI300X',), w.models)
        self.assertEqual(1, w.numa_node)
        self.assertEqual(7, w.priority)

    def test_defaults(self):
        w = wl.from_dict({'name': 'x'})
        self.assertEqual(Platform.ANY, w.platform)
        self.assertEqual(Tenancy.ISOLATED, w.tenancy)
        self.assertEqual(1, w.gpus)
        self.assertTrue(w.whole)

    def test_every_problem_is_reported(self):
        err = self.assertRaises(exception.WorkloadSpecError, wl.from_dict, {
            'name': 'bad', 'platform': 'baremetal', 'tenancy': 'friendly',
            'gpus': 0, 'memory': '24 parsecs', 'compute': '150%',
            'p2p': 'yes', 'sensitivity': 'extreme', 'model': 'MI999',
            'colour': 'red'})
        self.assertEqual('bad', err.kwargs['workload'])
        fields = [p.split(':')[0] for p in err.problems]
        self.assertEqual(sorted(['colour', 'platform', 'tenancy',
                                 'sensitivity', 'p2p', 'memory', 'model',
                                 'gpus', 'compute']), sorted(fields))
        text = str(err)
        self.assertIn('allowed: vm, pod, any', text)
        self.assertIn('allowed: isolated, trusted', text)
        self.assertIn('allowed: low, medium, high', text)
        self.assertIn("unit 'parsecs'", text)
        self.assertIn('150%', text)
        self.assertIn('allowed: 1..64', text)
        self.assertIn("'MI999' is not a known model", text)

    def test_negative_and_absurd_sizes(self):
        err = self.assertRaises(exception.WorkloadSpecError, wl.from_dict, {
            'name': 'huge', 'gpus': -1, 'memory': '2TiB', 'compute': 5000,
            'priority': 10 ** 9})
        self.assertEqual(4, len(err.problems), err.problems)
        self.assertIn('gpus', err.problems[0])

    def test_name_required(self):
        err = self.assertRaises(exception.WorkloadSpecError, wl.from_dict,
                                {'gpus': 1}, 'f.yaml: workloads[2]')
        self.assertIn('f.yaml: workloads[2]', str(err))
        self.assertIn('name: is required', str(err))

    def test_not_a_mapping(self):
        self.assertRaises(exception.WorkloadSpecError, wl.from_dict, [1])

    def test_python_construction_validates(self):
        err = self.assertRaises(exception.WorkloadSpecError, wl.Workload,
                                'x', gpus=0, percent=0.0)
        self.assertEqual(2, len(err.problems))

    def test_round_trip(self):
        w = wl.from_dict({'name': 'n', 'memory': '8GiB', 'compute': '10%',
                          'model': 'MI210', 'numa_node': 0})
        self.assertEqual(w, wl.from_dict(w.to_dict()))


class TestListFile(testtools.TestCase):

    def _write(self, text):
        fd, path = tempfile.mkstemp(suffix='.yaml')
        os.close(fd)
        self.addCleanup(os.unlink, path)
        with open(path, 'w') as handle:
            handle.write(text)
        return path

    def test_load(self):
        path = self._write('workloads:\n  - {name: a}\n  - {name: b, '
                           'platform: pod}\n')
        self.assertEqual(['a', 'b'],
                         [w.name for w in wl.load_workloads(path)])

    def test_duplicate_names(self):
        path = self._write('workloads:\n  - {name: a}\n  - {name: a}\n')
        err = self.assertRaises(exception.WorkloadSpecError,
                                wl.load_workloads, path)
        self.assertIn('workloads[1]', str(err))
        self.assertIn('unique', str(err))

    def test_bad_entry_names_file_and_index(self):
        path = self._write('workloads:\n  - {name: a}\n  - {name: b, '
                           'gpus: 0}\n')
        err = self.assertRaises(exception.WorkloadSpecError,
                                wl.load_workloads, path)
        self.assertIn(path, str(err))
        self.assertIn('workloads[1]', str(err))
        self.assertIn('gpus', str(err))

    def test_wrong_shape(self):
        path = self._write('- {name: a}\n')
        err = self.assertRaises(exception.WorkloadSpecError,
                                wl.load_workloads, path)
        self.assertIn('"workloads" list', str(err))
        path = self._write('workloads: []\nextra: 1\n')
        err = self.assertRaises(exception.WorkloadSpecError,
                                wl.load_workloads, path)
        self.assertIn('extra', str(err))

    def test_sample_is_valid(self):
        from amdgpu_virt import data
        workloads = wl.load_workloads(data.path('sample_workloads.yaml'))
        self.assertGreater(len(workloads), 10)
