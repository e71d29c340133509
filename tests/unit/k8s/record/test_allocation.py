"""The allocation record's codec, checks and changes."""

from __future__ import annotations

import json

import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import hami

CAP = {'g0': allocrecord.Capacity(4, 1000, 100),
       'g1': allocrecord.Capacity(4, 1000, 100)}


def _dev(gpu: str, mib: int, cus: int) -> hami.ContainerDevice:
    return hami.ContainerDevice(gpu.upper(), 'AMD', mib, cus)


def _book(record: allocrecord.Record, name: str,
          *containers: tuple[hami.ContainerDevice, ...]
          ) -> allocrecord.Record:
    return allocrecord.book(record, 'uid-' + name, 'ns', name, 7,
                            tuple(containers), CAP)


class BookTest(testtools.TestCase):

    def test_disjoint_ranges_and_round_trip(self) -> None:
        record = _book(allocrecord.Record('n1'), 'a', (_dev('g0', 100, 30),))
        record = _book(record, 'b', (_dev('g0', 100, 30),),
                       (_dev('g0', 100, 20), _dev('g1', 1000, 100)))
        masks = record.pods['uid-b'].masks()
        self.assertEqual(((1 << 80) - 1) ^ ((1 << 30) - 1), masks['g0'])
        self.assertEqual((1 << 100) - 1, masks['g1'])
        self.assertEqual((1 << 30) - 1, record.pods['uid-a'].masks()['g0'])
        text = allocrecord.encode(record)
        self.assertEqual(record, allocrecord.decode(text, 'n1'))
        self.assertEqual(text, allocrecord.encode(allocrecord.decode(
            text, 'n1')))
        # booking again replaces, it never adds
        again = _book(record, 'a', (_dev('g0', 100, 30),))
        self.assertEqual(record, again)

    def test_no_room_is_refused(self) -> None:
        record = _book(allocrecord.Record('n1'), 'a', (_dev('g0', 100, 90),))
        self.assertRaises(exception.InsufficientCapacity, _book, record, 'b',
                          (_dev('g0', 100, 20),))
        # a whole GPU is not shared
        self.assertRaises(exception.InsufficientCapacity, _book, record, 'c',
                          (_dev('g0', 100, 100),))
        whole = _book(allocrecord.Record('n1'), 'w', (_dev('g1', 10, 100),))
        err = self.assertRaises(exception.SharingError, _book, whole, 'x',
                                (_dev('g1', 10, 10),))
        self.assertIn('g1', str(err))
        # memory and slots another writer took are "no room" too (the
        # extender refuses or retries), never an over-committed record
        err = self.assertRaises(exception.InsufficientCapacity, _book,
                                record, 'm', (_dev('g0', 901, 5),))
        self.assertIn('901 MiB to ns/m: 900 free of 1000', str(err))
        full = record
        for n in range(3):
            full = _book(full, 's%d' % n, (_dev('g0', 1, 1),))
        err = self.assertRaises(exception.InsufficientCapacity, _book,
                                full, 's9', (_dev('g0', 1, 1),))
        self.assertIn('1 slots to ns/s9: 0 free of 4', str(err))
        # two containers of one pod add up
        err = self.assertRaises(exception.InsufficientCapacity, _book,
                                allocrecord.Record('n1'), 'two',
                                (_dev('g0', 600, 5),), (_dev('g0', 600, 5),))
        self.assertIn('600 MiB to ns/two: 400 free', str(err))
        err = self.assertRaises(exception.AllocationRecordError, _book,
                                record, 'z', (_dev('gX', 1, 1),))
        self.assertIn('GPU GX is not one of node n1', str(err))

    def test_without_and_prune(self) -> None:
        record = _book(allocrecord.Record('n1'), 'a', (_dev('g0', 1, 1),))
        record = _book(record, 'b', (_dev('g0', 1, 1),))
        self.assertEqual({'uid-b'}, set(allocrecord.without(
            record, 'uid-a').pods))
        self.assertIs(record, allocrecord.without(record, 'uid-x'))
        live = {'uid-a': 'n1', 'uid-b': ''}
        self.assertIs(record, allocrecord.prune(record, live, 8, 100))
        self.assertEqual({'uid-a'}, set(allocrecord.prune(
            record, live, 200, 100).pods))
        self.assertEqual({'uid-b'}, set(allocrecord.prune(
            record, {'uid-a': 'n2', 'uid-b': ''}, 8, 100).pods))
        self.assertEqual({}, dict(allocrecord.prune(record, {}, 8, 100).pods))

    def test_prune_drops_an_unbound_booking_older_than_the_current(
            self) -> None:
        # both booked at 7; uid-b unbound, its current booking elsewhere
        record = _book(allocrecord.Record('n1'), 'a', (_dev('g0', 1, 1),))
        record = _book(record, 'b', (_dev('g0', 1, 1),))
        live = {'uid-a': '', 'uid-b': ''}
        self.assertEqual({'uid-a'}, set(allocrecord.prune(
            record, live, 8, 100, {'uid-b': 8}).pods))
        # as new or newer: kept until the unbound timeout
        for when in (7, 6):
            self.assertIs(record, allocrecord.prune(
                record, live, 8, 100, {'uid-b': when}))
        # a bound pod's booking is judged by its node, not by the times
        self.assertIs(record, allocrecord.prune(
            record, {'uid-a': 'n1', 'uid-b': 'n1'}, 8, 100,
            {'uid-a': 9, 'uid-b': 9}))


class DecodeTest(testtools.TestCase):

    def _text(self, **entry: object) -> str:
        base: dict[str, object] = {
            'namespace': 'ns', 'name': 'p', 'time': 1,
            'containers': [[{'gpu': 'g0', 'mem': 1, 'cus': '0-3'}]]}
        base.update(entry)
        return json.dumps({'node': 'n1', 'pods': {'u1': base}})

    def test_strict(self) -> None:
        cases = [
            ('nope', 'not JSON'),
            ('[]', 'not an object'),
            (json.dumps({'node': 'n2', 'pods': {}}), "for node 'n2'"),
            (json.dumps({'node': 'n1', 'pods': {}, 'x': 1}), 'unknown'),
            (json.dumps({'node': 'n1'}), "missing 'pods'"),
            (self._text(name='Bad_Name'), 'pods[u1].name'),
            (self._text(time=-1), 'pods[u1].time'),
            (self._text(time=True), 'pods[u1].time'),
            (self._text(extra=1), 'unknown field'),
            (self._text(containers=[[{'gpu': 'g0', 'mem': 1,
                                      'cus': '3-1'}]]), 'cus'),
            (self._text(containers=[[{'gpu': 'g0', 'mem': 1 << 40,
                                      'cus': '1'}]]), 'mem'),
            (self._text(containers=[[{'gpu': 'g0', 'mem': 1, 'cus': '1'},
                                     {'gpu': 'G0', 'mem': 1, 'cus': '2'}]]),
             'listed twice'),
            (self._text(containers=[[]] * 65), 'at most 64'),
            ('[' * 100000, 'not JSON'),
            (' ' * (allocrecord.MAX_BYTES + 1), 'larger than'),
        ]
        for text, needle in cases:
            err = self.assertRaises(exception.AllocationRecordError,
                                    allocrecord.decode, text, 'n1')
            self.assertIn(needle, str(err), text[:80])
            self.assertIn('amdgpu-virt-alloc-n1', str(err))

    def test_check_fails_closed_on_overlap(self) -> None:
        text = json.dumps({'node': 'n1', 'pods': {
            'u1': {'namespace': 'ns', 'name': 'a', 'time': 1, 'containers': [
                [{'gpu': 'g0', 'mem': 1, 'cus': '0-9'}]]},
            'u2': {'namespace': 'ns', 'name': 'b', 'time': 1, 'containers': [
                [{'gpu': 'g0', 'mem': 1, 'cus': '9-19'}]]}}})
        record = allocrecord.decode(text, 'n1')
        err = self.assertRaises(exception.AllocationRecordError,
                                allocrecord.check, record, CAP)
        self.assertIn('CUs 9 of GPU g0 are also held by pod ns/a', str(err))
        beyond = allocrecord.decode(text.replace('9-19', '100'), 'n1')
        err = self.assertRaises(exception.AllocationRecordError,
                                allocrecord.check, beyond, CAP)
        self.assertIn('beyond the 100', str(err))
        # a stored record whose memory or slots are over-committed
        heavy = allocrecord.decode(text.replace(
            '"mem": 1, "cus": "9-19"', '"mem": 1000, "cus": "10-19"'), 'n1')
        err = self.assertRaises(exception.AllocationRecordError,
                                allocrecord.check, heavy, CAP)
        self.assertIn('GPU g0 has 1000 MiB, 1001 are booked', str(err))
        err = self.assertRaises(
            exception.AllocationRecordError, allocrecord.check,
            allocrecord.decode(text.replace('9-19', '10-19'), 'n1'),
            {'g0': allocrecord.Capacity(1, 1000, 100)})
        self.assertIn('GPU g0 has 1 slots', str(err))


class NameTest(testtools.TestCase):

    def test_names(self) -> None:
        self.assertEqual('amdgpu-virt-alloc-n1',
                         allocrecord.configmap_name('n1'))
        long = 'a' * 250
        name = allocrecord.configmap_name(long)
        self.assertLessEqual(len(name), 253)
        self.assertEqual(name, allocrecord.configmap_name(long))
        self.assertNotEqual(name, allocrecord.configmap_name('a' * 249 + 'b'))
