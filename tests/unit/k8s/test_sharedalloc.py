"""HAMi Allocate decisions: pod lookup, CU occupancy, container env."""

from __future__ import annotations

import datetime
from typing import Any

import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s import devices
from amdgpu_virt.k8s import sharedalloc
from amdgpu_virt.sharing import hami

UNITS = devices.units_from_inventory(simulate.design_host(
    simulate.HostSpec(hostname='n1')))
U0, U1 = UNITS[0], UNITS[1]
NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)


def _pod(name: str, annotations: dict[str, str] | None = None,
         phase: str = 'Pending', ns: str = 'ns') -> dict[str, Any]:
    return {'metadata': {'name': name, 'namespace': ns,
                         'resourceVersion': '7',
                         'annotations': annotations or {}},
            'spec': {'nodeName': 'n1'}, 'status': {'phase': phase}}


def _allocating(name: str, devices_value: str, bind_time: int = 100,
                **extra: str) -> dict[str, Any]:
    annotations = {hami.BIND_PHASE: 'allocating', hami.VGPU_NODE: 'n1',
                   hami.BIND_TIME: str(bind_time),
                   hami.DEVICES_TO_ALLOCATE: devices_value,
                   hami.DEVICES_ALLOCATED: devices_value}
    annotations.update(extra)
    return _pod(name, annotations)


def _env(result: sharedalloc.SharedAllocation) -> dict[str, str]:
    return dict(result.allocation.envs)


class FindPodTest(testtools.TestCase):

    def test_lock_owner_wins(self) -> None:
        older = _allocating('older', 'x,AMD,1,1:;', bind_time=1)
        owner = _allocating('owner', 'x,AMD,1,1:;', bind_time=50)
        lock = '%s,ns,owner' % hami.format_rfc3339(NOW)
        self.assertIs(owner, sharedalloc.find_pod([older, owner], 'n1',
                                                  lock, NOW))

    def test_oldest_bind_time_without_lock(self) -> None:
        a = _allocating('a', 'x,AMD,1,1:;', bind_time=20)
        b = _allocating('b', 'x,AMD,1,1:;', bind_time=10)
        self.assertIs(b, sharedalloc.find_pod([a, b], 'n1', None, NOW))

    def test_expired_or_bad_lock_falls_back(self) -> None:
        a = _allocating('a', 'x,AMD,1,1:;', bind_time=20)
        b = _allocating('b', 'x,AMD,1,1:;', bind_time=10)
        old = '%s,ns,a' % hami.format_rfc3339(
            NOW - datetime.timedelta(minutes=6))
        for lock in (old, 'garbage'):
            self.assertIs(b, sharedalloc.find_pod([a, b], 'n1', lock, NOW))

    def test_other_nodes_phases_and_done_pods_are_skipped(self) -> None:
        other = _allocating('other', 'x,AMD,1,1:;')
        other['metadata']['annotations'][hami.VGPU_NODE] = 'n2'
        done = _allocating('done', 'x,AMD,1,1:;')
        done['metadata']['annotations'][hami.BIND_PHASE] = 'success'
        finished = _allocating('finished', 'x,AMD,1,1:;')
        finished['status']['phase'] = 'Failed'
        self.assertIsNone(sharedalloc.find_pod([other, done, finished],
                                               'n1', None, NOW))


class AllocateTest(testtools.TestCase):

    def test_shared_gpu_gets_mask_limit_and_library(self) -> None:
        pod = _allocating('p', '%s,AMD,49152,76:;' % U0.uuid)
        result = sharedalloc.allocate(pod, UNITS, [pod], ['any-0'], 'req')
        env = _env(result)
        self.assertEqual('GPU-%s' % U0.uuid, env['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0', env['HIP_VISIBLE_DEVICES'])
        self.assertEqual('0:0-75', env['HSA_CU_MASK'])
        self.assertEqual('49152m', env['HIP_DEVICE_MEMORY_LIMIT_0'])
        self.assertEqual(hami.LD_AUDIT_LIBRARY, env['LD_AUDIT'])
        self.assertEqual([(hami.LD_AUDIT_LIBRARY, True)],
                         [(m.host_path, m.read_only)
                          for m in result.allocation.mounts])
        self.assertTrue(result.done)
        self.assertEqual({hami.DEVICES_TO_ALLOCATE: ';',
                          hami.CU_ALLOCATED: '{"%s":"0-75"}' % U0.uuid,
                          hami.BIND_PHASE: 'success'}, result.annotations)

    def test_occupancy_from_other_live_pods(self) -> None:
        neighbour = _pod('n', {hami.CU_ALLOCATED: '{"%s":"0-99"}' % U0.uuid},
                         phase='Running')
        gone = _pod('g', {hami.CU_ALLOCATED: '{"%s":"100-199"}' % U0.uuid},
                    phase='Succeeded')
        pod = _allocating('p', '%s,AMD,0,50:;' % U0.uuid)
        result = sharedalloc.allocate(pod, UNITS, [neighbour, gone, pod],
                                      ['x-0'], 'req')
        mask = _env(result)['HSA_CU_MASK']
        self.assertTrue(mask.startswith('0:'))
        cus = hami.decode_cu_allocated(result.annotations[
            hami.CU_ALLOCATED])[U0.uuid]
        self.assertEqual(50, cus.bit_count())
        self.assertEqual(0, cus & ((1 << 100) - 1), 'overlaps neighbour')
        self.assertNotIn('HIP_DEVICE_MEMORY_LIMIT_0', _env(result))

    def test_whole_gpu_entries_get_no_mask(self) -> None:
        value = '%s,AMD,%d,%d:%s,AMD,0,304:;' % (U0.uuid, U0.vram_mib,
                                                 U0.compute_units, U1.uuid)
        pod = _allocating('p', value)
        result = sharedalloc.allocate(pod, UNITS, [pod], ['a-0', 'b-0'],
                                      'req')
        env = _env(result)
        self.assertEqual('GPU-%s,GPU-%s' % (U0.uuid, U1.uuid),
                         env['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0,1', env['HIP_VISIBLE_DEVICES'])
        for name in ('HSA_CU_MASK', 'LD_AUDIT', 'HIP_DEVICE_MEMORY_LIMIT_0'):
            self.assertNotIn(name, env)
        self.assertEqual((), result.allocation.mounts)
        self.assertNotIn(hami.CU_ALLOCATED, result.annotations)

    def test_containers_one_after_another(self) -> None:
        value = '%s,AMD,0,10:;;%s,AMD,1024,20:;' % (U0.uuid, U0.uuid)
        pod = _allocating('p', value)
        first = sharedalloc.allocate(pod, UNITS, [pod], ['a-0'], 'req')
        self.assertEqual((0, False), (first.container, first.done))
        self.assertNotIn(hami.BIND_PHASE, first.annotations)
        self.assertEqual(';;%s,AMD,1024,20:;' % U0.uuid,
                         first.annotations[hami.DEVICES_TO_ALLOCATE])
        pod['metadata']['annotations'].update(first.annotations)
        second = sharedalloc.allocate(pod, UNITS, [pod], ['a-1'], 'req')
        self.assertEqual((2, True), (second.container, second.done))
        self.assertEqual('0:10-29', _env(second)['HSA_CU_MASK'])
        self.assertEqual({U0.uuid: (1 << 30) - 1}, hami.decode_cu_allocated(
            second.annotations[hami.CU_ALLOCATED]))

    def test_errors_name_the_culprit(self) -> None:
        cases = [
            (_pod('p', {hami.BIND_PHASE: 'allocating'}), ['a-0'],
             hami.DEVICES_TO_ALLOCATE, 'missing'),
            (_allocating('p', ';;'), ['a-0'], hami.DEVICES_TO_ALLOCATE,
             'no container'),
            (_allocating('p', '%s,AMD,0,10:;' % U0.uuid), ['a-0', 'b-0'],
             'kubelet asked for 2', 'container 0 has 1'),
            (_allocating('p', 'feedface,AMD,0,10:;'), ['a-0'], 'feedface',
             'not one of this node'),
            (_allocating('p', 'bad'), ['a-0'], hami.DEVICES_TO_ALLOCATE,
             'bad'),
        ]
        for pod, ids, culprit, reason in cases:
            err = self.assertRaises(exception.AmdgpuVirtError,
                                    sharedalloc.allocate, pod, UNITS, [pod],
                                    ids, 'req')
            self.assertIn(culprit, str(err))
            self.assertIn(reason, str(err))

    def test_overlapping_neighbours_fail_closed(self) -> None:
        a = _pod('a', {hami.CU_ALLOCATED: '{"%s":"0-9"}' % U0.uuid})
        b = _pod('b', {hami.CU_ALLOCATED: '{"%s":"5-20"}' % U0.uuid})
        pod = _allocating('p', '%s,AMD,0,10:;' % U0.uuid)
        err = self.assertRaises(exception.AllocationConflict,
                                sharedalloc.allocate, pod, UNITS,
                                [a, b, pod], ['a-0'], 'req')
        self.assertIn('ns/a', str(err))
        self.assertIn('ns/b', str(err))

    def test_full_gpu_is_insufficient(self) -> None:
        full = _pod('f', {hami.CU_ALLOCATED: '{"%s":"0-300"}' % U0.uuid})
        pod = _allocating('p', '%s,AMD,0,10:;' % U0.uuid)
        self.assertRaises(exception.InsufficientCapacity,
                          sharedalloc.allocate, pod, UNITS, [full, pod],
                          ['a-0'], 'req')
