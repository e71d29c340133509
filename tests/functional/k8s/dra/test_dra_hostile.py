"""DRA prepare against claim results and state files nobody should write.

The claim status is the kube-scheduler's, the state file the plugin's
own; both are still input. The faults seen: ``consumedCapacity.memory:
1e999999`` kept prepare (and with it the whole plugin, health stream
included) in C code for over a minute; ``9e99999999`` let
``decimal.Overflow`` escape; an ``adminAccess`` result was prepared as an
exclusive one, so a monitoring claim prepared first made its owner's
claim fail; a result named twice was prepared twice; a deeply nested state
file raised ``RecursionError``. Here the plugin runs as in
``test_dra_plugin`` (the real client on the API server stand-in, the DRA
kubelet stand-in over unix sockets) and kubelet asks it to prepare.
"""

from __future__ import annotations

import copy
import os
import time

import testtools

from amdgpu_virt import exception
from tests.functional.fixtures import draallocator as da
from tests.functional.k8s.dra import test_dra_plugin as plugin_test

DRIVER = plugin_test.DRIVER
#: prepare of a hostile claim answers within this (it took over 60 s)
ANSWER_WITHIN = 5.0


class HostileClaimTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.node = self.useFixture(plugin_test.DraNode())

    def _with_results(self, name: str, results: list[dict[str, object]],
                      admin: bool = False) -> dict[str, object]:
        """A claim whose status is written by hand, as a scheduler
        could; stored past the API server's checks (an older server, a
        write straight to etcd): the plugin must not count on them."""
        request = da.request('gpu', DRIVER)
        if admin:
            request['exactly']['adminAccess'] = True  # type: ignore
        stored = plugin_test._raw(
            self.node.k8s.resource.create_namespaced_resource_claim(
                'default', da.claim(name, [request]),
                _preload_content=False))
        stored['status'] = {'allocation': {'devices': {
            'results': results}}}
        return self.node.k8s.server.force_object('resourceclaims', stored)

    def _results(self, claim: dict[str, object]) -> list[dict[str, object]]:
        return copy.deepcopy(
            claim['status']['allocation']['devices']['results'])  # type: ignore

    def test_huge_quantities_are_refused_at_once(self) -> None:
        share = self.node.allocate('share', [plugin_test.share_request()])
        (result,) = self._results(share)
        for name, field, value in (
                ('inf', 'memory', '1e999999'),
                ('overflow', 'memory', '9e99999999'),
                ('digits', 'computeUnits', '7' * 5000),
                ('long', 'memory', '1' * 30 + 'Gi'),
                ('negative-exp', 'memory', '1e-999999'),
                ('not-one', 'memory', '12 Gi')):
            bad = copy.deepcopy(result)
            bad['consumedCapacity'][field] = value  # type: ignore[index]
            claim = self._with_results(name, [bad])
            began = time.monotonic()
            entry = self.node.prepare(claim)[claim['metadata']['uid']]
            self.assertLess(time.monotonic() - began, ANSWER_WITHIN, name)
            self.assertIn('ResourceClaim default/%s: status.allocation.'
                          'devices.results[0].consumedCapacity.%s'
                          % (name, field), entry.error)
            self.assertEqual([], list(entry.devices))
        # the plugin went on: the honest share prepares
        entry = self.node.prepare(share)[share['metadata']['uid']]
        self.assertEqual('', entry.error)

    def test_admin_access_watches_and_owns_nothing(self) -> None:
        owner = self.node.allocate('owner', [da.request('gpu', DRIVER)])
        watched = self._results(owner)
        for result in watched:
            result['adminAccess'] = True
        monitor = self._with_results('monitor', watched, admin=True)
        # the monitoring claim first, then its owner's: both prepared
        for claim in (monitor, owner):
            entry = self.node.prepare(claim)[claim['metadata']['uid']]
            self.assertEqual('', entry.error, claim['metadata']['name'])
        seen = plugin_test.container_of(self.node.spec(monitor)).devices
        held = plugin_test.container_of(self.node.spec(owner)).devices
        self.assertEqual(held, seen)
        # and the device is still the owner's alone
        other = self._with_results('other', self._results(owner))
        entry = self.node.prepare(other)[other['metadata']['uid']]
        self.assertIn('is held by both', entry.error)

    def test_a_result_named_twice_is_refused(self) -> None:
        share = self.node.allocate('share', [plugin_test.share_request(
            cus='38', memory='8Gi')])
        (result,) = self._results(share)
        claim = self._with_results('twice', [result, dict(result)])
        entry = self.node.prepare(claim)[claim['metadata']['uid']]
        self.assertIn('results[1] names %s share %s again (as results[0] '
                      'did)' % (result['device'], result['shareID']),
                      entry.error)
        whole = self.node.allocate('whole', [da.request('gpu', DRIVER)])
        (result,) = self._results(whole)
        claim = self._with_results('twice-whole', [result, dict(result)])
        entry = self.node.prepare(claim)[claim['metadata']['uid']]
        self.assertIn('names %s again' % result['device'], entry.error)


class HostileStateFileTest(testtools.TestCase):

    def test_a_deeply_nested_state_file_is_named(self) -> None:
        node = self.useFixture(plugin_test.DraNode())
        path = node.plugin.state.path
        node.stop_plugin()
        with open(path, 'w') as handle:
            handle.write('{"version": 1, "claims": %s}'
                         % ('[' * 100000 + ']' * 100000))
        err = self.assertRaises(exception.DraStateError, node.start_plugin)
        self.assertIn(path, str(err))
        self.assertIn('nested deeper than 100 levels', str(err))
        os.unlink(path)
        node.start_plugin()
