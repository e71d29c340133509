"""The sysfs driver against simulated trees written by simulate.write_tree."""

from __future__ import annotations

import os
import shutil

import hypothesis
from hypothesis import strategies as st
import testtools

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.inventory import simtree
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import sysfs
from amdgpu_virt.model import Driver
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import replace
from tests.unit.inventory import fixtures as inv_fixtures

GIB_MIB = 1024


class TestRoundTripEveryKind(testtools.TestCase):
    """scan(write_tree(design_host(spec))).gpus == design_host(spec).gpus"""

    def test_every_kind(self):
        for kind in simulate.KINDS:
            spec = inv_fixtures.spec_for_test(kind)
            host = self.useFixture(inv_fixtures.SimulatedHost(spec))
            found = host.scan(spec.hostname)
            self.assertEqual(host.expected.gpus, found.gpus, kind)
            self.assertEqual(host.expected.gim_version, found.gim_version,
                             kind)
            self.assertEqual(spec.hostname, found.hostname)
            self.assertEqual('sysfs:%s' % host.root, found.source)

    def test_every_kind_with_legacy_xcp_names(self):
        for kind in ('mi300x-cpx', 'mi300x-mixed', 'mi300a-tpx'):
            spec = inv_fixtures.spec_for_test(kind)
            host = self.useFixture(inv_fixtures.SimulatedHost(
                spec, legacy_xcp_names=True))
            self.assertTrue(os.path.isdir(os.path.join(
                host.root, 'devices/platform/amdgpu_xcp.0')))
            self.assertFalse(os.path.exists(os.path.join(
                host.root, 'devices/platform/amdgpu_xcp_0')))
            self.assertEqual(host.expected.gpus, host.scan().gpus, kind)


class TestKeyHosts(testtools.TestCase):

    def test_gim_cpx_gives_64_vfs_on_vfio_with_own_groups(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi300x-gim-cpx']))
        found = host.scan()
        self.assertEqual(8, len(found.gpus))
        self.assertEqual(64, found.vf_count)
        vfs = [vf for gpu in found.gpus for vf in gpu.vfs]
        self.assertEqual({Driver.VFIO_PCI}, {vf.driver for vf in vfs})
        self.assertEqual(64, len({vf.iommu_group for vf in vfs}))
        self.assertEqual({0x74b5}, {vf.device_id for vf in vfs})
        for gpu in found.gpus:
            self.assertIs(Driver.GIM, gpu.driver)
            self.assertEqual(8, gpu.sriov_numvfs)
            self.assertEqual(list(range(8)), [vf.index for vf in gpu.vfs])
            self.assertEqual((), gpu.partitions)
            self.assertIsNone(gpu.compute_partition)
        self.assertEqual('8.1.0.K', found.gim_version)
        self.assertEqual((), found.warnings)

    def test_cpx_bare_metal_has_63_partitions_and_one_warning(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi300x-cpx']))
        found = host.scan()
        self.assertEqual(63, found.partition_count)
        parts = [p for gpu in found.gpus for p in gpu.partitions]
        self.assertEqual({38}, {p.compute_units for p in parts})
        self.assertEqual({24 * GIB_MIB - 2}, {p.vram_mib for p in parts})
        self.assertEqual(7, len(found.gpus[-1].partitions))
        self.assertEqual(304, found.gpus[-1].compute_units)
        self.assertEqual(1, len(found.warnings))
        warning = found.warnings[0]
        self.assertEqual(os.path.join(
            host.root, 'bus/pci/devices/0000:e5:00.0/'
            'current_compute_partition'), warning.culprit)
        self.assertIn('CPX implies 8 partitions but KFD shows 7',
                      warning.message)

    def test_spx_has_one_partition_of_304_cus(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi300x-spx']))
        found = host.scan()
        for k, gpu in enumerate(found.gpus):
            self.assertEqual(1, len(gpu.partitions))
            part = gpu.partitions[0]
            self.assertEqual(304, part.compute_units)
            self.assertEqual(206141652992, gpu.vram_mib * 1024 * 1024)
            self.assertEqual(128 + 8 * k, part.render_minor)
            self.assertEqual(1 + 8 * k, part.card_minor)
            self.assertEqual('SPX', gpu.compute_partition)
            self.assertEqual(('SPX', 'DPX', 'QPX', 'CPX'),
                             gpu.available_compute_partitions)
            self.assertEqual(('NPS1', 'NPS2', 'NPS4'),
                             gpu.available_memory_partitions)
        self.assertEqual((), found.warnings)

    def test_real_node_values_of_an_mi300x_spx(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec('h', gpus=3)))
        path = os.path.join(host.root, sysfs.KFD_NODES, '4', 'properties')
        with open(path) as handle:
            props = dict(line.split() for line in handle)
        self.assertEqual(list(simtree.KFD_NODE_KEYS), list(props))
        self.assertEqual({'simd_count': '1216', 'array_count': '32',
                          'simd_arrays_per_engine': '1',
                          'cu_per_simd_array': '10', 'simd_per_cu': '4',
                          'gfx_target_version': '90402',
                          'vendor_id': '4098', 'device_id': '29857',
                          'location_id': '17664', 'drm_render_minor': '144',
                          'num_xcc': '8', 'wave_front_size': '64',
                          'lds_size_in_kb': '64', 'local_mem_size': '0'},
                         {k: props[k] for k in (
                             'simd_count', 'array_count',
                             'simd_arrays_per_engine', 'cu_per_simd_array',
                             'simd_per_cu', 'gfx_target_version',
                             'vendor_id', 'device_id', 'location_id',
                             'drm_render_minor', 'num_xcc',
                             'wave_front_size', 'lds_size_in_kb',
                             'local_mem_size')})

    def test_gim_gpus_do_not_shift_minors_of_amdgpu_gpus(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.KINDS['mi300x-mixed']))
        found = host.scan()
        first_amdgpu = next(g for g in found.gpus
                            if g.driver is Driver.AMDGPU)
        self.assertEqual(128, first_amdgpu.partitions[0].render_minor)
        self.assertEqual(1, first_amdgpu.partitions[0].card_minor)
        self.assertEqual((), found.warnings)

    def test_onboard_vga_holds_card0_and_is_skipped(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec('h', gpus=1)))
        card0 = os.path.realpath(os.path.join(host.root, 'class/drm/card0'))
        self.assertIn('0000:c2:00.0', card0)
        found = host.scan()
        self.assertEqual([PciAddress.parse('0000:05:00.0')],
                         [gpu.address for gpu in found.gpus])

    def test_bus_devices_are_links_into_devices(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec('h', gpus=1, mode='gim-dpx',
                              off_catalog=True)))
        link = os.path.join(host.root, 'bus/pci/devices/0000:05:02.1')
        self.assertTrue(os.path.islink(link))
        self.assertEqual('../../../devices/pci0000:00/0000:00:01.1/'
                         '0000:04:00.0/0000:05:02.1', os.readlink(link))
        self.assertEqual('../0000:05:00.0',
                         os.readlink(os.path.join(link, 'physfn')))
        with open(os.path.join(host.root, 'bus/pci/devices/0000:05:00.0/'
                               'sriov_vf_device')) as handle:
            self.assertEqual('74b5\n', handle.read())

    def test_second_write_changes_nothing(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec('h', gpus=2, mode='cpx')))
        before = _snapshot_mtimes(host.root)
        simulate.write_tree(host.expected, host.root)
        self.assertEqual(before, _snapshot_mtimes(host.root))


def _snapshot_mtimes(root):
    result = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            result[path] = os.stat(path).st_mtime_ns
    return result


class TestTolerance(testtools.TestCase):
    """Odd trees: the GPU is still reported, a warning names the file."""

    def setUp(self):
        super().setUp()
        self.host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec('h', gpus=2, gpu_modes=('cpx', 'gim-dpx'),
                              off_catalog=True)))
        self.root = self.host.root
        self.pf0 = os.path.join(self.root, 'bus/pci/devices/0000:05:00.0')
        self.pf1 = os.path.join(self.root, 'bus/pci/devices/0000:25:00.0')

    def write(self, path, text):
        with open(path, 'w') as handle:
            handle.write(text)

    def culprits(self, found):
        return {w.culprit: w.message for w in found.warnings}

    def test_garbage_values(self):
        for name, value in (('numa_node', 'abc\n'), ('numa_node', ''),
                            ('numa_node', '99999999999999999999999'),
                            ('subsystem_device', '-1'),
                            ('mem_info_vram_total', '-5'),
                            ('current_compute_partition', 'XPX'),
                            ('available_compute_partition', 'SPX, FOO'),
                            ('unique_id', 'zz'),
                            ('product_name', 'bad\x01name'),
                            ('sriov_totalvfs', '1' * 5000)):
            path = os.path.join(self.pf0, name)
            self.write(path, value)
            found = self.host.scan()
            self.assertEqual(2, len(found.gpus), name)
            self.assertIn(path, self.culprits(found), name)
            self.assertIn('bad value', self.culprits(found)[path])
            simulate.write_tree(self.host.expected, self.root)  # restore
        self.assertEqual(self.host.expected.gpus, self.host.scan().gpus)

    def test_bad_numa_gives_none_but_keeps_the_rest(self):
        self.write(os.path.join(self.pf0, 'numa_node'), 'abc')
        gpu = self.host.scan().gpus[0]
        self.assertIsNone(gpu.numa_node)
        self.assertEqual(8, len(gpu.partitions))

    def test_negative_numa_is_unknown_without_warning(self):
        self.write(os.path.join(self.pf0, 'numa_node'), '-1\n')
        found = self.host.scan()
        self.assertIsNone(found.gpus[0].numa_node)
        self.assertEqual((), found.warnings)

    def test_unreadable_file(self):
        path = os.path.join(self.pf0, 'mem_info_vram_total')
        os.unlink(path)
        os.mkdir(path)  # reading a directory fails like an unreadable file
        found = self.host.scan()
        self.assertIn('unreadable', self.culprits(found)[path])
        # VRAM falls back to the sum of the partitions
        self.assertEqual(8 * found.gpus[0].partitions[0].vram_mib,
                         found.gpus[0].vram_mib)

    def test_dangling_iommu_group_link_is_still_a_number(self):
        link = os.path.join(self.pf0, 'iommu_group')
        target = os.path.realpath(link)
        shutil.rmtree(target)
        self.assertEqual(20, self.host.scan().gpus[0].iommu_group)

    def test_garbage_iommu_group_link(self):
        link = os.path.join(self.pf0, 'iommu_group')
        os.unlink(link)
        os.symlink('../../kernel/iommu_groups/abc', link)
        found = self.host.scan()
        self.assertIsNone(found.gpus[0].iommu_group)
        self.assertIn(link, self.culprits(found))

    def test_dangling_device_link(self):
        link = os.path.join(self.root, 'bus/pci/devices/0000:99:00.0')
        os.symlink('../../../devices/pci0000:80/0000:99:00.0', link)
        found = self.host.scan()
        self.assertIn('dangling link', self.culprits(found)[link])
        self.assertEqual(2, len(found.gpus))

    def test_kfd_node_without_pci_device(self):
        props = os.path.join(self.root, sysfs.KFD_NODES, '2', 'properties')
        with open(props) as handle:
            text = handle.read()
        self.write(props, text.replace('location_id 1280',
                                       'location_id %d' % (0x99 << 8)))
        found = self.host.scan()
        self.assertIn('matches no AMD GPU', self.culprits(found)[props])
        gpu = found.gpus[0]
        self.assertEqual(7, len(gpu.partitions))
        self.assertNotIn(0, [p.index for p in gpu.partitions])

    def test_kfd_partition_beyond_the_mode(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            simulate.HostSpec('h', gpus=1, mode='dpx')))
        props = os.path.join(host.root, sysfs.KFD_NODES, '3', 'properties')
        with open(props) as handle:
            text = handle.read()
        self.write(props, text.replace('location_id 1281',
                                       'location_id 1285'))
        found = host.scan()
        self.assertEqual([0, 5], [p.index for p in found.gpus[0].partitions])
        self.assertIn('DPX implies 2 partitions but KFD shows partition(s) '
                      '5 too', found.warnings[0].message)

    def test_two_nodes_claim_one_partition(self):
        props = os.path.join(self.root, sysfs.KFD_NODES, '3', 'properties')
        with open(props) as handle:
            text = handle.read()
        self.write(props, text.replace('location_id 1281',
                                       'location_id 1280'))
        found = self.host.scan()
        self.assertEqual(7, len(found.gpus[0].partitions))
        self.assertIn('already seen at KFD node 2',
                      self.culprits(found)[props])

    def test_kfd_garbage_lines_and_simd_per_cu(self):
        props = os.path.join(self.root, sysfs.KFD_NODES, '3', 'properties')
        with open(props) as handle:
            text = handle.read()
        text = text.replace('simd_per_cu 4', 'simd_per_cu 0')
        self.write(props, text + 'garbage line here\nnum_gws abc\n')
        found = self.host.scan()
        self.assertIn('malformed', found.warnings[0].message)
        self.assertIn('simd_per_cu', found.warnings[1].message)
        self.assertEqual(38, found.gpus[0].partitions[1].compute_units)

    def test_kfd_missing_mem_bank_uses_zero_with_warning(self):
        shutil.rmtree(os.path.join(self.root, sysfs.KFD_NODES, '2',
                                   'mem_banks'))
        found = self.host.scan()
        self.assertEqual(0, found.gpus[0].partitions[0].vram_mib)
        self.assertIn('VRAM size unknown', found.warnings[0].message)

    def test_kfd_properties_not_text(self):
        props = os.path.join(self.root, sysfs.KFD_NODES, '2', 'properties')
        with open(props, 'wb') as handle:
            handle.write(b'\xff\xfe\x00')
        found = self.host.scan()
        self.assertIn(props, self.culprits(found))
        self.assertEqual(7, len(found.gpus[0].partitions))

    def test_no_kfd_at_all(self):
        os.unlink(os.path.join(self.root, 'class/kfd/kfd'))
        found = self.host.scan()
        self.assertEqual((), found.gpus[0].partitions)
        self.assertIsNone(found.gpus[0].compute_units)
        self.assertEqual('CPX', found.gpus[0].compute_partition)
        self.assertIn('missing although', found.warnings[0].message)

    def test_unknown_device_id(self):
        gpu = self.host.expected.gpus[0]
        unknown = replace(
            gpu, device_id=0x74ff, compute_partition='QPX',
            model=catalog.unknown_model(0x74ff, gpu.product_name,
                                        gpu.compute_units, gpu.vram_mib),
            partitions=tuple(replace(p, compute_units=76)
                             for p in gpu.partitions[:4]))
        host = self.useFixture(inv_fixtures.SimulatedHost(
            inventory=HostInventory(hostname='h', gpus=(unknown,))))
        found = host.scan()
        self.assertEqual(unknown, found.gpus[0])
        self.assertFalse(found.gpus[0].model.known)
        self.assertEqual('unknown-74ff', found.gpus[0].model.name)
        device = os.path.join(host.root,
                              'bus/pci/devices/0000:05:00.0/device')
        self.assertIn('0x74ff is not in the catalog',
                      self.culprits(found)[device])

    def test_vf_whose_pf_is_absent(self):
        os.unlink(os.path.join(self.root, 'bus/pci/devices/0000:25:00.0'))
        found = self.host.scan()
        addresses = [str(gpu.address) for gpu in found.gpus]
        self.assertEqual(['0000:05:00.0', '0000:25:02.0', '0000:25:02.1'],
                         addresses)
        vf_gpu = found.gpus[1]
        self.assertEqual(0x74b5, vf_gpu.device_id)
        self.assertEqual('MI300X', vf_gpu.model.name)
        self.assertIs(Driver.VFIO_PCI, vf_gpu.driver)
        vf_path = os.path.join(self.root, 'bus/pci/devices/0000:25:02.0')
        self.assertIn('physfn link points to', self.culprits(found)[vf_path])
        self.assertIn('absent', self.culprits(found)[vf_path])

    def test_vf_in_a_guest_without_physfn(self):
        vf = os.path.join(self.root, 'bus/pci/devices/0000:25:02.1')
        os.unlink(os.path.join(vf, 'physfn'))
        os.unlink(os.path.join(self.pf1, 'virtfn1'))
        found = self.host.scan()
        self.assertEqual(1, len(found.gpus[1].vfs))
        self.assertEqual('0000:25:02.1', str(found.gpus[2].address))
        self.assertIn('without a physfn link', self.culprits(found)[vf])

    def test_vf_not_listed_by_its_pf_gets_index_from_offset(self):
        os.unlink(os.path.join(self.pf1, 'virtfn1'))
        found = self.host.scan()
        self.assertEqual(self.host.expected.gpus[1].vfs, found.gpus[1].vfs)
        vf = os.path.join(self.root, 'bus/pci/devices/0000:25:02.1')
        self.assertIn('not listed as a virtfn', self.culprits(found)[vf])

    def test_virtfn_pointing_nowhere(self):
        os.symlink('../0000:25:03.0', os.path.join(self.pf1, 'virtfn5'))
        found = self.host.scan()
        self.assertEqual(2, len(found.gpus[1].vfs))
        self.assertIn(os.path.join(self.pf1, 'virtfn5'),
                      self.culprits(found))

    def test_missing_class_of_known_device_is_kept(self):
        os.unlink(os.path.join(self.pf0, 'class'))
        found = self.host.scan()
        self.assertIsNone(found.gpus[0].pci_class)
        self.assertEqual(2, len(found.gpus))

    def test_non_gpu_amd_function_is_skipped(self):
        self.write(os.path.join(self.pf0, 'class'), '0x040300\n')
        found = self.host.scan()
        self.assertEqual(['0000:25:00.0'],
                         [str(gpu.address) for gpu in found.gpus])

    def test_gim_version_missing(self):
        os.unlink(os.path.join(self.root, 'module/gim/version'))
        found = self.host.scan()
        self.assertIsNone(found.gim_version)
        self.assertIn('missing although', found.warnings[0].message)

    def test_nothing_readable(self):
        shutil.rmtree(os.path.join(self.root, 'bus'))
        err = self.assertRaises(exception.NothingReadable, self.host.scan)
        self.assertIn('bus/pci/devices', str(err))

    def test_no_amd_gpu(self):
        for name in ('0000:05:00.0', '0000:25:00.0', '0000:25:02.0',
                     '0000:25:02.1'):
            os.unlink(os.path.join(self.root, 'bus/pci/devices', name))
        err = self.assertRaises(exception.NothingReadable, self.host.scan)
        self.assertIn('no AMD GPU', str(err))

    def test_root_from_config(self):
        conf = inv_fixtures.test_conf()
        conf.set_override('sysfs_root', self.root, group='inventory')
        conf.set_override('hostname', 'from-conf', group='inventory')
        self.addCleanup(conf.clear_override, 'sysfs_root', group='inventory')
        self.addCleanup(conf.clear_override, 'hostname', group='inventory')
        found = sysfs.SysfsInventory(conf).scan()
        self.assertEqual('from-conf', found.hostname)
        self.assertEqual(2, len(found.gpus))


class TestCorruptedTrees(testtools.TestCase):
    """Any one file overwritten with anything: a result, never a crash."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.host = inv_fixtures.SimulatedHost(simulate.HostSpec(
            'h', gpus=3, gpu_modes=('cpx', 'gim-dpx', 'vfio'),
            off_catalog=True))
        cls.host.setUp()
        cls.files = sorted(
            os.path.join(dirpath, name)
            for dirpath, _dirs, names in os.walk(cls.host.root)
            for name in names)

    @classmethod
    def tearDownClass(cls):
        cls.host.cleanUp()
        super().tearDownClass()

    @hypothesis.settings(max_examples=100)
    @hypothesis.given(st.data(), st.one_of(
        st.binary(max_size=64), st.sampled_from(
            [b'', b'abc', b'-1', b'0x', b'99999999999999999999999999',
             b'0x1002', b'simd_count 4\nlocation_id 99999999',
             b'\xff\xfe'])))
    def test_one_corrupted_file(self, data, content):
        path = data.draw(st.sampled_from(self.files))
        with open(path, 'rb') as handle:
            original = handle.read()
        try:
            with open(path, 'wb') as handle:
                handle.write(content)
            try:
                found = self.host.scan()
            except exception.NothingReadable:
                return
            self.assertLessEqual(len(found.gpus), 4)
            for warning in found.warnings:
                self.assertTrue(warning.culprit.startswith(self.host.root))
        finally:
            with open(path, 'wb') as handle:
                handle.write(original)


class TestTreesWithSomethingMissing(testtools.TestCase):
    """Any one file or link removed or pointed elsewhere: still a result."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.host = inv_fixtures.SimulatedHost(simulate.HostSpec(
            'h', gpus=3, gpu_modes=('qpx', 'gim-dpx', 'vfio'),
            off_catalog=True))
        cls.host.setUp()
        cls.entries = []
        for dirpath, dirs, names in os.walk(cls.host.root):
            for name in dirs + names:
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or name in names:
                    cls.entries.append(path)
        cls.entries.sort()

    @classmethod
    def tearDownClass(cls):
        cls.host.cleanUp()
        super().tearDownClass()

    @hypothesis.settings(max_examples=100)
    @hypothesis.given(st.data(), st.sampled_from(
        ['remove', 'dangle', 'loop', 'to-file']))
    def test_one_entry_broken(self, data, how):
        path = data.draw(st.sampled_from(self.entries))
        if os.path.islink(path):
            saved = ('link', os.readlink(path))
        else:
            with open(path, 'rb') as handle:
                saved = ('file', handle.read())
        os.unlink(path)
        try:
            if how == 'dangle':
                os.symlink('../nowhere/0000:ff:1f.7', path)
            elif how == 'loop':
                os.symlink(os.path.basename(path), path)
            elif how == 'to-file':
                os.symlink('/dev/null', path)
            try:
                found = self.host.scan()
            except exception.NothingReadable:
                return
            self.assertLessEqual(len(found.gpus), 5)
        finally:
            if os.path.lexists(path):
                os.unlink(path)
            if saved[0] == 'link':
                os.symlink(saved[1], path)
            else:
                with open(path, 'wb') as handle:
                    handle.write(saved[1])
