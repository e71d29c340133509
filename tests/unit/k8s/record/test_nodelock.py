"""The UID next to the node lock belongs to that lock value only."""

from __future__ import annotations

import testtools

from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.sharing import hami

LOCK = '2026-12-01T10:00:00Z,team,p'


class LockUidTest(testtools.TestCase):

    def test_paired_with_its_lock(self) -> None:
        value = nodelock.encode_lock_uid('u-1', LOCK)
        self.assertEqual('u-1', nodelock.lock_uid({
            hami.NODE_LOCK: LOCK, nodelock.LOCK_UID: value}))

    def test_not_given_to_another_lock(self) -> None:
        value = nodelock.encode_lock_uid('u-1', LOCK)
        for found in (
                # another writer (HAMi's scheduler) took the lock over
                {hami.NODE_LOCK: LOCK.replace(',p', ',q'),
                 nodelock.LOCK_UID: value},
                {nodelock.LOCK_UID: value}, {hami.NODE_LOCK: LOCK},
                {hami.NODE_LOCK: LOCK, nodelock.LOCK_UID: 'u-1'},
                {hami.NODE_LOCK: LOCK, nodelock.LOCK_UID: ' ' + LOCK},
                {hami.NODE_LOCK: LOCK, nodelock.LOCK_UID: 7}):
            self.assertIsNone(nodelock.lock_uid(found), found)
