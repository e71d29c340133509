"""The pending pods board keeps unbound pods at their newest version."""

from __future__ import annotations

from typing import Any

import testtools

from amdgpu_virt.k8s.scheduler import pending


def _pod(version: Any, uid: str = 'u1', node: str | None = None,
         phase: str = 'Pending') -> dict[str, Any]:
    spec: dict[str, Any] = {'schedulerName': 's'}
    if node:
        spec['nodeName'] = node
    return {'metadata': {'namespace': 'team', 'name': 'p', 'uid': uid,
                         'resourceVersion': version},
            'spec': spec, 'status': {'phase': phase}}


class PendingPodsTest(testtools.TestCase):

    def test_newest_unbound_version_with_its_uid(self) -> None:
        board = pending.PendingPods()
        board.observe('ADDED', _pod('5'))
        board.observe('MODIFIED', _pod('4', uid='old'))  # late, older
        seen = board.get('team', 'p', 'u1')
        assert seen is not None
        self.assertEqual('5', seen[1])
        self.assertIsNone(board.get('team', 'p', 'other'))
        self.assertIsNone(board.get('team', 'p', None))
        self.assertIsNone(board.get('team', 'p', ''))
        self.assertEqual(1, board.hits)

    def test_bound_finished_deleted_pods_go(self) -> None:
        for kind, obj in (('MODIFIED', _pod('6', node='n1')),
                          ('MODIFIED', _pod('6', phase='Failed')),
                          ('MODIFIED', _pod('6', phase='Succeeded')),
                          ('DELETED', _pod('6')),
                          ('MODIFIED', _pod(None)),
                          ('MODIFIED', _pod('x'))):
            board = pending.PendingPods()
            board.observe('ADDED', _pod('5'))
            board.observe(kind, obj)
            self.assertIsNone(board.get('team', 'p', 'u1'), (kind, obj))
            self.assertEqual(0, len(board))

    def test_malformed_and_bounded(self) -> None:
        board = pending.PendingPods(known=2)
        for obj in (None, 'x', {}, {'metadata': []},
                    {'metadata': {'name': 'p'}},
                    dict(_pod('5'), spec=None)):
            board.observe('ADDED', obj)
        self.assertEqual(0, len(board))
        for number in range(3):
            obj = _pod(str(number + 1))
            obj['metadata']['name'] = 'p%d' % number
            board.observe('ADDED', obj)
        self.assertEqual(2, len(board))
        self.assertIsNone(board.get('team', 'p0', 'u1'))
        self.assertIsNotNone(board.get('team', 'p2', 'u1'))
