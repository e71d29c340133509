"""Which connection a full server gives up for a new one."""

from __future__ import annotations

import types

import fixtures
import testtools

from amdgpu_virt.k8s.api import connpolicy as cp
from amdgpu_virt.k8s.scheduler import service


def _conn(number: int, state: str, since: float, received: int = 0,
          served: int = 0) -> cp.ConnState:
    return cp.ConnState(number, '10.0.0.%d' % number, state, since,
                        received, served)


class VictimTest(testtools.TestCase):

    def test_order(self) -> None:
        now = 100.0
        working = _conn(1, cp.WORKING, 0.0)
        paced = _conn(2, cp.READING, 90.0, received=10 * 4096)
        slow = _conn(3, cp.READING, 90.0, received=1)
        slower = _conn(4, cp.READING, 50.0, received=1)
        kept = _conn(5, cp.IDLE, 10.0, served=3)
        fresh = _conn(6, cp.HANDSHAKE, 99.0)
        # its first bytes arrived, not read yet: a request under way
        begun = _conn(7, cp.IDLE, 0.0)
        begun.waiting = 1
        conns = [working, paced, slow, slower, kept, fresh, begun]
        chosen = []
        while True:
            victim = cp.victim(conns, now, 4096)
            if victim is None:
                break
            chosen.append(victim.number)
            conns.remove(victim)
        # silent first, then kept-alive idle, then the slowest readers;
        # never one at the floor's pace, never one being answered
        self.assertEqual([6, 5, 4, 3], chosen)
        self.assertEqual({1, 2, 7}, {c.number for c in conns})

    def test_a_fresh_reader_is_not_below_the_floor(self) -> None:
        self.assertFalse(cp.below_floor(_conn(1, cp.READING, 100.0, 1),
                                        100.0, 4096))
        self.assertTrue(cp.below_floor(_conn(1, cp.READING, 99.0, 1),
                                       100.0, 4096))
        self.assertFalse(cp.below_floor(_conn(1, cp.IDLE, 0.0), 100.0,
                                        4096))


class MetricsHostTest(testtools.TestCase):

    def test_pod_address_or_loopback_never_every_address(self) -> None:
        group = types.SimpleNamespace(metrics_host=None)
        self.useFixture(fixtures.EnvironmentVariable('POD_IP'))
        self.assertEqual('127.0.0.1', service.metrics_host(group))
        self.useFixture(fixtures.EnvironmentVariable('POD_IP', '10.1.2.3'))
        self.assertEqual('10.1.2.3', service.metrics_host(group))
        group.metrics_host = '0.0.0.0'  # noqa: S104 (the admin's choice)
        self.assertEqual('0.0.0.0', service.metrics_host(group))  # noqa
