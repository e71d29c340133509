"""Which pod and container an Allocate is for, as kubelet calls it."""

from __future__ import annotations

import datetime
from typing import Any

import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.node import sharedpick
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import hami

UNITS = devices.units_from_inventory(simulate.design_host(
    simulate.HostSpec(hostname='n1')))
U0 = UNITS[0]
CAP = sharedalloc.capacity(UNITS, 10)
NOW = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC)
RESOURCE = 'amd.com/gpu'
Kind = sharedpick.Kind


def _dev(cus: int, mib: int = 1024) -> hami.ContainerDevice:
    return hami.ContainerDevice(U0.uuid, 'AMD', mib, cus)


def _pod(name: str, containers: int = 1, init: tuple[bool, ...] = (),
         phase: str = 'Running', status: dict[str, Any] | None = None,
         deleting: bool = False, limits: dict[str, str] | None = None
         ) -> dict[str, Any]:
    """A pod bound to n1: ``init`` says, per init container, whether it
    is a sidecar."""
    meta: dict[str, Any] = {'name': name, 'namespace': 'ns',
                            'uid': 'uid-' + name}
    if deleting:
        meta['deletionTimestamp'] = '2026-12-06T12:00:00Z'
    resources = {'limits': dict(limits)} if limits else {}
    return {'metadata': meta, 'spec': {
        'nodeName': 'n1',
        'initContainers': [dict({'name': 'i%d' % n, 'resources': resources},
                                **({'restartPolicy': 'Always'} if side
                                   else {}))
                           for n, side in enumerate(init)],
        'containers': [{'name': 'c%d' % n, 'resources': resources}
                       for n in range(containers)]},
        'status': dict(status or {}, phase=phase)}


RUNNING = {'containerStatuses': [{'name': 'c0', 'restartCount': 0,
                                  'state': {'running': {}}}]}


def _lock(name: str) -> str:
    return '%s,ns,%s' % (hami.format_rfc3339(NOW), name)


class PickTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        # job: an init container of 1 GPU, then a container of 1 GPU;
        # other: one container
        self.record = allocrecord.Record('n1')
        self._book('job', ((_dev(76),), (_dev(152),)))
        self._book('other', ((_dev(30),),), 2)
        self.pods = [_pod('job', init=(False,)), _pod('other')]

    def _book(self, name: str, containers: hami.PodDevices,
              when: int = 1) -> None:
        self.record = allocrecord.book(self.record, 'uid-' + name, 'ns',
                                       name, when, containers, CAP)

    def _decide(self, ids: list[str], lock: str | None,
                served: sharedalloc.Served | None = None,
                pods: list[dict[str, Any]] | None = None
                ) -> sharedpick.Pick:
        return sharedpick.decide(
            self.record, self.pods if pods is None else pods,
            served or sharedalloc.Served(), lock, None, ids, RESOURCE,
            'req', NOW)

    def _where(self, pick: sharedpick.Pick) -> tuple[str, int, bool]:
        return pick.grants.name, pick.index, pick.retry

    def test_kinds_follow_the_pod_spec(self) -> None:
        self.assertEqual((Kind.SIDECAR, Kind.INIT, Kind.CONTAINER,
                          Kind.CONTAINER),
                         sharedpick.kinds(_pod('p', 2, (True, False))))
        self.assertEqual((), sharedpick.kinds({'spec': {
            'initContainers': 'junk', 'containers': None}}))

    def test_the_holders_next_container_in_order(self) -> None:
        first = self._decide(['a-0'], _lock('job'))
        self.assertEqual(('job', 0, False), self._where(first))
        served = sharedalloc.Served().add('uid-job', 0, ['a-0'])
        self.assertEqual(('job', 1, False), self._where(self._decide(
            ['b-0'], _lock('job'), served)))
        err = self.assertRaises(exception.DevicePluginError, self._decide,
                                ['b-0', 'b-1'], _lock('job'), served)
        self.assertIn('the next one, container 1, has 1 GPUs', str(err))

    def test_init_ids_handed_on_are_the_next_container(self) -> None:
        # kubelet's devicesToReuse: the container gets the init
        # container's very IDs; it is not a retry of the init container
        served = sharedalloc.Served().add('uid-job', 0, ['a-0'])
        self.assertEqual(('job', 1, False), self._where(self._decide(
            ['a-0'], _lock('job'), served)))

    def test_retries_of_the_holder(self) -> None:
        served = sharedalloc.Served().add('uid-job', 0, ['a-0'])
        # an init container's IDs with a next container of another size
        self._book('job', ((_dev(76),), (_dev(76), hami.ContainerDevice(
            UNITS[1].uuid, 'AMD', 1024, 76))))
        self.assertEqual(('job', 0, True), self._where(self._decide(
            ['a-0'], _lock('job'), served)))
        # a container's IDs; an init container's with nothing left
        served = served.add('uid-job', 1, ['a-0', 'b-0'])
        self.assertEqual(('job', 1, True), self._where(self._decide(
            ['b-0', 'a-0'], _lock('job'), served)))
        self.assertEqual(('job', 0, True), self._where(self._decide(
            ['a-0'], _lock('job'), served)))

    def test_a_sidecars_ids_are_its_own(self) -> None:
        pods = [_pod('job', init=(True,)), _pod('other')]
        served = sharedalloc.Served().add('uid-job', 0, ['a-0'])
        self.assertEqual(('job', 0, True), self._where(self._decide(
            ['a-0'], _lock('job'), served, pods)))

    def test_ids_of_a_pod_that_left_go_to_the_holder(self) -> None:
        served = sharedalloc.Served().add('uid-other', 0, ['a-0'])
        for other in (_pod('other', status=RUNNING),
                      _pod('other', deleting=True),
                      _pod('other', phase='Succeeded')):
            pick = self._decide(['a-0'], _lock('job'), served,
                                [_pod('job', init=(False,)), other])
            self.assertEqual(('job', 0, False), self._where(pick))

    def test_ids_of_a_pod_that_may_be_admitted_are_ambiguous(self) -> None:
        served = sharedalloc.Served().add('uid-other', 0, ['a-0'])
        err = self.assertRaises(exception.DevicePluginError, self._decide,
                                ['a-0'], _lock('job'), served)
        self.assertIn('pod ns/job (uid uid-job) holds the node lock',
                      str(err))
        self.assertIn('container 0 of pod ns/other', str(err))

    def test_a_record_that_disagrees_with_the_pod_is_refused(self) -> None:
        err = self.assertRaises(exception.DevicePluginError, self._decide,
                                ['a-0'], _lock('job'), None,
                                [_pod('job', 2, (False,)), _pod('other')])
        self.assertIn('the allocation record gives 2 containers, the pod '
                      'has 3', str(err))

    def test_a_retry_without_a_lock(self) -> None:
        served = sharedalloc.Served().add('uid-other', 0, ['a-0'])
        self.assertEqual(('other', 0, True), self._where(self._decide(
            ['a-0'], None, served,
            [_pod('other'), _pod('cpu'), _pod('job', status=RUNNING,
                                                init=(False,))])))

    def test_no_retry_without_a_lock_when_unsure(self) -> None:
        served = sharedalloc.Served().add('uid-other', 0, ['a-0'])
        for pods, why in (
                # the pod started: kubelet has its answer
                ([_pod('other', status=RUNNING)], 'no longer admits'),
                ([_pod('other', deleting=True)], 'no longer admits'),
                # another pod may be the one admitted
                ([_pod('other'), _pod('job', init=(False,))],
                 'pod ns/job may be the one kubelet admits'),
                ([_pod('other'), _pod('stray', limits={RESOURCE: '1'})],
                 'pod ns/stray may be the one kubelet admits')):
            err = self.assertRaises(exception.DevicePluginError,
                                    self._decide, ['a-0'], None, served,
                                    pods)
            self.assertIn('no live node lock', str(err))
            self.assertIn(why, str(err))
        # IDs no one was served, or served to two pods
        err = self.assertRaises(exception.DevicePluginError, self._decide,
                                ['z-0'], None, served)
        self.assertIn('no live node lock (none)', str(err))
        served = served.add('uid-job', 1, ['a-0'])
        err = self.assertRaises(exception.DevicePluginError, self._decide,
                                ['a-0'], None, served)
        self.assertIn('more than one pod', str(err))

    def test_a_gone_holder_is_refused(self) -> None:
        err = self.assertRaises(exception.LockHolderGone, self._decide,
                                ['a-0'], _lock('gone'))
        self.assertIn('held by pod ns/gone', str(err))


class PodStateTest(testtools.TestCase):

    def test_started(self) -> None:
        self.assertFalse(sharedpick.started(_pod('p')))
        self.assertFalse(sharedpick.started(_pod('p', status={
            'containerStatuses': [{'state': {'waiting': {
                'reason': 'ContainerCreating'}}}, 'junk']})))
        for status in (RUNNING, {'initContainerStatuses': [
                {'state': {'terminated': {'exitCode': 0}}}]},
                {'containerStatuses': [{'state': {'waiting': {}},
                                        'lastState': {'terminated': {}}}]},
                {'containerStatuses': [{'restartCount': 2}]}):
            self.assertTrue(sharedpick.started(_pod('p', status=status)))

    def test_asks_for(self) -> None:
        self.assertFalse(sharedpick.asks_for(_pod('p'), RESOURCE))
        for value, asks in (('0', False), ('1', True), (2, True),
                            ('1k', True)):
            self.assertEqual(asks, sharedpick.asks_for(
                _pod('p', limits={RESOURCE: value}), RESOURCE), value)


class ServedOrderTest(testtools.TestCase):

    def test_order_and_hits(self) -> None:
        served = sharedalloc.Served().add('u1', 0, ['a-0']).add(
            'u1', 1, ['a-0']).add('u2', 0, ['b-0'])
        self.assertEqual([('u1', 0), ('u1', 1)], served.hits(['a-0']))
        self.assertEqual(('u1', 1), served.latest(['a-0']))
        self.assertEqual(('u1', 0), served.lookup(['a-0']))
        again = sharedalloc.Served.decode(served.encode(), 'cp')
        self.assertEqual(served, again)
        # serving a container again moves it last
        self.assertEqual(('u1', 0), served.add('u1', 0, ['a-0']).latest(
            ['a-0']))

    def test_version_1_checkpoints_are_read(self) -> None:
        served = sharedalloc.Served.decode(
            '{"u1": {"0": ["b-1", "a-0"], "2": ["c-0"]}}', 'cp')
        self.assertEqual(frozenset({0, 2}), served.of('u1'))
        self.assertEqual(('u1', 0), served.lookup(['a-0', 'b-1']))

    def test_bad_version_2_checkpoints_fail_closed(self) -> None:
        for text in ('{"version": 3, "served": []}',
                     '{"version": 2, "served": {}}',
                     '{"version": 2, "served": [], "x": 1}',
                     '{"version": 2, "served": [["u", 0]]}',
                     '{"version": 2, "served": [["u", -1, []]]}',
                     '{"version": 2, "served": [["u", 0, [1]]]}',
                     '{"version": 2, "served": [[1, 0, []]]}'):
            err = self.assertRaises(exception.DevicePluginError,
                                    sharedalloc.Served.decode, text, 'cp')
            self.assertIn('cp', str(err))
