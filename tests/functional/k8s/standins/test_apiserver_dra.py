"""resource.k8s.io/v1 in the API server stand-in (DRA objects).

The DRA tests rely on these semantics of the real server: cluster-scoped
ResourceSlices and DeviceClasses, namespaced ResourceClaims with a
status subresource, ResourceSlice field selectors, the 1.35 rule that a
slice holds devices or counters but not both, an immutable driver, each
release's default feature gates and the fields of disabled gates dropped
on write (on create always, on update unless the old object used them),
quantities stored as kube-apiserver stores them, and dry runs.
"""

from __future__ import annotations

import json

import testtools
from kubernetes import client
from kubernetes.client import exceptions

from tests.functional.fixtures import apidra
from tests.functional.fixtures import kubeclient
from tests.unit.k8s.api import quantity_table

PARTITIONABLE = {'DRAPartitionableDevices': True}


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
        self.k8s.server.store.set_release((1, 36), {
            'DRAPartitionableDevices': False})
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
        # a create resets the status, as the real strategy does
        claim['status'] = {'allocation': {'devices': {'results': []}}}
        made = _raw(self.api.create_namespaced_resource_claim(
            'ns', claim, _preload_content=False))
        self.assertTrue(made['metadata']['uid'])
        self.assertNotIn('status', made)
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

    def server(self, version, gates=PARTITIONABLE):
        k8s = self.useFixture(kubeclient.ApiServerFixture(
            version=version, gates=gates))
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
        k8s.server.store.set_release((1, 38))
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
        k8s.server.store.set_release((1, 35), PARTITIONABLE)
        err = self.assertRaises(exceptions.ApiException,
                                api.replace_resource_slice, 'a', made)
        self.assertEqual(422, err.status)
        # deleting it is always possible
        api.delete_resource_slice('a')


def _shared_device(name='s'):
    return {'name': name, 'allowMultipleAllocations': True, 'capacity': {
        'memory': {'value': '192Gi', 'requestPolicy': {
            'default': '1Gi', 'validRange': {'min': '1Gi'}}}}}


class TestReleaseDefaults(testtools.TestCase):
    """Each release drops the fields of the gates it has off, silently,
    as its registry strategies do."""

    def server(self, version, gates=None):
        k8s = self.useFixture(kubeclient.ApiServerFixture(
            version=version, gates=gates))
        return k8s, k8s.resource

    def stored(self, api, body):
        return _raw(api.create_resource_slice(body, _preload_content=False))

    def test_the_gates_of_each_release(self):
        for version, on in (((1, 34), False), ((1, 35), False),
                            ((1, 36), True), ((1, 37), True)):
            gates = apidra.default_gates(version)
            self.assertEqual(on, gates['DRAPartitionableDevices'], version)
            self.assertEqual(on, gates['DRAConsumableCapacity'], version)
            self.assertTrue(gates['DRAPrioritizedList'], version)

    def test_1_34_and_1_35_drop_counters_and_consumable_capacity(self):
        for version in ((1, 34), (1, 35)):
            _k8s, api = self.server(version)
            stored = self.stored(api, _slice('a', devices=[
                _consumer('d', 'c'), _shared_device()],
                sharedCounters=[_counter_set('c')]))
            spec = stored['spec']
            self.assertNotIn('sharedCounters', spec, version)
            consumer, shared = spec['devices']
            self.assertEqual({'name': 'd'}, consumer)
            self.assertNotIn('allowMultipleAllocations', shared)
            # the capacity stays, its policy goes
            self.assertEqual({'memory': {'value': '192Gi'}},
                             shared['capacity'])
            # and what is read back is the same
            self.assertEqual(spec, _raw(api.read_resource_slice(
                'a', _preload_content=False))['spec'])

    def test_1_36_keeps_them(self):
        _k8s, api = self.server((1, 36))
        body = _slice('a', devices=[_consumer('d', 'c'), _shared_device()])
        self.assertEqual(body['spec']['devices'],
                         self.stored(api, body)['spec']['devices'])

    def test_an_update_keeps_what_the_old_slice_used(self):
        k8s, api = self.server((1, 36))
        made = self.stored(api, _slice('a', devices=[_consumer('d', 'c')]))
        # the gate is turned off: a new slice loses the fields, an update
        # of one that used them keeps them (dropDisabledFields(new, old))
        k8s.server.store.set_release((1, 36), {
            'DRAPartitionableDevices': False})
        self.assertNotIn('consumesCounters', self.stored(api, _slice(
            'b', devices=[_consumer('d', 'c')]))['spec']['devices'][0])
        made['spec']['devices'].append(_consumer('e', 'c'))
        kept = _raw(api.replace_resource_slice('a', made,
                                               _preload_content=False))
        self.assertEqual(['c', 'c'], [d['consumesCounters'][0]['counterSet']
                                      for d in kept['spec']['devices']])

    def test_claims_lose_capacity_requests_and_shares(self):
        k8s, api = self.server((1, 34))
        k8s.api.create_namespace({'metadata': {'name': 'ns'}})
        claim = {'apiVersion': 'resource.k8s.io/v1',
                 'kind': 'ResourceClaim',
                 'metadata': {'name': 'c', 'namespace': 'ns'},
                 'spec': {'devices': {'requests': [{'name': 'r', 'exactly': {
                     'deviceClassName': 'share.gpu.amd.com',
                     'capacity': {'requests': {'memory': '1Gi'}}}}]}}}
        made = _raw(api.create_namespaced_resource_claim(
            'ns', claim, _preload_content=False))
        self.assertEqual({'deviceClassName': 'share.gpu.amd.com'},
                         made['spec']['devices']['requests'][0]['exactly'])
        made['status'] = {'allocation': {'devices': {'results': [{
            'request': 'r', 'driver': 'gpu.amd.com', 'pool': 'n',
            'device': 'd', 'shareID': 'a-b',
            'consumedCapacity': {'memory': '1Gi'}}]}}}
        stored = _raw(api.replace_namespaced_resource_claim_status(
            'c', 'ns', made, _preload_content=False))
        self.assertEqual({'request': 'r', 'driver': 'gpu.amd.com',
                          'pool': 'n', 'device': 'd'},
                         stored['status']['allocation']['devices'][
                             'results'][0])

    def test_device_classes_lose_the_extended_resource_name(self):
        for version, kept in (((1, 35), False), ((1, 36), True)):
            _k8s, api = self.server(version)
            made = _raw(api.create_device_class({
                'apiVersion': 'resource.k8s.io/v1', 'kind': 'DeviceClass',
                'metadata': {'name': 'gpu.amd.com'},
                'spec': {'extendedResourceName': 'amd.com/gpu'}},
                _preload_content=False))
            self.assertEqual(kept, 'extendedResourceName' in made['spec'])


class TestQuantities(testtools.TestCase):
    """Quantities come back as kube-apiserver returns them (the table of
    real canonicalisations, echoed texts included)."""

    def setUp(self):
        super().setUp()
        self.k8s = self.useFixture(kubeclient.ApiServerFixture())
        self.api = self.k8s.resource

    def test_slices_store_what_the_real_server_stores(self):
        pairs = quantity_table.SERVED
        devices = [{'name': 'd%d' % n, 'capacity': {'q': {'value': sent}}}
                   for n, (sent, _want) in enumerate(pairs)]
        made = []
        for start in range(0, len(devices), 100):
            made.extend(_raw(self.api.create_resource_slice(_slice(
                's%d' % start, devices=devices[start:start + 100]),
                _preload_content=False))['spec']['devices'])
        listed = [d for s in _raw(self.api.list_resource_slice(
            _preload_content=False))['items'] for d in s['spec']['devices']]
        want = [w for _s, w in pairs]
        self.assertEqual(want, [d['capacity']['q']['value'] for d in made])
        self.assertEqual(sorted(want), sorted(
            d['capacity']['q']['value'] for d in listed))

    def test_every_quantity_field(self):
        made = _raw(self.api.create_resource_slice(_slice('a', devices=[{
            'name': 'd', 'allowMultipleAllocations': True, 'capacity': {
                'memory': {'value': '196608Mi', 'requestPolicy': {
                    'default': '1024Mi', 'validValues': ['2048Mi'],
                    'validRange': {'min': '1024Mi', 'max': '4096Mi',
                                   'step': '1024Mi'}}}},
            'consumesCounters': [{'counterSet': 'c', 'counters': {
                'memory': {'value': '24576Mi'}}}]}]), _preload_content=False))
        device = made['spec']['devices'][0]
        self.assertEqual({'value': '192Gi', 'requestPolicy': {
            'default': '1Gi', 'validValues': ['2Gi'],
            'validRange': {'min': '1Gi', 'max': '4Gi', 'step': '1Gi'}}},
            device['capacity']['memory'])
        self.assertEqual('24Gi', device['consumesCounters'][0]['counters'][
            'memory']['value'])
        counters = _raw(self.api.create_resource_slice(_slice(
            'b', sharedCounters=[{'name': 'c', 'counters': {
                'memory': {'value': '196608Mi'},
                'xcds': {'value': '8000m'}}}]),
            _preload_content=False))['spec']['sharedCounters'][0]
        self.assertEqual({'memory': {'value': '192Gi'},
                          'xcds': {'value': '8'}}, counters['counters'])

    def test_claims_and_templates(self):
        self.k8s.api.create_namespace({'metadata': {'name': 'ns'}})
        spec = {'devices': {'requests': [
            {'name': 'a', 'exactly': {'deviceClassName': 'x', 'capacity': {
                'requests': {'memory': '20480Mi', 'computeUnits': '76'}}}},
            {'name': 'b', 'firstAvailable': [{
                'name': 's', 'deviceClassName': 'x', 'capacity': {
                    'requests': {'memory': '1000'}}}]}]}}
        template = _raw(self.api.create_namespaced_resource_claim_template(
            'ns', {'metadata': {'name': 't'}, 'spec': {'spec': spec}},
            _preload_content=False))
        requests = template['spec']['spec']['devices']['requests']
        self.assertEqual({'memory': '20Gi', 'computeUnits': '76'},
                         requests[0]['exactly']['capacity']['requests'])
        self.assertEqual({'memory': '1k'}, requests[1]['firstAvailable'][0][
            'capacity']['requests'])
        claim = _raw(self.api.create_namespaced_resource_claim(
            'ns', {'metadata': {'name': 'c'}, 'spec': spec},
            _preload_content=False))
        claim['status'] = {'allocation': {'devices': {'results': [{
            'request': 'a', 'driver': 'd', 'pool': 'p', 'device': 'x',
            'shareID': 'a-b', 'consumedCapacity': {
                'memory': '20480Mi', 'computeUnits': '76000m'}}]}}}
        stored = _raw(self.api.replace_namespaced_resource_claim_status(
            'c', 'ns', claim, _preload_content=False))
        self.assertEqual({'memory': '20Gi', 'computeUnits': '76'},
                         stored['status']['allocation']['devices'][
                             'results'][0]['consumedCapacity'])

    def test_invalid_quantities_are_refused(self):
        for text in ('1.1.M', '0.1mi', 'aoeu'):
            err = self.assertRaises(
                exceptions.ApiException, self.api.create_resource_slice,
                _slice('a', devices=[{'name': 'd', 'capacity': {
                    'q': {'value': text}}}]))
            self.assertEqual(400, err.status)
            self.assertIn('quantities must match', err.body)
        self.assertEqual([], _raw(self.api.list_resource_slice(
            _preload_content=False))['items'])

    def test_the_same_values_in_other_text_change_nothing(self):
        made = _raw(self.api.create_resource_slice(_slice('a', devices=[{
            'name': 'd', 'capacity': {'memory': {'value': '24Gi'}}}]),
            _preload_content=False))
        before = self.k8s.server.store.writes.get('resourceslices')
        made['spec']['devices'][0]['capacity']['memory']['value'] = \
            '24576Mi'
        again = _raw(self.api.replace_resource_slice(
            'a', made, _preload_content=False))
        self.assertEqual(made['metadata']['resourceVersion'],
                         again['metadata']['resourceVersion'])
        self.assertEqual(before, self.k8s.server.store.writes.get(
            'resourceslices'))


class TestDryRun(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.k8s = self.useFixture(kubeclient.ApiServerFixture(
            version=(1, 35)))
        self.api = self.k8s.resource

    def test_a_dry_run_create_stores_nothing_and_says_what_would_be(self):
        body = _slice('', devices=[_consumer('d', 'c'), _shared_device()])
        body['metadata'] = {'generateName': 'probe-'}
        answer = _raw(self.api.create_resource_slice(
            body, dry_run='All', _preload_content=False))
        self.assertTrue(answer['metadata']['name'].startswith('probe-'))
        self.assertNotIn('resourceVersion', answer['metadata'])
        # 1.35 by default drops what its gates keep
        self.assertEqual({'name': 'd'}, answer['spec']['devices'][0])
        self.assertEqual([], _raw(self.api.list_resource_slice(
            _preload_content=False))['items'])
        self.assertEqual({}, self.k8s.server.store.writes)

    def test_dry_run_updates_deletes_and_refusals(self):
        made = _raw(self.api.create_resource_slice(
            _slice('a'), _preload_content=False))
        writes = dict(self.k8s.server.store.writes)
        changed = _slice('a', devices=[{'name': 'd'}])
        changed['metadata']['resourceVersion'] = \
            made['metadata']['resourceVersion']
        answer = _raw(self.api.replace_resource_slice(
            'a', changed, dry_run='All', _preload_content=False))
        self.assertEqual([{'name': 'd'}], answer['spec']['devices'])
        self.api.delete_resource_slice('a', dry_run='All')
        self.assertEqual(made, _raw(self.api.read_resource_slice(
            'a', _preload_content=False)))
        self.assertEqual(writes, self.k8s.server.store.writes)
        # what the server refuses, it refuses in a dry run too
        for body, status in (
                (_slice('a'), 409),
                (_slice('b', devices=[_consumer('d', 'c')],
                        sharedCounters=[_counter_set('c')]), 201)):
            if status == 201:
                # 1.35's defaults drop the counters: then it is valid
                self.api.create_resource_slice(body, dry_run='All')
                continue
            err = self.assertRaises(exceptions.ApiException,
                                    self.api.create_resource_slice, body,
                                    dry_run='All')
            self.assertEqual(status, err.status)
        self.k8s.server.store.set_release((1, 35), PARTITIONABLE)
        err = self.assertRaises(
            exceptions.ApiException, self.api.create_resource_slice,
            _slice('c', devices=[_consumer('d', 'c')],
                   sharedCounters=[_counter_set('c')]), dry_run='All')
        self.assertIn('only one of', err.body)
        err = self.assertRaises(exceptions.ApiException,
                                self.api.create_resource_slice,
                                _slice('d'), dry_run='Some')
        self.assertEqual(400, err.status)
