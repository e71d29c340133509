"""The typed list decoders give what the reference decoders give.

A seeded cluster with hostile objects among normal ones (unreadable and
crafted annotations, huge annotation values, the same pod twice, pods on
unknown nodes, fields of the wrong type, invalid JSON) is listed through the
watchers' typed page decoders and through the reference path (pages as
dicts, :func:`cacheentry.decode_pod` / :func:`decode_node`): the entries,
the views, the indexes and the decisions must be the same.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any
from unittest import mock

import fixtures
import hypothesis
from hypothesis import strategies
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.fit import entry as cacheentry
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import pages as cachelist
from amdgpu_virt.k8s.scheduler.cache import watching
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing
from amdgpu_virt.sharing.hami import pods as hami_pods
from amdgpu_virt.sharing.hami import register as hami_register

#: the one-device value as a single match (the reader before the tail
#: memo), the reference of decode_one_device
_ONE_DEVICE = re.compile(
    r'([^,:;]+),([^,:;]+),([0-9]{1,9}),([0-9]{1,9}):?;?')

GOOD_DEVICE = {'id': 'g', 'index': 0, 'count': 10, 'devmem': 65536,
               'devcore': 304, 'type': 'AMD Instinct MI300X', 'numa': 0,
               'mode': 'hami-core', 'health': True, 'devicevendor': 'amd',
               'custominfo': {'pciBDF': '0000:83:00.0'}}

#: registrations the typed decoder must read as the full one does, or
#: leave to it
HOSTILE_REGISTRATIONS = [
    '[]', 'null', ' [ ] ', '[null]', '[1]', '{}', '[{}]', '[{"id": null}]',
    '[{"ID": "g", "Count": 3}]', '[{"id": "g", "id": "h"}]',
    '[{"id": "g", "count": 2147483648}]', '[{"id": "g", "count": -1}]',
    '[{"id": "g", "index": 18446744073709551615}]',
    '[{"id": "g", "index": 18446744073709551616}]',
    '[{"id": "g", "index": 9223372036854775808}]',
    '[{"id": "g", "count": 1.0}]', '[{"id": "g", "health": 1}]',
    '[{"id": "g", "numa": -9223372036854775808}]',
    '[{"id": "g", "custominfo": {"cuPerWGP": 2, "x": [1, 2.5, null]}}]',
    '[{"id": "g", "custominfo": null}]', '[{"id": "g", "extra": 1}]',
    '[{"id": "g", "count": NaN}]', '[{"id": "\\ud800"}]', '[1, 2',
    '\u00a0[]', 'g0,10,65536,304,AMD,0,true:', '[' + '[' * 5000 + ']' * 5001,
    json.dumps([GOOD_DEVICE, dict(GOOD_DEVICE, id='h', index=1)]),
]


def _reference_register(value: str) -> Any:
    with mock.patch.object(hami_register, '_decode_typed',
                           return_value=None):
        return _outcome(hami.decode_node_register, value)


def _outcome(func: Any, *args: Any) -> Any:
    try:
        return func(*args)
    except exception.HamiProtocolError as err:
        return 'error: %s' % err


class RegistrationTest(testtools.TestCase):

    def test_typed_registration_is_the_full_decoders(self) -> None:
        self.assertEqual(
            [name for name, _kind in hami_register._DEVICE_FIELDS],
            [f.name for f in hami_register.dataclasses.fields(
                hami.DeviceInfo)])
        typed = []
        for value in HOSTILE_REGISTRATIONS:
            got = _outcome(hami.decode_node_register, value)
            self.assertEqual(_reference_register(value), got, value)
            if hami_register._decode_typed(value) is not None:
                typed.append(value)
        # the shapes HAMi writes take the typed way, the others the full
        # one (which says what is wrong)
        self.assertEqual(8, len(typed))
        self.assertIn(HOSTILE_REGISTRATIONS[-1], typed)
        self.assertNotIn('[{"ID": "g", "Count": 3}]', typed)


POD_DEVICE_VALUES = [
    'a,AMD,1,2', 'a,AMD,1,2:', 'a,AMD,1,2;', 'a,AMD,1,2:;', 'a,AMD,007,2:;',
    'a,AMD,999999999,2:;', 'a,AMD,2147483647,2:;', 'a,AMD,2147483648,2:;',
    'a,AMD,1,2,extra:;', 'a,AMD,1,2:;;', ';a,AMD,1,2:;', 'a,AMD,1,2::;',
    'a,AMD,\u0661,2:;', 'a,AMD,-1,2:;', 'a,AMD,+1,2:;', ',AMD,1,2:;',
    'a,,1,2:;', 'a,AMD,1:;', 'a:;', 'a,AMD,1,2:b,AMD,3,4:;c,AMD,5,6:;',
    'a,AMD,1,2:;;', 'a,AMD, 1,2:;', 'a,AMD,1,2;x', '\u00e9,AMD,1,2:;',
]


class PodDevicesTest(testtools.TestCase):

    def test_resource_version_as_the_number_int_reads(self) -> None:
        def reference(value: Any) -> int | None:
            try:
                return int(str(value))
            except (TypeError, ValueError):
                return None

        for value in ('0', '12', '007', '\u0663', '+5', '-5', ' 7 ', '1_0',
                      '\u00b2', '9' * 18, '9' * 19, '9' * 5000, '', 'x',
                      None, 12, 1.5, True):
            self.assertEqual(reference(value), cacheentry.rv_of(value),
                             repr(value)[:40])

    def test_one_device_way_is_the_general_one(self) -> None:
        for value in POD_DEVICE_VALUES:
            self.assertEqual(
                _outcome(hami_pods._decode_containers, value, 'k'),
                _outcome(hami_pods._decode_pod_devices, value, 'k'), value)
            one = hami.decode_one_device(value)
            if one is not None:
                self.assertEqual(hami_pods._decode_containers(value, 'k'),
                                 one, value)
        # what most pods carry takes the one-device way
        self.assertIsNotNone(hami.decode_one_device('a,AMD,1,2:;'))
        self.assertIsNone(hami.decode_one_device('a,AMD,1,2:b,AMD,3,4:;'))

    @hypothesis.settings(max_examples=400, deadline=None)
    @hypothesis.given(strategies.lists(strategies.sampled_from(
        ['a', 'G', ',', ':', ';', '0', '7', '12345', '9' * 9, '9' * 10,
         ' ', '\n', 'AMD']), max_size=12).map(''.join))
    def test_one_device_way_reads_what_one_match_reads(self, value: str
                                                       ) -> None:
        # the tail is read once per text: the UUID must still be checked
        # on each value, whatever tail the memo holds already
        one = _ONE_DEVICE.fullmatch(value)
        expected = None if one is None else ((hami.ContainerDevice(
            one[1], one[2], int(one[3]), int(one[4])),),)
        self.assertEqual(expected, hami.decode_one_device(value), value)
        self.assertEqual(expected, hami.decode_one_device(value), value)

    def test_one_device_memo_is_bounded(self) -> None:
        self.useFixture(fixtures.MonkeyPatch(
            'amdgpu_virt.sharing.hami.pods._TAILS', {}))
        for n in range(hami_pods._TAIL_ENTRIES + 10):
            value = 'g,AMD-%d,1,2;' % n
            self.assertEqual(((hami.ContainerDevice('g', 'AMD-%d' % n, 1,
                                                    2),),),
                             hami.decode_one_device(value))
        self.assertLessEqual(len(hami_pods._TAILS), hami_pods._TAIL_ENTRIES)
        # a long tail is read, not kept
        long_type = 'T' * hami_pods._TAIL_CHARS
        self.assertEqual(long_type, hami.decode_one_device(
            'g,%s,1,2' % long_type)[0][0].type)
        self.assertNotIn('%s,1,2' % long_type, hami_pods._TAILS)


# --- a seeded cluster with hostile objects -----------------------------------

def _device(name: str, number: int) -> dict[str, Any]:
    return dict(GOOD_DEVICE, id='%s-gpu%d' % (name, number), index=number,
                numa=number // 4)


def _nodes(rng: random.Random, count: int) -> list[dict[str, Any]]:
    nodes = []
    for n in range(count):
        name = 'node-%03d' % n
        devices = [_device(name, g) for g in range(rng.choice((1, 2, 8)))]
        meta: dict[str, Any] = {'name': name, 'annotations': {
            hami.NODE_REGISTER: json.dumps(devices), 'other': 'x' * 100}}
        obj: dict[str, Any] = {'metadata': meta, 'status': {'capacity': {
            'amd.com/gpu': str(len(devices)), 'cpu': '64'}, 'allocatable': {
                'cpu': rng.choice(('64', '63500m', '96')),
                'memory': rng.choice(('512Gi', '1Ti', '1000G'))}}}
        pick = rng.random()
        if pick < 0.05:
            meta['annotations'][hami.NODE_REGISTER] = rng.choice(
                HOSTILE_REGISTRATIONS)
        elif pick < 0.08:
            obj['status']['capacity']['amd.com/gpu'] = '0'
        elif pick < 0.1:
            del meta['annotations'][hami.NODE_REGISTER]
        elif pick < 0.12:
            devices[0]['devcore'] = 0     # an unusable device is skipped
            devices.append(devices[-1])   # and one registered twice
            meta['annotations'][hami.NODE_REGISTER] = json.dumps(devices)
        elif pick < 0.14:
            meta['annotations'][hami.NODE_REGISTER] = hami.\
                encode_node_devices_legacy(hami.decode_node_register(
                    json.dumps(devices)))
        elif pick < 0.15:
            obj['status'] = None
        elif pick < 0.17:
            obj['status']['allocatable'] = rng.choice((
                {'cpu': 'lots', 'memory': '1Gi'}, {'cpu': '8'}, None,
                {'cpu': '-1', 'memory': '1Gi'}))
        nodes.append(obj)
    return nodes


def _pods(rng: random.Random, nodes: list[dict[str, Any]],
          count: int) -> list[dict[str, Any]]:
    names = [n['metadata']['name'] for n in nodes] + ['unknown-node']
    pods = []
    for n in range(count):
        node = rng.choice(names)
        gpu = '%s-gpu%d' % (node, rng.randrange(2))
        cores = rng.choice((3, 30, 76, 152, 304))
        annotations: dict[str, Any] = {
            hami.DEVICES_ALLOCATED: '%s,AMD,%d,%d:;' % (gpu, 1024, cores),
            'kubectl.kubernetes.io/last-applied-configuration': '{}'}
        meta: dict[str, Any] = {'name': 'p%d' % n, 'namespace': 'ns%d' % (
            n % 3), 'uid': 'uid-%d' % n, 'resourceVersion': str(n + 1),
            'annotations': annotations}
        spec: dict[str, Any] = {'nodeName': node, 'schedulerName': 'x',
                                'containers': [{'name': 'c', 'resources': {
                                    'limits': {'amd.com/gpu': '1'},
                                    'requests': {
                                        'cpu': rng.choice(('1', '500m',
                                                           '2.5')),
                                        'memory': rng.choice((
                                            '1Gi', '512M', '3e9'))}}}]}
        obj: dict[str, Any] = {'metadata': meta, 'spec': spec,
                               'status': {'phase': 'Running'}}
        _host_fields(rng, spec)
        pick = rng.random()
        if pick < 0.2:
            del annotations[hami.DEVICES_ALLOCATED]   # no GPU
        elif pick < 0.25:
            annotations[hami.CU_ALLOCATED] = json.dumps({gpu: '0-%d' % (
                cores - 1)})
        elif pick < 0.28:
            annotations[hami.CU_ALLOCATED] = rng.choice((
                '{"%s": "9-0"}' % gpu, '[]', '{', '{"a": 1}'))
        elif pick < 0.31:
            annotations[hami.DEVICES_ALLOCATED] = rng.choice((
                'g0,AMD:;', 'x' * 70000, '', ';;;', '%s,AMD,-1,2:;' % gpu))
        elif pick < 0.34:
            annotations[hami.DEVICES_TO_ALLOCATE] = annotations.pop(
                hami.DEVICES_ALLOCATED)
            del spec['nodeName']
            annotations[hami.VGPU_NODE] = node
        elif pick < 0.37:
            obj['status']['phase'] = rng.choice(('Succeeded', 'Failed'))
        elif pick < 0.40:
            annotations['huge'] = 'y' * 200000
        elif pick < 0.43 and pods:
            # the same pod (and uid) twice, as a broken server might send
            twin = json.loads(json.dumps(rng.choice(pods)))
            twin.setdefault('metadata', {}).setdefault(
                'annotations', {}).pop(hami.DEVICES_ALLOCATED, None)
            obj = twin if rng.random() < 0.5 else json.loads(
                json.dumps(pods[-1]))
        elif pick < 0.45:
            meta['resourceVersion'] = 'not-a-number'
        elif pick < 0.46:
            del obj['metadata']
        elif pick < 0.47:
            spec['nodeName'] = ''
        pods.append(obj)
    return pods


def _host_fields(rng: random.Random, spec: dict[str, Any]) -> None:
    """What else a pod may ask of its host, hostile values included."""
    pick = rng.random()
    if pick < 0.1:
        spec['initContainers'] = [
            {'name': 'i', 'resources': {'requests': {'cpu': '4'}}},
            {'name': 's', 'restartPolicy': 'Always', 'resources': {
                'requests': {'cpu': '1', 'memory': '1Gi'}}}]
    elif pick < 0.15:
        spec['overhead'] = {'cpu': '250m', 'memory': '120Mi'}
    elif pick < 0.2:
        spec['resources'] = {'requests': {'cpu': '3'}}
    elif pick < 0.23:
        spec['containers'][0]['resources']['requests'] = rng.choice((
            {'cpu': 'x'}, {'memory': '-1'}, {'cpu': 2}, None,
            {'cpu': '1' * 70}))
    elif pick < 0.25:
        spec['containers'].append({'name': 'plain'})


def _page(items: list[dict[str, Any]], token: str = '') -> bytes:
    meta: dict[str, Any] = {'resourceVersion': '77'}
    if token:
        meta['continue'] = token
    return json.dumps({'kind': 'List', 'metadata': meta,
                       'items': items}).encode()


class _Pages:
    def __init__(self, pages: list[bytes]) -> None:
        self.pages = pages

    def __call__(self, **kwargs: Any) -> Any:
        return mock.Mock(data=self.pages[int(kwargs.get('_continue') or 0)])


def _paged(items: list[dict[str, Any]], size: int) -> _Pages:
    chunks = [items[i:i + size] for i in range(0, len(items), size)] or [[]]
    return _Pages([_page(chunk, str(n + 1) if n + 1 < len(chunks) else '')
                   for n, chunk in enumerate(chunks)])


class ClusterTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.logs = self.useFixture(fixtures.FakeLogger())

    def _listed(self, nodes: list[dict[str, Any]],
                pods: list[dict[str, Any]]) -> schedcache.ClusterCache:
        cache = schedcache.ClusterCache(mix=packing.Mix())
        api = mock.Mock(list_node=_paged(nodes, 7),
                        list_pod_for_all_namespaces=_paged(pods, 50))
        for watcher in watching.watchers(cache, api, pause_collector=True):
            self.assertEqual('77', watcher._list())
        return cache

    def _reference(self, nodes: list[dict[str, Any]],
                   pods: list[dict[str, Any]]) -> schedcache.ClusterCache:
        cache = schedcache.ClusterCache(mix=packing.Mix())
        cache.replace_nodes(json.loads(json.dumps(nodes)))
        cache.replace_pods(json.loads(json.dumps(pods)), 77)
        return cache

    def _same(self, one: schedcache.ClusterCache,
              other: schedcache.ClusterCache, names: list[str]) -> None:
        self.assertEqual(one._nodes, other._nodes)
        self.assertEqual(one._pods, other._pods)
        self.assertEqual(one.views(names), other.views(names))
        self.assertEqual(one.index_snapshot(), other.index_snapshot())
        self.assertEqual(one.index.problems, other.index.problems)
        self.assertEqual([one.host_free(n) for n in names],
                         [other.host_free(n) for n in names])
        rng = random.Random(5)
        for number in range(40):
            pod = {'metadata': {'name': 'q%d' % number, 'namespace': 'new',
                                'annotations': {}},
                   'spec': {'containers': [{'name': 'c', 'resources': {
                       'limits': {'amd.com/gpu': str(rng.choice((1, 2))),
                                  'amd.com/gpucores': str(rng.choice(
                                      (5, 25, 50, 100)))}}}]}}
            request = fit.pod_request(pod)
            key = 'new/q%d' % number
            first = one.decide_and_reserve(key, request, names)
            second = other.decide_and_reserve(key, request, names)
            self.assertEqual(first.fit, second.fit)
            self.assertEqual(first.reasons(), second.reasons())

    def test_seeded_clusters_with_hostile_objects(self) -> None:
        for seed in range(3):
            rng = random.Random(seed)
            nodes = _nodes(rng, 40)
            pods = _pods(rng, nodes, 400)
            names = [n['metadata']['name'] for n in nodes] + ['unknown-node']
            listed = self._listed(nodes, pods)
            reference = self._reference(nodes, pods)
            # the hostile objects are there: problems, skipped pods
            self.assertTrue(listed.index.problems)
            self.assertLess(listed.pod_count(), len(pods))
            self._same(listed, reference, names)

    def test_odd_pages_take_the_reference_way(self) -> None:
        rng = random.Random(9)
        nodes = _nodes(rng, 10)
        pods = _pods(rng, nodes, 60)
        names = [n['metadata']['name'] for n in nodes]
        odd_pods = json.loads(json.dumps(pods))
        odd_pods[3]['metadata']['namespace'] = None     # 'None/p3'
        odd_pods[5].setdefault('metadata', {})['resourceVersion'] = 12
        odd_pods[7]['spec'] = {'nodeName': 5}           # not a string
        odd_nodes = json.loads(json.dumps(nodes))
        odd_nodes[2]['status'] = {'capacity': {'amd.com/gpu': 0}}
        odd_nodes[4]['metadata']['annotations'][hami.NODE_REGISTER] = 7
        self._same(self._listed(odd_nodes, odd_pods),
                   self._reference(odd_nodes, odd_pods), names)
        self.assertIn('None/p3', self._listed(odd_nodes, odd_pods)._pods
                      .keys() | {cacheentry.pod_key(odd_pods[3])})

    def test_page_decoders(self) -> None:
        rng = random.Random(3)
        nodes = _nodes(rng, 30)
        pods = _pods(rng, nodes, 200)
        for data in (_page(pods, 'next'),
                     _page(pods).replace(b'"Running"', b'NaN', 1),
                     _page(pods).replace(b'"p1"', b'"\\ud800"', 1)):
            reference = cachelist.json_page(data)
            self.assertEqual(
                (reference[0], reference[1],
                 [(cacheentry.pod_key(o), cacheentry.decode_pod(o),
                   cacheentry.decode_host(o))
                  for o in reference[2]]), cachelist.pod_page(data))
        decode = cachelist.node_page()
        data = _page(nodes)
        reference = cachelist.json_page(data)
        self.assertEqual((reference[0], reference[1], [
            cacheentry.decode_node(o) for o in reference[2]]), decode(data))
        # a page that is no list fails both ways alike
        for data in (b'[1]', b'{"items": [null]}', b'{"items": [1', b'\xff'):
            errors = []
            for func in (cachelist.pod_page, lambda d: [
                    cacheentry.decode_pod(o)
                    for o in cachelist.json_page(d)[2]]):
                try:
                    func(data)
                except Exception as err:   # the same exception both ways
                    errors.append(type(err))
            self.assertEqual(2, len(errors), data)
            self.assertEqual(errors[0], errors[1], data)
        self.assertEqual(('', '', []), cachelist.pod_page(b'{}'))
        self.assertEqual(('', '', []), cachelist.pod_page(
            b'{"metadata": null, "items": null}'))


class DeepNestingTest(testtools.TestCase):
    """Crafted nesting deeper than any decoder goes fails the page (or the
    registration) with an error; it never crashes the process."""

    DEEP = '[' * 200000 + ']' * 200000

    def test_pages(self) -> None:
        for spot in ('"spec": {"x": %s}', '"metadata": {"annotations": '
                     '{"%s": 1, "z": %%s}}' % hami.NODE_REGISTER):
            data = ('{"items": [{%s}]}' % (spot % self.DEEP)).encode()
            for decode in (cachelist.pod_page, cachelist.node_page(),
                           cachelist.json_page):
                self.assertRaises(RecursionError, decode, data)

    def test_registration(self) -> None:
        for value in (self.DEEP, '[{"id": "g", "custominfo": {"x": %s}}]'
                      % self.DEEP):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_node_register, value)
            self.assertIn('not JSON', str(err))


class FastConstructorTest(testtools.TestCase):
    """The decoders' constructors make the instances the dataclasses'
    own __init__ makes (same fields, no __post_init__ skipped)."""

    def test_same_instances(self) -> None:
        import dataclasses

        for cls, fast, values in (
                (hami.ContainerDevice, hami_pods._device,
                 ('g', 'AMD', 1, 2)),
                (cacheentry.PodEntry, cacheentry._live_pod,
                 ('ns/p', 'n', (), {'g': 3}, 7, 'g,AMD,1,2:;'))):
            self.assertFalse(hasattr(cls, '__post_init__'))
            made = fast(*values)
            if cls is cacheentry.PodEntry:
                values = values[:4] + (None,) + values[4:]
            self.assertEqual(len(dataclasses.fields(cls)), len(values))
            reference = cls(*values)
            self.assertEqual(reference, made)
            self.assertEqual(vars(reference), vars(made))
            self.assertEqual(repr(reference), repr(made))
            first = dataclasses.fields(cls)[0].name
            self.assertRaises(dataclasses.FrozenInstanceError, setattr,
                              made, first, 'x')
        device = hami_pods._device('g', 'AMD', 1, 2)
        self.assertEqual(hash(hami.ContainerDevice('g', 'AMD', 1, 2)),
                         hash(device))

    def test_gpu_state(self) -> None:
        import dataclasses

        from amdgpu_virt.k8s.fit import view as fitview

        device = hami.decode_node_register(json.dumps([GOOD_DEVICE]))[0]
        full = (1 << device.devcore) - 1
        for values in ((device, 1, 0, 0, 0, full),
                       (device, 2, 3, 100, 4096, full >> 150),
                       (device, 1, 11, 400, 1 << 20, 0),      # over-used
                       (device, 4, 1, 8, 0, full)):
            made = fitview.gpu_state(*values)
            reference = fit.GpuState(*values)
            self.assertEqual(reference, made)
            self.assertEqual(vars(reference), vars(made))
            self.assertEqual(repr(reference), repr(made))
            self.assertEqual(reference.usable_cores, made.usable_cores)
            self.assertRaises(dataclasses.FrozenInstanceError, setattr,
                              made, 'used_cores', 0)
        self.assertEqual(
            {field.name for field in dataclasses.fields(fit.GpuState)},
            set(vars(fitview.gpu_state(device, 1, 0, 0, 0, full))))

    def test_node_view(self) -> None:
        import dataclasses

        from amdgpu_virt.k8s.scheduler.cache import views as cacheviews

        device = hami.decode_node_register(json.dumps([GOOD_DEVICE]))[0]
        pods = [('live/a', ((hami.ContainerDevice('g', 'AMD', 4096, 38),),),
                 None)]
        for usages in ((), pods):
            made = cacheviews.ViewBuilder(
                allocator.BestFitStrategy()).build('n1', (device,), usages)
            # the view the cache builds names every field, so it is the
            # dataclass's own instance
            self.assertEqual(
                {field.name for field in dataclasses.fields(fit.NodeView)},
                set(vars(made)))
            reference = fit.NodeView(**vars(made))
            self.assertEqual(reference, made)
            self.assertEqual(repr(reference), repr(made))
            self.assertEqual(fit.build_view('n1', (device,), usages,
                                            strategy=allocator.
                                            BestFitStrategy()), made)
            self.assertRaises(dataclasses.FrozenInstanceError, setattr,
                              made, 'usage', 0.0)
