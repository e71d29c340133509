"""The node locker with a lock board, against the API server stand-in:
a board behind the API costs a retry, never a second holder, and a
waiter wakes when the board shows the node changed."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.record import lockboard
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.sharing import hami
from tests.functional.k8s import cluster


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class BoardLockerTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(('n1',), gpus=1))
        self.server = self.cluster.kube.server
        for name in ('live', 'p', 'q'):
            self.cluster.create(cluster.gpu_pod(name, [{
                'amd.com/gpu': '1'}]))
        self.board = lockboard.LockBoard()
        self.locker = nodelock.NodeLocker(self.cluster.api, wait=0.5,
                                          board=self.board)

    def _node(self) -> dict[str, Any]:
        node: dict[str, Any] = self.server.get_object('nodes', 'n1')
        return node

    def _lock(self) -> str | None:
        value: str | None = self._node()['metadata'].get(
            'annotations', {}).get(hami.NODE_LOCK)
        return value

    def _set(self, value: str | None) -> None:
        self.cluster.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: value}}},
            _content_type='application/merge-patch+json')

    def test_a_board_showing_a_free_node_takes_no_held_lock(self) -> None:
        self.board.observe(self._node())   # free, as the watch saw it
        held = hami.encode_node_lock(hami.NodeLock(_now(), 'team', 'live'))
        self._set(held)                    # the watch has not shown this
        err = self.assertRaises(exception.NodeLockError,
                                self.locker.acquire, 'n1', 'team', 'p')
        self.assertIn('held by team/live', str(err))
        self.assertEqual(held, self._lock())

    def test_a_board_showing_a_held_lock_reads_the_api(self) -> None:
        self._set(hami.encode_node_lock(hami.NodeLock(_now(), 'team',
                                                      'live')))
        self.board.observe(self._node())
        self._set(None)                    # released; the board is behind
        began = time.monotonic()
        self.locker.acquire('n1', 'team', 'p', 'uid-p')
        self.assertLess(time.monotonic() - began, 0.5)
        self.assertTrue(hami.decode_node_lock(self._lock() or '').held_by(
            'team', 'p'))
        # the board learnt the lock from the patch's answer
        seen = self.board.node('n1')
        assert seen is not None
        self.assertEqual(self._lock(), seen['metadata']['annotations'][
            hami.NODE_LOCK])

    def test_a_waiter_wakes_on_the_boards_news(self) -> None:
        locker = nodelock.NodeLocker(self.cluster.api, wait=30.0,
                                     board=self.board)
        locker.acquire('n1', 'team', 'live')
        woken = []
        wait = self.board.wait

        def watched(name: str, version: Any, timeout: float) -> bool:
            news = wait(name, version, timeout)
            woken.append(news)
            return news

        self.board.wait = watched  # type: ignore[method-assign]

        def release() -> None:
            # the releasing process shows the board the node it wrote
            self.assertTrue(locker.release('n1', 'team', 'live'))

        timer = threading.Timer(0.3, release)
        timer.start()
        self.addCleanup(timer.cancel)
        locker.acquire('n1', 'team', 'p')
        self.assertTrue(hami.decode_node_lock(self._lock() or '').held_by(
            'team', 'p'))
        # a wait ended on the release, not on its timeout
        self.assertIn(True, woken)

    def test_binds_of_one_node_queue_in_the_process(self) -> None:
        self.locker.acquire('n1', 'team', 'live')
        queue = self.locker._queue('n1')
        self.assertFalse(queue.locked())
        with queue:
            # another bind of this node is between the queue and the API
            err = self.assertRaises(exception.NodeLockError,
                                    nodelock.NodeLocker.acquire,
                                    self.locker, 'n1', 'team', 'q')
        self.assertIn('other binds of this node went first', str(err))
        self.assertTrue(hami.decode_node_lock(self._lock() or '').held_by(
            'team', 'live'))
