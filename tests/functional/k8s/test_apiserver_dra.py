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
