"""Needs stated per container: each container's statement goes through
the planner's filters on its own, and every refusal names its container."""

from __future__ import annotations

import base64
import copy
import json
import os
from typing import Any

import jsonpatch
import testtools
import yaml
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt.k8s.admission import intent
from amdgpu_virt.k8s.admission import rules as admission
from amdgpu_virt.k8s.admission import webhook
from amdgpu_virt.policy import engine as policy_engine
from amdgpu_virt.policy.filters import isolation
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.sharing import hami
from tests.unit.deploy import chart
from tests.unit.deploy import test_chart

MI300X = hami.DeviceInfo(id='a', count=10, devmem=196608, devcore=304,
                         type='AMD Instinct MI300X', health=True)
MI210 = hami.DeviceInfo(id='b', count=10, devmem=65536, devcore=104,
                        type='AMD Instinct MI210', health=True)
ISOLATED = {'amdgpu-virt.io/tenancy': 'isolated'}
SLICE = {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
         'amd.com/gpumem': '20480'}
NEEDS = 'memory: 20GiB, compute: 25%'


def _pod(annotations: dict[str, str], *names: str,
         init: tuple[str, ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {'containers': [
        {'name': n, 'image': 'rocm'} for n in names or ('main',)]}
    if init:
        spec['initContainers'] = [{'name': n, 'image': 'rocm'}
                                  for n in init]
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': 'p', 'namespace': 'ns',
                         'annotations': dict(annotations)},
            'spec': spec}


def _key(container: str) -> str:
    return intent.CONTAINER_PREFIX + container


class _Events:

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


class _Base(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.devices: tuple[hami.DeviceInfo, ...] = (MI300X,)
        self.policy = admission.IntentPolicy(
            policy_engine.Engine(conf_pkg.new_conf()),
            lambda: intent.models_from_registrations(self.devices))
        self.events = _Events()

    def review(self, pod: dict[str, Any], labels: dict[str, str] | None =
               None, operation: str = 'CREATE',
               old: dict[str, Any] | None = None) -> dict[str, Any]:
        request: dict[str, Any] = {
            'uid': 'u-1', 'kind': {'kind': 'Pod'}, 'namespace': 'ns',
            'operation': operation, 'object': pod,
            'userInfo': {'username': 'alice'}}
        if old is not None:
            request['oldObject'] = old
        response: dict[str, Any] = webhook.review(
            {'request': request}, webhook.WebhookPolicy(), labels or {},
            self.policy, self.events)['response']
        return response

    def admitted(self, pod: dict[str, Any], labels: dict[str, str] | None
                 = None) -> dict[str, Any]:
        response = self.review(pod, labels)
        self.assertTrue(response['allowed'], response)
        patched: dict[str, Any] = jsonpatch.apply_patch(pod, json.loads(
            base64.b64decode(response['patch'])))
        return patched

    def denied(self, pod: dict[str, Any], labels: dict[str, str] | None
               = None) -> str:
        response = self.review(pod, labels)
        self.assertFalse(response['allowed'], response)
        self.assertNotIn('patch', response)
        return str(response['status']['message'])

    @staticmethod
    def limits(pod: dict[str, Any], field: str = 'containers'
               ) -> dict[str, dict[str, str]]:
        return {c['name']: (c.get('resources') or {}).get('limits', {})
                for c in pod['spec'].get(field, [])}


class StatedTest(_Base):

    def test_each_container_gets_what_it_states(self) -> None:
        pod = _pod({_key('train'): NEEDS, _key('serve'): 'gpus: 2'},
                   'train', 'serve', 'log', init=('prep',))
        pod['metadata']['annotations'][_key('prep')] = 'compute: 10%, ' \
            'memory: 4GiB'
        patched = self.admitted(pod)
        self.assertEqual({'train': SLICE, 'serve': {'amd.com/gpu': '2'},
                          'log': {}}, self.limits(patched))
        self.assertEqual({'prep': {'amd.com/gpu': '1',
                                   'amd.com/gpucores': '10',
                                   'amd.com/gpumem': '4096'}},
                         self.limits(patched, 'initContainers'))
        annotations = patched['metadata']['annotations']
        self.assertEqual('cu-slice', annotations[
            intent.DECISION_PREFIX + 'train'])
        self.assertEqual('whole', annotations[
            intent.DECISION_PREFIX + 'serve'])
        self.assertIn('CU slice of 25% of the CUs and 20480 MiB',
                      annotations[intent.REASON_PREFIX + 'train'])
        self.assertIn('whole GPUs (2)', annotations[
            intent.REASON_PREFIX + 'serve'])
        # the pod-level decision is the pod-level form's only
        self.assertNotIn(intent.DECISION_ANNOTATION, annotations)
        self.assertEqual('amdgpu-virt-scheduler',
                         patched['spec']['schedulerName'])
        # one Event per container, on the container
        self.assertEqual(
            [('ns', 'p', 'u-1/prep', 'spec.initContainers{prep}'),
             ('ns', 'p', 'u-1/serve', 'spec.containers{serve}'),
             ('ns', 'p', 'u-1/train', 'spec.containers{train}')],
            sorted((c[0], c[1], c[2], c[4]) for c in self.events.calls))
        for call in self.events.calls:
            container = call[2].split('/')[1]
            self.assertEqual("container %r: %s" % (
                container, annotations[intent.REASON_PREFIX + container]),
                call[3])

    def test_isolated_namespace_gets_whole_gpus_per_container(self) -> None:
        pod = _pod({_key('a'): NEEDS, _key('b'): 'compute: 10%'}, 'a', 'b')
        patched = self.admitted(pod, ISOLATED)
        self.assertEqual({'a': {'amd.com/gpu': '1'},
                          'b': {'amd.com/gpu': '1'}}, self.limits(patched))
        refusal = str(isolation.cu_slice_refusal(Tenancy.ISOLATED))
        for name in ('a', 'b'):
            self.assertIn(refusal, patched['metadata']['annotations'][
                intent.REASON_PREFIX + name])
        # claiming trust there is refused, naming the container
        pod = _pod({_key('a'): NEEDS, _key('b'): 'tenancy: trusted'},
                   'a', 'b')
        self.assertIn("container 'b': metadata.annotations["
                      "workload.gpu.amd.com/b]: tenancy: 'trusted' is not "
                      "allowed", self.denied(pod, ISOLATED))

    def test_unknown_containers_are_named(self) -> None:
        pod = _pod({_key('trian'): NEEDS}, 'train', 'log')
        self.assertIn('metadata.annotations[workload.gpu.amd.com/trian]: '
                      "the pod has no container or init container 'trian' "
                      '(it has: log, train)', self.denied(pod))
        pod['spec']['ephemeralContainers'] = [{'name': 'trian',
                                               'image': 'busybox'}]
        self.assertIn("'trian', and an ephemeral container cannot be given "
                      'GPUs', self.denied(pod))
        # long hostile names: one bounded message
        pod['metadata']['annotations'] = {
            _key('x%04d' % n + 'y' * 1000): NEEDS for n in range(30)}
        message = self.denied(pod)
        self.assertLess(len(message), 3000)
        self.assertIn("'x0000yyy", message)
        self.assertIn('and 22 more', message)
        # thousands: refused by their number, before any is read
        pod['metadata']['annotations'] = {
            _key('x%04d' % n + 'y' * 1000): NEEDS for n in range(2000)}
        message = self.denied(pod)
        self.assertLess(len(message), 3000)
        self.assertIn('2000 statements of needs; a pod may carry at most '
                      '32', message)
        self.assertIn('and 1992 more', message)

    def test_a_denial_lists_a_bounded_number_of_problems(self) -> None:
        names = ['c%03d' % n for n in range(30)]
        pod = _pod({_key(n): 'memory: %dGiB' % (300 + int(n[1:]))
                    for n in names}, *names)
        message = self.denied(pod)
        self.assertEqual(webhook.MAX_PROBLEMS + 1, message.count('; ') + 1)
        self.assertIn("container 'c000': metadata.annotations["
                      'workload.gpu.amd.com/c000]: fits no GPU', message)
        self.assertTrue(message.endswith('and 10 more problems'), message)

    def test_a_need_that_never_fits_names_its_container(self) -> None:
        pod = _pod({_key('a'): NEEDS, _key('b'): 'memory: 300GiB'},
                   'a', 'b')
        message = self.denied(pod)
        self.assertIn("container 'b': metadata.annotations["
                      'workload.gpu.amd.com/b]: fits no GPU of the cluster: '
                      '[size] requested 304 CUs and 307200 MiB', message)
        self.assertNotIn("container 'a'", message)
        self.assertEqual([], self.events.calls)

    def test_raw_requests_conflict_only_on_the_same_container(self) -> None:
        pod = _pod({_key('a'): NEEDS}, 'a', 'b')
        pod['spec']['containers'][0]['resources'] = {'limits': {
            'amd.com/gpu': '1', 'amd.com/gpucores': '90'}}
        self.assertIn("container 'a': resources.limits[amd.com/gpu, "
                      'amd.com/gpucores]: state either '
                      'workload.gpu.amd.com/a or raw amd.com/gpu resources, '
                      'not both', self.denied(pod))
        # a raw request on another container is that container's own
        pod = _pod({_key('a'): NEEDS}, 'a', 'b')
        pod['spec']['containers'][1]['resources'] = {'limits': {
            'amd.com/gpu': '1', 'amd.com/gpucores': '50'}}
        patched = self.admitted(pod)
        self.assertEqual({'a': SLICE, 'b': {'amd.com/gpu': '1',
                                            'amd.com/gpucores': '50'}},
                         self.limits(patched))
        # and the rules for raw requests still hold there
        pod['spec']['containers'][1]['resources']['limits'][
            'amd.com/gpucores'] = '50'
        pod['spec']['containers'][1]['env'] = [{'name': 'HSA_CU_MASK',
                                                'value': '0:0-303'}]
        self.assertIn("container 'b' (spec.containers[1]): env[0] "
                      '(HSA_CU_MASK)', self.denied(pod))

    def test_the_pod_level_form_beside_per_container_ones(self) -> None:
        # the pod-level form keeps meaning its one container
        pod = _pod({intent.ANNOTATION: NEEDS, _key('b'): 'gpus: 1'},
                   'a', 'b')
        patched = self.admitted(pod)
        self.assertEqual({'a': SLICE, 'b': {'amd.com/gpu': '1'}},
                         self.limits(patched))
        annotations = patched['metadata']['annotations']
        self.assertEqual('cu-slice', annotations[intent.DECISION_ANNOTATION])
        self.assertEqual('whole', annotations[intent.DECISION_PREFIX + 'b'])
        self.assertNotIn(intent.DECISION_PREFIX + 'a', annotations)
        # its Event keeps its message (and its name)
        self.assertIn(('ns', 'p', 'u-1', annotations[
            intent.REASON_ANNOTATION], 'spec.containers{a}'),
            self.events.calls)
        # one container stated twice is refused
        pod = _pod({intent.ANNOTATION: NEEDS, _key('a'): 'gpus: 1'},
                   'a', 'b')
        self.assertIn("container 'a': needs stated twice, in "
                      'gpu.amd.com/workload and workload.gpu.amd.com/a',
                      self.denied(pod))
        pod['metadata']['annotations'][intent.CONTAINER_ANNOTATION] = 'b'
        self.assertEqual({'a': {'amd.com/gpu': '1'}, 'b': SLICE},
                         self.limits(self.admitted(pod)))

    def test_decisions_are_the_webhooks(self) -> None:
        pod = _pod({intent.DECISION_PREFIX + 'a': 'cu-slice',
                    intent.REASON_PREFIX + 'a': 'trust me'}, 'a')
        self.assertIn('metadata.annotations[decision-reason.gpu.amd.com/a, '
                      'decision.gpu.amd.com/a]: written by the webhook only',
                      self.denied(pod))
        # next to a statement for another container, still refused
        pod['metadata']['annotations'][_key('b')] = 'gpus: 1'
        pod['spec']['containers'].append({'name': 'b'})
        self.assertIn('written by the webhook only', self.denied(pod))
        # for the container that states its needs, overwritten
        pod = _pod({_key('a'): NEEDS,
                    intent.DECISION_PREFIX + 'a': 'whole'}, 'a')
        self.assertEqual('cu-slice', self.admitted(pod)['metadata'][
            'annotations'][intent.DECISION_PREFIX + 'a'])

    def test_statements_are_fixed_once_the_pod_exists(self) -> None:
        old = self.admitted(_pod({_key('a'): NEEDS}, 'a', 'b'))
        for key, value in ((_key('a'), 'compute: 100%'),
                           (_key('b'), 'gpus: 1'),
                           (intent.DECISION_PREFIX + 'a', 'whole'),
                           (intent.REASON_PREFIX + 'b', 'x')):
            new = copy.deepcopy(old)
            new['metadata']['annotations'][key] = value
            response = self.review(new, operation='UPDATE', old=old)
            self.assertFalse(response['allowed'], key)
            self.assertIn('metadata.annotations[%s]' % key,
                          response['status']['message'])
        new = copy.deepcopy(old)
        del new['metadata']['annotations'][_key('a')]
        self.assertFalse(self.review(new, operation='UPDATE', old=old)[
            'allowed'])

    def test_one_gpu_type_for_the_pod(self) -> None:
        self.devices = (MI300X, MI210)
        # 100 GiB fits only the MI300X; a whole GPU fits both
        pod = _pod({_key('a'): 'memory: 100GiB', _key('b'): 'gpus: 1'},
                   'a', 'b')
        self.assertEqual('AMD Instinct MI300X', self.admitted(pod)[
            'metadata']['annotations'][hami.USE_GPUTYPE])
        # two containers that fit no common type cannot share the pod's
        # one amd.com/use-gputype
        self.devices = (MI300X, hami.DeviceInfo(
            id='c', count=10, devmem=524288, devcore=64,
            type='Big Memory', health=True))
        pod = _pod({_key('a'): 'memory: 300GiB', _key('b'):
                    'compute: 200'}, 'a', 'b')
        self.assertIn("container 'a' fits only Big Memory; container 'b' "
                      'fits only AMD Instinct MI300X: the GPU types these '
                      'containers fit have none in common',
                      self.denied(pod))

    def test_dra_claims_per_container(self) -> None:
        written: list[tuple[str, dict[str, Any]]] = []
        self.policy = admission.IntentPolicy(
            self.policy.engine, self.policy.models, dra=True,
            templates=lambda ns, t: written.append((ns, t)))
        long_name = 'c' * 63
        pod = _pod({_key('a'): NEEDS, _key(long_name): NEEDS,
                    intent.ANNOTATION: 'gpus: 1'}, 'main', 'a', long_name)
        patched = self.admitted(pod)
        claims = {c['name']: c['resourceClaimTemplateName']
                  for c in patched['spec']['resourceClaims']}
        digest = intent.claim_name(long_name)
        self.assertEqual(24, len(digest))
        self.assertEqual({'amd-gpu', 'amd-gpu-a', digest}, set(claims))
        # the same needs, the same template; each container its own claim
        self.assertEqual(claims['amd-gpu-a'], claims[digest])
        self.assertNotEqual(claims['amd-gpu'], claims['amd-gpu-a'])
        uses = {c['name']: c['resources']['claims']
                for c in patched['spec']['containers']}
        self.assertEqual({'main': [{'name': 'amd-gpu'}],
                          'a': [{'name': 'amd-gpu-a'}],
                          long_name: [{'name': digest}]}, uses)
        self.assertEqual(2, len(written))
        self.assertNotIn('schedulerName', patched['spec'])

    def test_many_containers_are_judged_in_one_review(self) -> None:
        # as many containers as statements may be, each its own
        names = ['c%03d' % n for n in range(32)]
        pod = _pod({_key(n): 'memory: %dMiB, compute: 10%%' % (
            1024 + int(n[1:])) for n in names}, *names)
        patched = self.admitted(pod)
        self.assertEqual('1055', self.limits(patched)['c031'][
            'amd.com/gpumem'])
        self.assertEqual(32, len(self.events.calls))
        # the same statement everywhere is judged once
        calls = []
        models = self.policy.models
        self.policy = admission.IntentPolicy(
            self.policy.engine, lambda: calls.append(1) or models())
        pod = _pod({_key(n): NEEDS for n in names}, *names)
        self.assertEqual(SLICE, self.limits(self.admitted(pod))['c023'])
        self.assertEqual(1, len(calls))
        # and the same needs everywhere make one Event, not one each
        self.events.calls.clear()
        self.admitted(pod)
        self.assertEqual(1, len(self.events.calls))
        self.assertIsNone(self.events.calls[0][4])
        self.assertIn("containers 'c000', 'c001',", self.events.calls[0][3])
        self.assertIn('and 24 more: CU slice', self.events.calls[0][3])

    def test_hostile_keys_and_values(self) -> None:
        for stated, reason in (
                ({_key(''): NEEDS}, "no container or init container ''"),
                ({_key('a'): 7}, 'workload.gpu.amd.com/a: 7 is not a '
                 'string'),
                ({_key('a'): 'a: &x 1\nb: *x'}, 'YAML aliases'),
                ({_key('a'): 'model: MI300X'}, 'unknown field(s) model')):
            self.assertIn(reason, self.denied(_pod(stated, 'a')), stated)


_leaf = st.none() | st.booleans() | st.integers(-5, 400) | st.sampled_from(
    ['', 'main', 'a', NEEDS, 'gpus: 2', 'memory: 300GiB', 'amd.com/gpu',
     'HSA_CU_MASK', '25', 'x'])
_hostile = st.recursive(_leaf, lambda inner: st.lists(
    inner, max_size=3) | st.dictionaries(st.sampled_from([
        'metadata', 'spec', 'annotations', 'labels', 'name', 'containers',
        'initContainers', 'ephemeralContainers', 'resources', 'limits',
        'claims', 'resourceClaims', 'env', 'securityContext', 'privileged',
        'amd.com/gpu', intent.ANNOTATION, intent.CONTAINER_ANNOTATION,
        _key('main'), _key('a'), intent.DECISION_PREFIX + 'a',
        hami.VGPU_NODE]), inner, max_size=4), max_leaves=25)


class HostileShapesTest(testtools.TestCase):
    """Any shape, with stated needs, claims and ephemeral containers
    anywhere: an answer or an error naming the field, never a crash."""

    def test_a_bad_neighbour_container(self) -> None:
        # found by hand: resources that are not an object, next to a
        # container that states its needs (the HAMi and the DRA path)
        for dra in (False, True):
            policy = admission.IntentPolicy(
                policy_engine.Engine(conf_pkg.new_conf()),
                lambda: intent.models_from_registrations([MI300X]),
                dra=dra, templates=lambda ns, t: None)
            pod = _pod({_key('a'): NEEDS}, 'a', 'b')
            pod['spec']['containers'][1]['resources'] = ['x']
            out = webhook.review({'request': {
                'uid': 'u', 'kind': {'kind': 'Pod'}, 'object': pod}},
                webhook.WebhookPolicy(), {}, policy)
            self.assertTrue(out['response']['allowed'], dra)

    @settings(max_examples=150, deadline=None)
    @given(_hostile, _hostile, st.sampled_from(['CREATE', 'UPDATE']),
           st.booleans())
    def test_an_answer_or_a_named_error(self, obj: Any, old: Any,
                                        operation: str, dra: bool) -> None:
        policy = admission.IntentPolicy(
            policy_engine.Engine(conf_pkg.new_conf()),
            lambda: intent.models_from_registrations([MI300X]), dra=dra,
            templates=lambda ns, t: None)
        body = {'request': {'uid': 'u', 'kind': {'kind': 'Pod'},
                            'operation': operation, 'object': obj,
                            'oldObject': old}}
        try:
            out = webhook.review(body, webhook.WebhookPolicy(), {},
                                 policy, _Events())
        except exception.AdmissionReviewError as err:
            self.assertIn('request', str(err))
            return
        self.assertIn(out['response']['allowed'], (True, False))


class ExampleTest(_Base):
    """deploy/examples/stated-needs.yaml does what the docs say."""

    def test_the_shipped_example(self) -> None:
        with open(os.path.join(chart.ROOT, 'deploy', 'examples',
                               'stated-needs.yaml')) as stream:
            pod = yaml.safe_load(stream)
        pod['metadata']['namespace'] = 'ns'
        version = test_chart.kubernetes_versions()[-1]
        test_chart.strict_validate(pod, version)
        patched = self.admitted(copy.deepcopy(pod))
        test_chart.strict_validate(patched, version)
        self.assertEqual({'train': SLICE, 'serve': {
            'amd.com/gpu': '1', 'amd.com/gpucores': '10',
            'amd.com/gpumem': '8192'}, 'log': {}}, self.limits(patched))
        self.assertEqual({'prep': {'amd.com/gpu': '1'}},
                         self.limits(patched, 'initContainers'))
        decisions = {k: v for k, v in patched['metadata'][
            'annotations'].items() if k.startswith(intent.DECISION_PREFIX)}
        self.assertEqual({intent.DECISION_PREFIX + 'prep': 'whole',
                          intent.DECISION_PREFIX + 'train': 'cu-slice',
                          intent.DECISION_PREFIX + 'serve': 'cu-slice'},
                         decisions)
        self.assertEqual(3, len(self.events.calls))
        # where tenants are isolated: whole GPUs for each
        patched = self.admitted(copy.deepcopy(pod), ISOLATED)
        self.assertEqual({'train': {'amd.com/gpu': '1'},
                          'serve': {'amd.com/gpu': '1'}, 'log': {}},
                         self.limits(patched))
