"""resource.k8s.io/v1 in the API server stand-in (DRA objects).

The DRA tests rely on these semantics of the real server: cluster-scoped
ResourceSlices and DeviceClasses, namespaced ResourceClaims with a
status subresource, ResourceSlice field selectors, the 1.35 rule that a
slice holds devices or counters but not both, an immutable driver, and
fields of disabled feature gates dropped on write.
"""

from __future__ import annotations

import json

import testtools
from kubernetes import client
from kubernetes.client import exceptions

from tests.functional.fixtures import kubeclient


def _slice(name, node='n1', driver='gpu.amd.com', **spec):
    body = {'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceSlice',
            'metadata': {'name': name},
            'spec': {'driver': driver, 'nodeName': node,
                     'pool': {'name': node, 'generation': 1,
                              'resourceSliceCount': 1}}}
    body['spec'].update(spec)
    return body


def _raw(response):
    return json.loads(response.data)


class TestDraResources(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.k8s = self.useFixture(kubeclient.ApiServerFixture())
        self.api = self.k8s.resource

    def test_slices_with_field_selectors(self):
        self.api.create_resource_slice(_slice('a'))
        self.api.create_resource_slice(_slice('b', node='n2'))
        self.api.create_resource_slice(_slice('c', driver='x.example.com'))
        got = _raw(self.api.list_resource_slice(
            field_selector='spec.nodeName=n1,spec.driver=gpu.amd.com',
            _preload_content=False))
        self.assertEqual(['a'], [s['metadata']['name']
                                 for s in got['items']])
        err = self.assertRaises(exceptions.ApiException,
                                self.api.list_resource_slice,
                                field_selector='spec.devices=1')
        self.assertEqual(400, err.status)

    def test_devices_and_counters_in_one_slice_are_refused(self):
        body = _slice('a', devices=[{'name': 'd'}],
                      sharedCounters=[{'name': 'c', 'counters': {}}])
        err = self.assertRaises(exceptions.ApiException,
                                self.api.create_resource_slice, body)
        self.assertEqual(422, err.status)
        self.assertIn('only one of', err.body)

    def test_driver_is_immutable_and_updates_need_the_version(self):
        made = _raw(self.api.create_resource_slice(
            _slice('a'), _preload_content=False))
        changed = _slice('a', driver='x.example.com')
        changed['metadata']['resourceVersion'] = \
            made['metadata']['resourceVersion']
        err = self.assertRaises(exceptions.ApiException,
                                self.api.replace_resource_slice, 'a',
                                changed)
        self.assertEqual(422, err.status)
        stale = _slice('a')
        stale['metadata']['resourceVersion'] = '1'
        err = self.assertRaises(exceptions.ApiException,
                                self.api.replace_resource_slice, 'a', stale)
        self.assertEqual(409, err.status)

    def test_disabled_gates_drop_their_fields(self):
        self.k8s.server.store.disabled_gates.add('DRAPartitionableDevices')
        body = _slice('a', devices=[{'name': 'd', 'consumesCounters': [
            {'counterSet': 'c', 'counters': {'x': {'value': '1'}}}],
            'allowMultipleAllocations': True}])
        stored = _raw(self.api.create_resource_slice(
            body, _preload_content=False))
        (device,) = stored['spec']['devices']
        self.assertNotIn('consumesCounters', device)
        self.assertTrue(device['allowMultipleAllocations'])

    def test_claims_have_a_status_subresource(self):
        self.k8s.api.create_namespace({'metadata': {'name': 'ns'}})
        claim = {'apiVersion': 'resource.k8s.io/v1',
                 'kind': 'ResourceClaim',
                 'metadata': {'name': 'c', 'namespace': 'ns'},
                 'spec': {'devices': {'requests': [{'name': 'r', 'exactly': {
                     'deviceClassName': 'gpu.amd.com'}}]}}}
        made = _raw(self.api.create_namespaced_resource_claim(
            'ns', claim, _preload_content=False))
        self.assertTrue(made['metadata']['uid'])
        # a write of the main resource cannot set the status
        made['status'] = {'allocation': {'devices': {'results': []}}}
        kept = _raw(self.api.replace_namespaced_resource_claim(
            'c', 'ns', made, _preload_content=False))
        self.assertNotIn('status', kept)
        kept['status'] = {'allocation': {'devices': {'results': [
            {'request': 'r', 'driver': 'gpu.amd.com', 'pool': 'n1',
             'device': 'gpu-0'}]}}}
        self.api.replace_namespaced_resource_claim_status(
            'c', 'ns', kept, _preload_content=False)
        read = _raw(self.api.read_namespaced_resource_claim(
            'c', 'ns', _preload_content=False))
        self.assertEqual('gpu-0', read['status']['allocation']['devices'][
            'results'][0]['device'])

    def test_device_classes(self):
        self.api.create_device_class({
            'apiVersion': 'resource.k8s.io/v1', 'kind': 'DeviceClass',
            'metadata': {'name': 'gpu.amd.com'}, 'spec': {}})
        got = _raw(self.api.list_device_class(_preload_content=False))
        self.assertEqual(['gpu.amd.com'], [c['metadata']['name']
                                           for c in got['items']])


def _counter_set(name, counters=('xcds', 'memory')):
    return {'name': name, 'counters': {c: {'value': '8'} for c in counters}}


def _consumer(name, counter_set, counters=('xcds',)):
    return {'name': name, 'consumesCounters': [{
        'counterSet': counter_set,
        'counters': {c: {'value': '1'} for c in counters}}]}


class TestVersions(testtools.TestCase):
    """``/version`` and the ResourceSlice rules of the release it says."""

    def server(self, version):
        k8s = self.useFixture(kubeclient.ApiServerFixture(version=version))
        return k8s, k8s.resource

    def test_version_answers_what_it_was_told(self):
        for version in ((1, 34), (1, 35), (1, 37)):
            k8s, _api = self.server(version)
            info = client.VersionApi(k8s.api_client).get_code()
            self.assertEqual(('1', str(version[1])), (info.major,
                                                      info.minor))
            self.assertEqual('v1.%d.0-standin' % version[1],
                             info.git_version)
        # and it may be upgraded while it serves
        k8s.server.store.version = (1, 38)
        self.assertEqual('38', client.VersionApi(
            k8s.api_client).get_code().minor)

    def test_the_default_is_1_36(self):
        k8s = self.useFixture(kubeclient.ApiServerFixture())
        self.assertEqual('36', client.VersionApi(
            k8s.api_client).get_code().minor)

    def test_1_34_accepts_devices_with_their_counters(self):
        _k8s, api = self.server((1, 34))
        stored = _raw(api.create_resource_slice(_slice(
            'a', devices=[_consumer('d', 'c')],
            sharedCounters=[_counter_set('c')]), _preload_content=False))
        self.assertEqual('c', stored['spec']['sharedCounters'][0]['name'])

    def test_1_34_resolves_counter_sets_in_the_same_slice_only(self):
        _k8s, api = self.server((1, 34))
        api.create_resource_slice(_slice('counters', sharedCounters=[
            _counter_set('c')]))
        for body, words in (
                (_slice('a', devices=[_consumer('d', 'c')]),
                 "'c': must reference a counterSet"),
                (_slice('b', devices=[_consumer('d', 'c', ('cus',))],
                        sharedCounters=[_counter_set('c')]),
                 "'cus': must reference a counter")):
            err = self.assertRaises(exceptions.ApiException,
                                    api.create_resource_slice, body)
            self.assertEqual(422, err.status)
            self.assertIn(words, err.body)

    def test_1_34_counter_limits(self):
        _k8s, api = self.server((1, 34))
        # 32 counters over all sets fit, 33 do not
        sets = [_counter_set('c%d' % n, ('a', 'b')) for n in range(16)]
        api.create_resource_slice(_slice('ok', sharedCounters=sets))
        err = self.assertRaises(
            exceptions.ApiException, api.create_resource_slice,
            _slice('big', sharedCounters=sets + [_counter_set('x', ('a',))]))
        self.assertIn('must not exceed 32', err.body)
        # 1024 consumed counters fit, 1025 do not
        many = tuple('k%d' % n for n in range(32))
        devices = [_consumer('d%d' % n, 'c', many) for n in range(32)]
        api.create_resource_slice(_slice('full', devices=devices,
                                         sharedCounters=[
                                             _counter_set('c', many)]))
        devices.append(_consumer('d32', 'c', many[:1]))
        err = self.assertRaises(exceptions.ApiException,
                                api.create_resource_slice, _slice(
                                    'over', devices=devices,
                                    sharedCounters=[_counter_set('c', many)]))
        self.assertIn('must not exceed 1024', err.body)
        # 128 devices per slice, with counters or not
        api.create_resource_slice(_slice('d', devices=[
            _consumer('d%d' % n, 'c') for n in range(128)],
            sharedCounters=[_counter_set('c')]))

    def test_1_35_limits(self):
        _k8s, api = self.server((1, 35))
        err = self.assertRaises(exceptions.ApiException,
                                api.create_resource_slice, _slice(
                                    'a', devices=[_consumer('d', 'c')],
                                    sharedCounters=[_counter_set('c')]))
        self.assertIn('only one of', err.body)
        # devices may use counter sets of another slice of the pool
        api.create_resource_slice(_slice('c', sharedCounters=[
            _counter_set('c%d' % n) for n in range(8)]))
        api.create_resource_slice(_slice('d', devices=[
            _consumer('d%d' % n, 'c0') for n in range(64)]))
        for body, words in (
                (_slice('e', devices=[_consumer('d%d' % n, 'c0')
                                      for n in range(65)]),
                 'at most 64'),
                (_slice('f', devices=[{'name': 'd%d' % n}
                                      for n in range(129)]),
                 'at most 128'),
                (_slice('g', sharedCounters=[_counter_set('c%d' % n)
                                             for n in range(9)]),
                 'at most 8')):
            err = self.assertRaises(exceptions.ApiException,
                                    api.create_resource_slice, body)
            self.assertEqual(422, err.status)
            self.assertIn(words, err.body)
        api.create_resource_slice(_slice('h', devices=[
            {'name': 'd%d' % n} for n in range(128)]))

    def test_an_upgrade_refuses_the_old_layout_on_update(self):
        k8s, api = self.server((1, 34))
        made = _raw(api.create_resource_slice(_slice(
            'a', devices=[_consumer('d', 'c')],
            sharedCounters=[_counter_set('c')]), _preload_content=False))
        k8s.server.store.version = (1, 35)
        err = self.assertRaises(exceptions.ApiException,
                                api.replace_resource_slice, 'a', made)
        self.assertEqual(422, err.status)
        # deleting it is always possible
        api.delete_resource_slice('a')
