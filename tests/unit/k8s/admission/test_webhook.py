"""The admission webhook's decisions, one rule at a time."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt.k8s.admission import webhook

POLICY = webhook.WebhookPolicy(scheduler_name='amdgpu-virt')


def _pod(limits: dict[str, Any] | None = None, **spec: Any
         ) -> dict[str, Any]:
    container: dict[str, Any] = {'name': 'main', 'image': 'rocm'}
    if limits is not None:
        container['resources'] = {'limits': limits}
    body = {'containers': [container]}
    body.update(spec)
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': 'p', 'namespace': 'ns'}, 'spec': body}


def _review(pod: dict[str, Any], operation: str = 'CREATE',
            kind: str = 'Pod') -> dict[str, Any]:
    return {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
            'request': {'uid': 'u-1', 'kind': {'group': '', 'version': 'v1',
                                               'kind': kind},
                        'namespace': 'ns', 'operation': operation,
                        'object': pod}}


def _decide(pod: dict[str, Any], labels: dict[str, str] | None = None,
            policy: webhook.WebhookPolicy = POLICY) -> dict[str, Any]:
    return webhook.review(_review(pod), policy, labels)['response']


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(response['patch']))


class MutationTest(testtools.TestCase):

    def _denied(self, pod: dict[str, Any],
                policy: webhook.WebhookPolicy = POLICY) -> str:
        response = _decide(pod, policy=policy)
        self.assertFalse(response['allowed'])
        self.assertNotIn('patch', response)
        return str(response['status']['message'])

    def test_sets_scheduler_name_for_each_resource(self) -> None:
        for resource in ('amd.com/gpu', 'amd.com/gpumem',
                         'amd.com/gpucores'):
            pod = _pod({resource: '1'})
            response = _decide(pod)
            self.assertTrue(response['allowed'], resource)
            self.assertEqual('u-1', response['uid'])
            self.assertEqual('JSONPatch', response['patchType'])
            patched = jsonpatch.apply_patch(pod, _patch(response))
            self.assertEqual('amdgpu-virt', patched['spec']['schedulerName'])

    def test_replaces_another_scheduler_name(self) -> None:
        pod = _pod({'amd.com/gpu': 1}, schedulerName='default-scheduler')
        patched = jsonpatch.apply_patch(pod, _patch(_decide(pod)))
        self.assertEqual('amdgpu-virt', patched['spec']['schedulerName'])

    def test_init_containers_count_too(self) -> None:
        pod = _pod()
        pod['spec']['initContainers'] = [{'name': 'init', 'resources': {
            'limits': {'amd.com/gpu': '1'}}}]
        self.assertIn('patch', _decide(pod))

    def test_a_request_without_a_limit_is_denied(self) -> None:
        # Kubernetes requires a limit for extended resources, and the
        # extender (like HAMi) reads limits only
        pod = _pod()
        pod['spec']['initContainers'] = [{'name': 'init', 'resources': {
            'requests': {'amd.com/gpu': '1'}}}]
        message = self._denied(pod)
        self.assertIn("container 'init'", message)
        self.assertIn('resources.requests[amd.com/gpu] without a limit',
                      message)

    def test_gpu_count_is_added_to_shares_as_hami_reads_them(self) -> None:
        # HAMi counts a container only when amd.com/gpu is set; a share
        # without it means one GPU here, so the webhook says so
        pod = _pod({'amd.com/gpucores': '30'})
        patched = jsonpatch.apply_patch(pod, _patch(_decide(pod)))
        self.assertEqual({'amd.com/gpucores': '30', 'amd.com/gpu': '1'},
                         patched['spec']['containers'][0]['resources'][
                             'limits'])
        pod = _pod({'amd.com/gpu': '0', 'amd.com/gpumem': '10'})
        patched = jsonpatch.apply_patch(pod, _patch(_decide(pod)))
        self.assertEqual('0', patched['spec']['containers'][0]['resources'][
            'limits']['amd.com/gpu'])

    def test_no_patch_when_already_ours(self) -> None:
        response = _decide(_pod({'amd.com/gpu': 1},
                                schedulerName='amdgpu-virt'))
        self.assertEqual({'uid': 'u-1', 'allowed': True}, response)

    def test_pods_without_gpu_are_untouched(self) -> None:
        response = _decide(_pod({'cpu': '1'}, nodeName='n1'))
        self.assertEqual({'uid': 'u-1', 'allowed': True}, response)

    def test_ignore_label_skips_nothing(self) -> None:
        pod = _pod({'amd.com/gpucores': '500'}, nodeName='n1')
        pod['metadata']['labels'] = {'hami.io/webhook': 'ignore'}
        message = self._denied(pod)
        self.assertIn('spec.nodeName', message)
        self.assertIn('amd.com/gpucores', message)

    def test_exempt_namespaces_only_by_option(self) -> None:
        pod = _pod({'amd.com/gpucores': '500'}, nodeName='n1')
        policy = webhook.WebhookPolicy(exempt_namespaces=frozenset({'ns'}))
        self.assertEqual({'uid': 'u-1', 'allowed': True},
                         _decide(pod, policy=policy))

    def test_other_kinds_and_operations_pass(self) -> None:
        pod = _pod({'amd.com/gpucores': '500'})
        update = _review(pod, operation='UPDATE')
        update['request']['oldObject'] = pod
        for review in (update, _review(pod, operation='DELETE'),
                       _review(pod, kind='Deployment')):
            self.assertEqual({'uid': 'u-1', 'allowed': True},
                             webhook.review(review, POLICY)['response'])

    def test_response_envelope(self) -> None:
        out = webhook.review(_review(_pod({'amd.com/gpu': 1})), POLICY)
        self.assertEqual(('admission.k8s.io/v1', 'AdmissionReview'),
                         (out['apiVersion'], out['kind']))

    def test_policy_from_conf(self) -> None:
        conf = conf_pkg.new_conf()
        conf.set_override('scheduler_name', 'x', group='kubernetes')
        conf.set_override('isolated_namespace_label', 'tier=secure',
                          group='kubernetes')
        policy = webhook.WebhookPolicy.from_conf(conf)
        self.assertEqual(('x', ('tier', 'secure')),
                         (policy.scheduler_name, policy.isolated_label))
        self.assertIn('amd.com/gpucores', policy.managed_resources)


class DenialTest(testtools.TestCase):

    def _denied(self, pod: dict[str, Any],
                labels: dict[str, str] | None = None) -> str:
        response = _decide(pod, labels)
        self.assertFalse(response['allowed'])
        self.assertNotIn('patch', response)
        self.assertEqual(403, response['status']['code'])
        return response['status']['message']

    def test_privileged_container(self) -> None:
        pod = _pod({'amd.com/gpu': 1})
        pod['spec']['containers'][0]['securityContext'] = {
            'privileged': True}
        message = self._denied(pod)
        self.assertIn("container 'main' (spec.containers[0])", message)
        self.assertIn('securityContext.privileged', message)

    def test_privileged_sidecar_without_gpu_is_fine(self) -> None:
        pod = _pod({'amd.com/gpu': 1})
        pod['spec']['containers'].append({'name': 'side', 'securityContext':
                                          {'privileged': True}})
        self.assertTrue(_decide(pod)['allowed'])

    def test_preset_node_name(self) -> None:
        message = self._denied(_pod({'amd.com/gpu': 1}, nodeName='n1'))
        self.assertIn("spec.nodeName: preset to 'n1'", message)
        self.assertIn("'amdgpu-virt'", message)

    def test_gpucores_range_and_type(self) -> None:
        for bad in ('0', '101', '-5', '50.5', '500m', 'half', True, 1.5):
            message = self._denied(_pod({'amd.com/gpucores': bad}))
            self.assertIn('resources.limits[amd.com/gpucores]', message)
            self.assertIn(repr(bad), message)
            self.assertIn("container 'main'", message)
        for good in ('1', '100', 50, '+25'):
            self.assertTrue(_decide(_pod({'amd.com/gpucores': good}))[
                'allowed'], good)

    def test_gpu_and_gpumem_must_be_integers(self) -> None:
        message = self._denied(_pod({'amd.com/gpu': '1.5'}))
        self.assertIn('resources.limits[amd.com/gpu]', message)
        message = self._denied(_pod({'amd.com/gpumem': '4Gi'}))
        self.assertIn('resources.limits[amd.com/gpumem]', message)
        self.assertIn('counts MiB', message)

    def test_limits_as_the_api_server_serves_them(self) -> None:
        # the API server hands the webhook canonical quantities: a pod
        # created with gpumem 10000 or 4096 arrives as '10k' or '4Ki'
        for mem in ('10k', '4Ki', '24576', 20480):
            self.assertTrue(_decide(_pod({'amd.com/gpumem': mem}))[
                'allowed'], mem)

    def test_reserved_environment(self) -> None:
        for name in ('HSA_CU_MASK', 'ROC_GLOBAL_CU_MASK',
                     'HIP_DEVICE_MEMORY_LIMIT', 'HIP_DEVICE_MEMORY_LIMIT_0',
                     'ROCR_VISIBLE_DEVICES', 'LD_AUDIT'):
            pod = _pod({'amd.com/gpu': 1})
            pod['spec']['containers'][0]['env'] = [
                {'name': 'OK', 'value': '1'}, {'name': name, 'value': 'x'}]
            message = self._denied(pod)
            self.assertIn("container 'main'", message)
            self.assertIn('env[1] (%s)' % name, message)

    def test_isolated_namespace_only_whole_gpus(self) -> None:
        labels = {'amdgpu-virt.io/tenancy': 'isolated'}
        message = self._denied(_pod({'amd.com/gpu': 1,
                                     'amd.com/gpucores': '50'}), labels)
        self.assertIn("namespace 'ns'", message)
        self.assertIn('resources.limits[amd.com/gpucores]', message)
        message = self._denied(_pod({'amd.com/gpu': 1,
                                     'amd.com/gpumem': '1024'}), labels)
        self.assertIn('resources.limits[amd.com/gpumem]', message)
        for whole in ({'amd.com/gpu': 2},
                      {'amd.com/gpu': 1, 'amd.com/gpucores': '100',
                       'amd.com/gpumem': '0'}):
            self.assertTrue(_decide(_pod(whole), labels)['allowed'])
        # the same pod elsewhere may share
        self.assertTrue(_decide(_pod({'amd.com/gpucores': '50'}),
                                {'amdgpu-virt.io/tenancy': 'shared'})[
            'allowed'])

    def test_all_problems_are_reported(self) -> None:
        pod = _pod({'amd.com/gpucores': '0'}, nodeName='n1')
        pod['spec']['containers'][0]['env'] = [{'name': 'LD_AUDIT'}]
        message = self._denied(pod)
        self.assertEqual(3, message.count(';') + 1)

    def test_malformed_reviews_name_the_field(self) -> None:
        cases = {'request': {}, 'request.uid': {'request': {'kind': {}}},
                 'request.object': {'request': {'uid': 'u', 'kind': {
                     'kind': 'Pod'}}}}
        for field, body in cases.items():
            err = self.assertRaises(exception.AdmissionReviewError,
                                    webhook.review, body, POLICY)
            self.assertIn(field, str(err))

    def test_bad_isolated_label_option(self) -> None:
        conf = conf_pkg.new_conf()
        conf.set_override('isolated_namespace_label', 'novalue=x',
                          group='kubernetes')
        conf.kubernetes.isolated_namespace_label  # noqa: B018  (valid)
        self.assertRaises(ValueError, conf.set_override,
                          'isolated_namespace_label', 'novalue',
                          group='kubernetes')


_names = st.sampled_from(['main', 'side', 'a/b', 'x~y', 'init'])
_resources = st.dictionaries(
    st.sampled_from(['amd.com/gpu', 'amd.com/gpumem', 'amd.com/gpucores',
                     'cpu']),
    st.one_of(st.integers(0, 120), st.sampled_from(['1', '100', '50m'])),
    max_size=3)
_containers = st.lists(st.fixed_dictionaries(
    {'name': _names},
    optional={'resources': st.fixed_dictionaries(
        {}, optional={'limits': _resources, 'requests': _resources}),
        'env': st.lists(st.fixed_dictionaries(
            {'name': st.sampled_from(['A', 'B'])}), max_size=2)}),
    min_size=1, max_size=3)
_pods = st.fixed_dictionaries(
    {'metadata': st.fixed_dictionaries(
        {'name': st.just('p')},
        optional={'labels': st.dictionaries(st.sampled_from(
            ['app', 'a/b', 'hami.io/webhook']), st.sampled_from(
            ['x', 'ignore']), max_size=2),
            'annotations': st.dictionaries(st.sampled_from(['k~1', 'a/b']),
                                           st.just('v'), max_size=2)}),
     'spec': st.fixed_dictionaries(
        {'containers': _containers},
        optional={'initContainers': _containers,
                  'schedulerName': st.sampled_from(['default-scheduler',
                                                    'amdgpu-virt']),
                  'nodeName': st.just('n1')})})


class PatchPropertyTest(testtools.TestCase):

    @given(_pods)
    def test_patch_applies_to_its_pod(self, pod: dict[str, Any]) -> None:
        original = copy.deepcopy(pod)
        response = _decide(pod)
        self.assertEqual(original, pod, 'the review changed its input')
        if 'patch' not in response:
            return
        self.assertTrue(response['allowed'])
        patched = jsonpatch.apply_patch(pod, _patch(response))
        self.assertEqual('amdgpu-virt', patched['spec']['schedulerName'])
        patched['spec'].pop('schedulerName')
        original['spec'].pop('schedulerName', None)
        for container in (patched['spec'].get('containers', [])
                          + patched['spec'].get('initContainers', [])):
            limits = container.get('resources', {}).get('limits', {})
            if limits.get('amd.com/gpu') == '1' and any(
                    r in limits for r in ('amd.com/gpumem',
                                          'amd.com/gpucores')):
                # added to shares that name no GPU count
                where = 'initContainers' if container in patched[
                    'spec'].get('initContainers', []) else 'containers'
                index = patched['spec'][where].index(container)
                if 'amd.com/gpu' not in original['spec'][where][index][
                        'resources']['limits']:
                    del limits['amd.com/gpu']
        self.assertEqual(original, patched)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 200) | st.sampled_from(
        ['', 'Pod', 'CREATE', 'amd.com/gpu', 'HSA_CU_MASK', '50', 'x']),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(['kind', 'metadata', 'spec', 'containers', 'name',
                         'resources', 'limits', 'env', 'labels', 'uid',
                         'object', 'amd.com/gpucores', 'nodeName',
                         'securityContext', 'privileged']), inner,
        max_size=4),
    max_leaves=20)


class RobustnessTest(testtools.TestCase):

    @given(_json)
    def test_any_object_gets_an_answer_or_a_named_error(self, obj: Any
                                                         ) -> None:
        body = {'request': {'uid': 'u', 'kind': {'kind': 'Pod'},
                            'object': obj}}
        try:
            out = webhook.review(body, POLICY)
        except exception.AdmissionReviewError as err:
            self.assertIn('request', str(err))
            return
        self.assertIn(out['response']['allowed'], (True, False))


def _debug(pod: dict[str, Any], **container: Any) -> dict[str, Any]:
    """``pod`` with an ephemeral container, as ``kubectl debug`` adds it
    through ``pods/ephemeralcontainers`` (the whole Pod, kind Pod)."""
    new = copy.deepcopy(pod)
    new['spec'].setdefault('ephemeralContainers', []).append(
        {'name': 'debugger-%d' % len(new['spec'].get(
            'ephemeralContainers', [])), 'image': 'busybox',
         'targetContainerName': 'main', **container})
    return new


class EphemeralContainerTest(testtools.TestCase):
    """``kubectl debug`` on a GPU pod gets no GPU, no plugin variable and
    no privilege."""

    def _update(self, new: dict[str, Any], old: dict[str, Any],
                user: str = 'alice') -> dict[str, Any]:
        body = _review(new, 'UPDATE')
        body['request'].update(oldObject=old, subResource=
                               'ephemeralcontainers',
                               userInfo={'username': user})
        response: dict[str, Any] = webhook.review(body, POLICY, {})[
            'response']
        return response

    def _denied(self, new: dict[str, Any], old: dict[str, Any],
                user: str = 'alice') -> str:
        response = self._update(new, old, user)
        self.assertFalse(response['allowed'], response)
        return str(response['status']['message'])

    def test_a_plain_debug_container_joins(self) -> None:
        gpu = _pod({'amd.com/gpu': '1', 'amd.com/gpucores': '50'})
        self.assertEqual({'uid': 'u-1', 'allowed': True},
                         self._update(_debug(gpu, env=[
                             {'name': 'PS1', 'value': '$ '}]), gpu))

    def test_no_gpu_no_plugin_variable_no_privilege(self) -> None:
        gpu = _pod({'amd.com/gpu': '1', 'amd.com/gpucores': '50'})
        attacks = {
            'resources.limits[amd.com/gpu]: an ephemeral container gets '
            'no GPU': {'resources': {'limits': {'amd.com/gpu': '1'}}},
            'resources.requests[amd.com/gpucores]': {
                'resources': {'requests': {'amd.com/gpucores': '100'}}},
            'env[0] (HSA_CU_MASK): set by the GPU device plugin': {
                'env': [{'name': 'HSA_CU_MASK', 'value': '0:0-303'}]},
            'env[1] (HIP_DEVICE_MEMORY_LIMIT_0)': {'env': [
                {'name': 'A'}, {'name': 'HIP_DEVICE_MEMORY_LIMIT_0',
                                'value': '999g'}]},
            'env[0] (ROCR_VISIBLE_DEVICES)': {'env': [
                {'name': 'ROCR_VISIBLE_DEVICES', 'value': '0,1,2,3'}]},
            "envFrom[0] (prefix ''): its keys could set": {
                'envFrom': [{'configMapRef': {'name': 'cfg'}}]},
            'securityContext.privileged: a privileged container sees '
            'every GPU of the node, so it may not join a GPU pod': {
                'securityContext': {'privileged': True}},
        }
        for reason, container in attacks.items():
            message = self._denied(_debug(gpu, **container), gpu)
            self.assertIn("ephemeral container 'debugger-0' "
                          '(spec.ephemeralContainers[0]): ' + reason,
                          message)
        # nor as the project's own accounts
        self.assertIn('privileged', self._denied(_debug(
            gpu, securityContext={'privileged': True}), gpu,
            user=webhook.DEFAULT_ALLOCATION_WRITERS[0]))

    def test_gpu_pods_are_known_by_any_sign(self) -> None:
        stated = _pod()
        stated['metadata']['annotations'] = {
            'workload.gpu.amd.com/main': 'compute: 10%'}
        held = _pod()
        held['metadata']['annotations'] = {'hami.io/amd-devices-allocated':
                                           'GPU-1,AMD,1024,30:;'}
        for gpu in (_pod({'amd.com/gpucores': '10'}), stated, held,
                    _pod(initContainers=[{'name': 'i', 'resources': {
                        'requests': {'amd.com/gpu': '1'}}}])):
            self.assertIn('privileged', self._denied(_debug(
                gpu, securityContext={'privileged': True}), gpu))
        # a pod without GPUs is not this webhook's business
        plain = _pod({'cpu': '1'})
        self.assertTrue(self._update(_debug(
            plain, securityContext={'privileged': True}, env=[
                {'name': 'HSA_CU_MASK', 'value': '0:0'}]), plain)[
            'allowed'])

    def test_only_the_added_container_is_judged(self) -> None:
        # one added before this webhook judged them stays; the next is
        # judged on its own
        gpu = _debug(_pod({'amd.com/gpu': '1'}), securityContext={
            'privileged': True})
        self.assertTrue(self._update(_debug(gpu), gpu)['allowed'])
        self.assertIn("'debugger-1' (spec.ephemeralContainers[1])",
                      self._denied(_debug(gpu, env=[
                          {'name': 'LD_AUDIT', 'value': ''}]), gpu))
        # a hostile shape is no container
        odd = copy.deepcopy(gpu)
        odd['spec']['ephemeralContainers'] = ['x', None, 7]
        self.assertTrue(self._update(odd, gpu)['allowed'])
        odd['spec']['ephemeralContainers'] = {'name': 'x'}
        self.assertTrue(self._update(odd, gpu)['allowed'])

    def test_on_create_too(self) -> None:
        # the API server refuses them at creation; the webhook says why
        pod = _debug(_pod({'amd.com/gpu': '1'}), env=[
            {'name': 'HSA_CU_MASK', 'value': '0:0'}])
        response = _decide(pod)
        self.assertFalse(response['allowed'])
        self.assertIn("ephemeral container 'debugger-0'",
                      response['status']['message'])
