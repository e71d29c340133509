"""Allocate decisions from the allocation record: pod, container, env."""

from __future__ import annotations

import datetime
from typing import Any

import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import hami

UNITS = devices.units_from_inventory(simulate.design_host(
    simulate.HostSpec(hostname='n1')))
U0, U1 = UNITS[0], UNITS[1]
CAP = sharedalloc.capacity(UNITS, 10)
NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)


def _dev(unit: devices.GpuUnit, mib: int, cus: int) -> hami.ContainerDevice:
    return hami.ContainerDevice(unit.uuid, 'AMD', mib, cus)


def _record(*pods: tuple[str, int, hami.PodDevices]) -> allocrecord.Record:
    record = allocrecord.Record('n1')
    for name, when, containers in pods:
        record = allocrecord.book(record, 'uid-' + name, 'ns', name, when,
                                  containers, CAP)
    return record


def _pod(name: str, node: str = 'n1', phase: str = 'Running',
         uid: str | None = None) -> dict[str, Any]:
    return {'metadata': {'name': name, 'namespace': 'ns',
                         'uid': uid or 'uid-' + name},
            'spec': {'nodeName': node}, 'status': {'phase': phase}}


def _lock(name: str, when: datetime.datetime = NOW) -> str:
    return '%s,ns,%s' % (hami.format_rfc3339(when), name)


class ChooseTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.record = _record(('a', 20, ((_dev(U0, 1024, 10),),)),
                              ('b', 10, ((_dev(U0, 1024, 10),),)))
        self.live = sharedalloc.live_pods(self.record, [_pod('a'),
                                                        _pod('b')])

    def _choose(self, lock: str | None,
                served: sharedalloc.Served | None = None, count: int = 1,
                uid: str | None = None
                ) -> tuple[allocrecord.PodGrants, int]:
        return sharedalloc.choose(self.record, self.live,
                                  served or sharedalloc.Served(), lock,
                                  count, 'req', NOW, lock_uid=uid)

    def test_lock_owner_wins(self) -> None:
        self.assertEqual('a', self._choose(_lock('a'))[0].name)
        self.assertEqual('a', self._choose(_lock('a'), uid='uid-a')[0].name)

    def test_nothing_is_served_without_a_live_lock(self) -> None:
        # guessing the earliest booking could give a late Allocate of a
        # deleted pod the next pod's allocation
        for lock in (None, 'garbage', _lock(
                'a', NOW - datetime.timedelta(minutes=6)),
                hami.format_rfc3339(NOW)):
            err = self.assertRaises(exception.DevicePluginError,
                                    self._choose, lock)
            self.assertNotIsInstance(err, exception.LockHolderGone)
            self.assertIn('no live node lock', str(err))

    def test_gone_lock_holder_is_refused(self) -> None:
        err = self.assertRaises(exception.LockHolderGone, self._choose,
                                _lock('deleted'))
        self.assertIn('held by pod ns/deleted', str(err))
        self.assertEqual({'namespace': 'ns', 'name': 'deleted', 'uid': None},
                         {k: err.kwargs[k] for k in ('namespace', 'name',
                                                     'uid')})

    def test_replaced_lock_holder_is_refused(self) -> None:
        # same name, another UID: the lock was taken for the old pod
        err = self.assertRaises(exception.LockHolderGone, self._choose,
                                _lock('a'), uid='uid-of-the-old-a')
        self.assertIn('held by pod ns/a (uid uid-of-the-old-a)', str(err))

    def test_served_pods_and_counts(self) -> None:
        served = sharedalloc.Served().add('uid-b', 0, ['x-0'])
        self.assertEqual('a', self._choose(_lock('a'), served)[0].name)
        # the holder is served: no other pod is taken instead
        err = self.assertRaises(exception.DevicePluginError, self._choose,
                                _lock('b'), served)
        self.assertIn('pod ns/b holds the node lock of n1 and has no '
                      'container left', str(err))
        err = self.assertRaises(exception.DevicePluginError, self._choose,
                                _lock('a'), count=2)
        self.assertIn('no container left to serve has 2 GPUs', str(err))

    def test_only_record_confirmed_live_pods(self) -> None:
        pods = [_pod('a', uid='someone-else'), _pod('b', node='n2'),
                _pod('c'), _pod('a', phase='Succeeded')]
        self.assertEqual({}, sharedalloc.live_pods(self.record, pods))
        renamed = _pod('x', uid='uid-a')
        self.assertEqual({}, sharedalloc.live_pods(self.record, [renamed]))
        err = self.assertRaises(exception.LockHolderGone,
                                sharedalloc.choose, self.record, {},
                                sharedalloc.Served(), _lock('a'), 1, 'req',
                                NOW)
        self.assertIn('held by pod ns/a', str(err))


class ServedTest(testtools.TestCase):

    def test_round_trip_and_lookup(self) -> None:
        served = sharedalloc.Served().add('u1', 0, ['b-1', 'a-0']).add(
            'u1', 2, ['c-0'])
        again = sharedalloc.Served.decode(served.encode(), 'cp')
        self.assertEqual(served, again)
        self.assertEqual(('u1', 0), again.lookup(['a-0', 'b-1']))
        self.assertIsNone(again.lookup(['a-0']))
        self.assertEqual(frozenset({0, 2}), again.of('u1'))
        self.assertEqual(sharedalloc.Served(), again.only(['u2']))

    def test_unreadable_checkpoints_fail_closed(self) -> None:
        for text in ('{', '[]', '{"u": 1}', '{"u": {"x": []}}',
                     '{"u": {"0": [1]}}', '[' * 100000):
            err = self.assertRaises(exception.DevicePluginError,
                                    sharedalloc.Served.decode, text, 'cp')
            self.assertIn('cp', str(err))


class ContainerAllocationTest(testtools.TestCase):

    def test_shared_gpu_gets_mask_limit_and_library(self) -> None:
        record = _record(('n', 1, ((_dev(U0, 1024, 100),),)),
                         ('p', 2, ((_dev(U0, 49152, 76),),)))
        allocation = sharedalloc.container_allocation(
            record.pods['uid-p'], 0, UNITS)
        env = dict(allocation.envs)
        self.assertEqual('GPU-%s' % U0.uuid, env['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0', env['HIP_VISIBLE_DEVICES'])
        self.assertEqual('0:100-175', env['HSA_CU_MASK'])
        self.assertEqual('49152m', env['HIP_DEVICE_MEMORY_LIMIT_0'])
        self.assertEqual(hami.LD_AUDIT_LIBRARY, env['LD_AUDIT'])
        self.assertEqual([(hami.LD_AUDIT_LIBRARY, True)],
                         [(m.host_path, m.read_only)
                          for m in allocation.mounts])

    def test_whole_gpus_get_no_mask(self) -> None:
        record = _record(('p', 1, ((_dev(U0, U0.vram_mib, 304),
                                    _dev(U1, U1.vram_mib, 304)),)))
        allocation = sharedalloc.container_allocation(
            record.pods['uid-p'], 0, UNITS)
        env = dict(allocation.envs)
        self.assertEqual('GPU-%s,GPU-%s' % (U0.uuid, U1.uuid),
                         env['ROCR_VISIBLE_DEVICES'])
        for name in ('HSA_CU_MASK', 'LD_AUDIT', 'HIP_DEVICE_MEMORY_LIMIT_0'):
            self.assertNotIn(name, env)
        self.assertEqual((), allocation.mounts)

    def test_a_gpu_of_another_node_is_refused(self) -> None:
        grants = allocrecord.PodGrants('u', 'ns', 'p', 1, ((
            allocrecord.Grant('feedface', 1, 1),),))
        err = self.assertRaises(exception.DevicePluginError,
                                sharedalloc.container_allocation, grants, 0,
                                UNITS)
        self.assertIn('feedface', str(err))
        self.assertIn('ns/p', str(err))

    def test_mirror(self) -> None:
        value = '%s,AMD,0,10:;;%s,AMD,1024,20:;' % (U0.uuid, U0.uuid)
        allocated = hami.decode_pod_devices(value)
        record = _record(('p', 1, allocated))
        grants = record.pods['uid-p']
        annotations, done = sharedalloc.mirror(grants, frozenset({0}),
                                               allocated)
        self.assertFalse(done)
        self.assertEqual(';;%s,AMD,1024,20:;' % U0.uuid,
                         annotations[hami.DEVICES_TO_ALLOCATE])
        self.assertEqual({U0.uuid: (1 << 30) - 1}, hami.decode_cu_allocated(
            annotations[hami.CU_ALLOCATED]))
        annotations, done = sharedalloc.mirror(grants, frozenset({0, 2}))
        self.assertTrue(done)
        self.assertEqual('success', annotations[hami.BIND_PHASE])
        self.assertEqual(';;;', annotations[hami.DEVICES_TO_ALLOCATE])
