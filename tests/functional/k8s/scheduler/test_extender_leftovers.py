"""No booking is left behind when the API fails in the middle of a filter.

A booking that stays in a node's allocation record while no extender's
cache knows of it holds its GPUs from every other pod until the record
collector's sweep (``[scheduler] record_sweep_interval``, 120 s by
default): every filter picks that node, its record refuses, and a pod
that fits only there waits. The reliability run through the fault proxy
found two ways to leave one: the booking was written but its answer lost
(the filter failed and its retry booked elsewhere; tested in
``test_extender_safety.LostAnswerTest.test_record_write_answer_lost``),
and the mirror annotations failed and so did the one removal attempt,
tested here through the fault proxy in front of the API server stand-in:
the removal is retried, then handed to the record collector.
"""

from __future__ import annotations

import time
from typing import Any

import testtools

from amdgpu_virt.k8s.record import store as recordstore
from tests.functional.fixtures import faultproxy
from tests.functional.k8s import cluster

Fault = faultproxy.Fault
Rule = faultproxy.Rule
NODES = ('n1', 'n2')
SMALL = {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
         'amd.com/gpumem': '1024'}
POD_PATCH = '/namespaces/team/pods/p($|[?])'


class LeftoverBookingTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(
            NODES, gpus=1, faults={'lifetime': 300.0}))
        assert self.cluster.proxy is not None
        self.proxy = self.cluster.proxy
        self.store = recordstore.RecordStore(self.cluster.api)
        self.pod = self.cluster.create(cluster.gpu_pod('p', [SMALL]))

    def _booked(self) -> list[str]:
        """Nodes whose record holds pod ``p``."""
        return [n for n in NODES
                if self.store.read(n)[0].find('team', 'p') is not None]

    def _faults(self, method: str, path: str) -> list[faultproxy.Fault]:
        return [f for m, p, f in self.proxy.log
                if m == method and path in p]

    def test_removal_after_a_failed_mirror_is_retried(self) -> None:
        # two removals fail, the third goes through
        self._filter_failing(removals=2)
        self.assertEqual([], self._booked())

    def test_removal_that_keeps_failing_is_left_to_the_collector(
            self) -> None:
        self._filter_failing(removals=3)
        # the collector's event thread removes it, long before a sweep
        deadline = time.monotonic() + 10
        while self._booked() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([], self._booked())
        service = self.cluster.service
        assert service is not None
        self.assertEqual(1, service.collector.removed)

    def _filter_failing(self, removals: int) -> None:
        """Filter ``p`` with its mirror patch refused and the first
        ``removals`` record writes after its booking failing."""
        self._book_on_both_records()
        self.proxy.add_rule(Rule(Fault.ERROR, 'PATCH', POD_PATCH))
        # the booking's own write passes
        self.proxy.add_rule(Rule(Fault.ERROR, 'PUT', '/configmaps/',
                                 times=removals, skip=1))
        answer = self.cluster.filter(self.pod)
        self.assertIn('PATCH pod team/p', answer['Error'])
        self.assertEqual(removals, self._faults(
            'PUT', '/configmaps/').count(Fault.ERROR))

    def _book_on_both_records(self) -> None:
        """Both records exist (a later booking replaces one with PUT)."""
        other = self.cluster.create(cluster.gpu_pod('other', [SMALL]))
        for node in NODES:
            answer: dict[str, Any] = self.cluster.filter(other, nodes=(node,))
            self.assertEqual([node], answer['NodeNames'], answer)
        records = [self.store.read(n) for n in NODES]
        self.assertEqual([True, True], [version is not None
                                  for _r, version in records])
        self.assertEqual(1, sum(r.find('team', 'other') is not None
                                for r, _v in records))
