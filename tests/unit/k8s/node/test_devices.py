"""Device lists, preferred allocations and whole-GPU Allocate (pure)."""

from __future__ import annotations

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt import model
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices


def _units(mode: str = 'spx', **kw: object) -> tuple[devices.GpuUnit, ...]:
    return devices.units_from_inventory(simulate.design_host(
        simulate.HostSpec(hostname='n1', mode=mode)), **kw)  # type: ignore


class UnitsTest(testtools.TestCase):

    def test_spx_host_has_one_unit_per_gpu(self) -> None:
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1'))
        units = devices.units_from_inventory(inventory)
        self.assertEqual(8, len(units))
        gpu = inventory.gpus[0]
        self.assertEqual((gpu.unique_id, gpu.id, 1, 128, 0),
                         (units[0].uuid, units[0].gpu_address,
                          units[0].card_minor, units[0].render_minor,
                          units[0].numa_node))
        self.assertEqual('GPU-%s' % gpu.unique_id, units[0].rocr_id)
        self.assertEqual(list(range(8)), [u.index for u in units])

    def test_cpx_partitions_are_units(self) -> None:
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1',
                                                           mode='cpx'))
        units = devices.units_from_inventory(inventory)
        self.assertGreater(len(units), 8)
        self.assertEqual(inventory.partition_count, len(units))
        self.assertEqual(len(units), len({u.uuid for u in units}))

    def test_vf_and_vfio_gpus_are_not_offered(self) -> None:
        inventory = simulate.design_host(simulate.HostSpec(
            hostname='n1', gpus=3, gpu_modes=('spx', 'vfio', 'spx')))
        units = devices.units_from_inventory(inventory)
        self.assertEqual([str(simulate.pf_address(0)),
                          str(simulate.pf_address(2))],
                         [u.gpu_address for u in units])

    def test_gpu_filter(self) -> None:
        wanted = str(simulate.pf_address(5))
        units = _units(gpus=[wanted])
        self.assertEqual([wanted], [u.gpu_address for u in units])
        self.assertRaises(exception.InvalidPciAddress, _units,
                          gpus=['nonsense'])

    def test_partition_without_minor_is_skipped(self) -> None:
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1',
                                                           gpus=1))
        gpu = inventory.gpus[0]
        broken = model.replace(gpu, partitions=(model.replace(
            gpu.partitions[0], render_minor=None),))
        inventory = model.replace(inventory, gpus=(broken,))
        self.assertEqual((), devices.units_from_inventory(inventory))

    def test_list_devices(self) -> None:
        units = _units()
        listed = devices.list_devices(units, 3, {units[1].uuid: False})
        self.assertEqual(24, len(listed))
        self.assertEqual(['%s-%d' % (units[0].uuid, n) for n in range(3)],
                         [d.id for d in listed[:3]])
        self.assertEqual({'Unhealthy'}, {d.health for d in listed[3:6]})
        self.assertEqual({'Healthy'}, {d.health for d in listed[6:]})
        self.assertTrue(all(len(d.id) <= 63 for d in listed))


class DeviceIndexTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.units = _units()
        self.index = devices.DeviceIndex(self.units, 4, 'amd.com/gpu')
        self.all_ids = [d.id for d in devices.list_devices(self.units, 4,
                                                           {})]

    def test_resolve_rejects_unknown_ids(self) -> None:
        for bad in ('x', 'feedfacefeedface-0', '%s-4' % self.units[0].uuid,
                    '%s-' % self.units[0].uuid, '%s-a' % self.units[0].uuid):
            err = self.assertRaises(exception.UnknownDevice,
                                    self.index.resolve, bad, 'req[0]')
            self.assertIn(repr(bad), str(err))
            self.assertIn('req[0]', str(err))

    def test_preferred_spreads_over_untouched_gpus(self) -> None:
        # GPU 0 already has a slot taken: it is not untouched any more
        available = self.all_ids[1:]
        chosen = self.index.preferred(available, [], 3)
        self.assertEqual([self.units[1].device_id(0),
                          self.units[2].device_id(0),
                          self.units[3].device_id(0)], chosen)

    def test_preferred_keeps_must_include_and_its_numa_node(self) -> None:
        must = [self.units[6].device_id(2)]
        chosen = self.index.preferred(self.all_ids, must, 2)
        self.assertEqual(must[0], chosen[0])
        self.assertEqual(1, self.units[4].numa_node)
        self.assertEqual(self.units[4].device_id(0), chosen[1])

    def test_preferred_ignores_unknown_and_stops_when_short(self) -> None:
        chosen = self.index.preferred(['bogus-1', self.all_ids[0]], [], 3)
        self.assertEqual([self.all_ids[0]], chosen)

    @given(st.lists(st.integers(0, 31), unique=True, min_size=1),
           st.integers(1, 8))
    def test_preferred_is_a_valid_choice(self, picks: list[int],
                                         size: int) -> None:
        available = [self.all_ids[n] for n in picks]
        chosen = self.index.preferred(available, [], size)
        self.assertEqual(min(size, len(available)), len(chosen))
        self.assertEqual(len(chosen), len(set(chosen)))
        self.assertTrue(set(chosen) <= set(available))
        gpus = {self.index.resolve(d, 't')[0].uuid for d in chosen}
        distinct = len({self.index.resolve(d, 't')[0].uuid
                        for d in available})
        self.assertEqual(min(len(chosen), distinct), len(gpus))

    def test_whole_gpus(self) -> None:
        ids = [self.units[3].device_id(1), self.units[0].device_id(0)]
        allocation = self.index.whole_gpus(ids, 'container_requests[0]')
        envs = dict(allocation.envs)
        self.assertEqual('GPU-%s,GPU-%s' % (self.units[3].uuid,
                                            self.units[0].uuid),
                         envs['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0,1', envs['HIP_VISIBLE_DEVICES'])
        self.assertEqual(
            ['/dev/kfd', self.units[3].card_path, self.units[3].render_path,
             self.units[0].card_path, self.units[0].render_path],
            [d.host_path for d in allocation.devices])
        self.assertEqual([d.host_path for d in allocation.devices],
                         [d.container_path for d in allocation.devices])

    def test_whole_gpus_refuses_two_slots_of_one_gpu(self) -> None:
        ids = [self.units[2].device_id(0), self.units[2].device_id(1)]
        err = self.assertRaises(exception.DevicePluginError,
                                self.index.whole_gpus, ids, 'req[1]')
        self.assertIn(self.units[2].rocr_id, str(err))
        self.assertIn('req[1]', str(err))
