"""The lock board keeps the newest lock each node showed, and wakes."""

from __future__ import annotations

import threading
import time
from typing import Any

import testtools

from amdgpu_virt.k8s.record import lockboard
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.sharing import hami

LOCK = '2026-12-01T10:00:00Z,team,p'


def _node(name: str, version: Any, **annotations: str) -> dict[str, Any]:
    return {'metadata': {'name': name, 'resourceVersion': version,
                         'annotations': dict(annotations)}}


def _lock(board: lockboard.LockBoard, name: str) -> str | None:
    seen = board.node(name)
    if seen is None:
        return None
    value: str | None = seen['metadata']['annotations'].get(hami.NODE_LOCK)
    return value


class LockBoardTest(testtools.TestCase):

    def test_keeps_the_newest_version(self) -> None:
        board = lockboard.LockBoard()
        self.assertIsNone(board.node('n1'))
        board.observe(_node('n1', '5', **{hami.NODE_LOCK: LOCK}))
        # an older answer arriving late does not bring the lock back
        board.observe(_node('n1', '7'))
        board.observe(_node('n1', '6', **{hami.NODE_LOCK: LOCK}))
        seen = board.node('n1')
        assert seen is not None
        self.assertEqual('7', seen['metadata']['resourceVersion'])
        self.assertIsNone(_lock(board, 'n1'))

    def test_keeps_only_the_lock_annotations(self) -> None:
        board = lockboard.LockBoard()
        uid = nodelock.encode_lock_uid('u-1', LOCK)
        board.observe(_node('n1', '3', other='x', **{
            hami.NODE_LOCK: LOCK, nodelock.LOCK_UID: uid}))
        seen = board.node('n1')
        assert seen is not None
        self.assertEqual({hami.NODE_LOCK: LOCK, nodelock.LOCK_UID: uid},
                         seen['metadata']['annotations'])
        self.assertEqual('u-1', nodelock.lock_uid(
            seen['metadata']['annotations']))

    def test_unreadable_objects_are_not_kept(self) -> None:
        board = lockboard.LockBoard()
        for obj in (None, 'x', {}, {'metadata': 'x'},
                    _node('n1', None), _node('n1', 'abc'),
                    _node('n1', ''), _node('n1', 5), _node('n1', '-1'),
                    {'metadata': {'resourceVersion': '5'}}):
            board.observe(obj)
        self.assertIsNone(board.node('n1'))

    def test_forget_and_bound(self) -> None:
        board = lockboard.LockBoard(known=2)
        for number, name in enumerate(('n1', 'n2', 'n3')):
            board.observe(_node(name, str(number + 1)))
        self.assertIsNone(board.node('n1'))
        self.assertIsNotNone(board.node('n3'))
        board.forget('n3')
        self.assertIsNone(board.node('n3'))

    def test_wait_ends_on_a_newer_version(self) -> None:
        board = lockboard.LockBoard()
        board.observe(_node('n1', '5', **{hami.NODE_LOCK: LOCK}))
        timer = threading.Timer(0.05, board.observe, (_node('n1', '6'),))
        timer.start()
        self.addCleanup(timer.cancel)
        began = time.monotonic()
        self.assertTrue(board.wait('n1', '5', 10.0))
        self.assertLess(time.monotonic() - began, 5.0)
        self.assertIsNone(_lock(board, 'n1'))

    def test_wait_times_out_without_news(self) -> None:
        board = lockboard.LockBoard()
        board.observe(_node('n1', '5'))
        # another node's change does not wake it
        board.observe(_node('n2', '9'))
        self.assertFalse(board.wait('n1', '5', 0.02))
        self.assertTrue(board.wait('n1', 'unknown', 0.0))
