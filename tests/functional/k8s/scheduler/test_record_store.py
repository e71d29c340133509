"""The allocation record store against the API server stand-in: the last
version it saw saves a read before a guarded write, and never decides
anything on its own."""

from __future__ import annotations

import testtools

from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient

CAPACITY = {'g0': allocrecord.Capacity(10, 196608, 304)}


def _book(uid: str, cus: int = 76) -> recordstore.Change:
    containers = ((hami.ContainerDevice('g0', 'AMD', 1024, cus),),)
    return lambda record: allocrecord.book(record, uid, 'team', uid, 1,
                                           containers, CAPACITY)


class KeptVersionTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_namespace({'metadata': {
            'name': recordstore.DEFAULT_NAMESPACE}})
        self.store = recordstore.RecordStore(self.kube.api)
        self.other = recordstore.RecordStore(self.kube.api)

    def _calls(self) -> list[str]:
        return [r.split(' ')[0] for r in self.kube.server.requests
                if 'configmaps' in r]

    def test_consecutive_updates_write_without_reading(self) -> None:
        self.store.update('n1', _book('a'))
        before = len(self._calls())
        self.store.update('n1', _book('b'))
        self.store.update('n1', lambda r: allocrecord.without(r, 'a'))
        self.assertEqual(['PUT', 'PUT'], self._calls()[before:])
        self.assertEqual(2, self.store.reads_saved)
        self.assertEqual({'b'}, set(self.other.read('n1')[0].pods))

    def test_another_writer_is_never_overwritten(self) -> None:
        self.store.update('n1', _book('a'))
        # another extender books meanwhile: the kept version is stale
        self.other.update('n1', _book('b'))
        before = len(self._calls())
        self.store.update('n1', _book('c'))
        # the guarded write lost, the record was read, the change applied
        # to it and written
        self.assertEqual(['PUT', 'GET', 'PUT'], self._calls()[before:])
        self.assertEqual(1, self.store.stale_writes)
        self.assertEqual({'a', 'b', 'c'},
                         set(self.other.read('n1')[0].pods))

    def test_refusals_and_no_ops_are_decided_on_a_fresh_read(self) -> None:
        # the kept copy has the GPU full; another writer freed it: the
        # copy's refusal is not taken, the fresh record has room
        self.store.update('n1', _book('big', 304))
        self.other.update('n1', lambda r: allocrecord.without(r, 'big'))
        before = len(self._calls())
        self.store.update('n1', _book('c'))
        self.assertEqual(['GET', 'PUT'], self._calls()[before:])
        self.assertEqual({'c'}, set(self.other.read('n1')[0].pods))
        # removing a booking the copy does not hold reads first too
        self.store.update('n2', _book('x'))
        self.other.update('n2', _book('y'))
        before = len(self._calls())
        self.store.update('n2', lambda r: allocrecord.without(r, 'y'))
        self.assertEqual(['GET', 'PUT'], self._calls()[before:])
        self.assertEqual({'x'}, set(self.other.read('n2')[0].pods))
