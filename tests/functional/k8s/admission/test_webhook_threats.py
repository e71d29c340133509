"""A tenant attacks the admission webhook over HTTP, as the API server
would forward its requests; every attack is denied with a reason.

The webhook reads namespace labels and node registrations from the API
server stand-in through the real ``kubernetes`` client. The stand-in has
no admission chain, so each test posts the AdmissionReview the API server
would send (``request.userInfo`` as it names the tenant or the project's
service accounts) and asserts the answer.
"""

from __future__ import annotations

import base64
import copy
import json
import urllib.request
from typing import Any

import jsonpatch
import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.k8s.admission import intent
from amdgpu_virt.k8s.admission import rules as admission
from amdgpu_virt.k8s.admission import webhook
from amdgpu_virt.k8s.admission import webhookapi
from amdgpu_virt.policy import engine as policy_engine
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient
from tests.functional.k8s import cluster

TENANT = 'alice'
SCHEDULER = 'system:serviceaccount:amdgpu-virt:amdgpu-virt-scheduler'
NODE_AGENT = 'system:serviceaccount:amdgpu-virt:amdgpu-virt-node'
DEVICE = hami.DeviceInfo(id='g0', count=10, devmem=196592, devcore=304,
                         type='AMD Instinct MI300X', health=True,
                         custominfo={'pciBDF': '0000:83:00.0'})


def _pod(limits: dict[str, str] | None = None, **container: Any
         ) -> dict[str, Any]:
    main: dict[str, Any] = {'name': 'main', 'image': 'rocm'}
    if limits is not None:
        main['resources'] = {'limits': dict(limits)}
    main.update(container)
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': 'p', 'namespace': 'shared'},
            'spec': {'containers': [main]}}


class _WebhookTest(testtools.TestCase):
    """The webhook over HTTP in front of the API server stand-in."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        api = self.kube.api
        for name, labels in (('shared', None), ('secure', {
                'amdgpu-virt.io/tenancy': 'isolated'}), ('ops', None)):
            api.create_namespace(client.V1Namespace(
                metadata=client.V1ObjectMeta(name=name, labels=labels)))
        api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name='n1', annotations={
                hami.NODE_REGISTER: hami.encode_node_register([DEVICE])})))
        conf = conf_pkg.new_conf()
        models = webhookapi.ClusterModels(api)
        self.server = webhook.make_server(
            webhook.WebhookPolicy(exempt_namespaces=frozenset({'ops'})),
            namespace_labels=webhook.NamespaceLabelCache(api),
            intent=admission.IntentPolicy(policy_engine.Engine(conf),
                                          models, most=models.most),
            events=webhookapi.EventRecorder(api))
        self.url = cluster.serve(self, self.server) + '/webhook'

    def _review(self, pod: dict[str, Any], operation: str = 'CREATE',
                old: dict[str, Any] | None = None, user: str = TENANT
                ) -> dict[str, Any]:
        request: dict[str, Any] = {
            'uid': 'u-1', 'kind': {'group': '', 'version': 'v1',
                                   'kind': 'Pod'},
            'resource': {'group': '', 'version': 'v1', 'resource': 'pods'},
            'namespace': pod['metadata']['namespace'],
            'operation': operation, 'object': pod,
            'userInfo': {'username': user,
                         'groups': ['system:authenticated']}}
        if old is not None:
            request['oldObject'] = old
        body = json.dumps({'apiVersion': 'admission.k8s.io/v1',
                           'kind': 'AdmissionReview',
                           'request': request}).encode()
        with urllib.request.urlopen(urllib.request.Request(
                self.url, data=body, headers={
                    'Content-Type': 'application/json'}),
                timeout=10) as answer:
            response: dict[str, Any] = json.loads(answer.read())['response']
        return response

    def _denied(self, *args: Any, **kwargs: Any) -> str:
        response = self._review(*args, **kwargs)
        self.assertFalse(response['allowed'], response)
        self.assertNotIn('patch', response)
        self.assertEqual(403, response['status']['code'])
        return str(response['status']['message'])


class WebhookThreatTest(_WebhookTest):

    # -- threat 1: nothing a pod carries skips a rule -------------------

    def test_ignore_label_skips_no_rule(self) -> None:
        attacks = {
            'privileged': (_pod({'amd.com/gpu': '1'}, securityContext={
                'privileged': True}), 'securityContext.privileged'),
            'nodeName': (_pod({'amd.com/gpu': '1'}), 'spec.nodeName'),
            'HSA_CU_MASK': (_pod({'amd.com/gpucores': '10'}, env=[
                {'name': 'HSA_CU_MASK', 'value': '0:0-303'}]),
                "env[0] (HSA_CU_MASK): set by the GPU device plugin"),
            'ROC_GLOBAL_CU_MASK': (_pod({'amd.com/gpu': '1'}, env=[
                {'name': 'A', 'value': '1'},
                {'name': 'ROC_GLOBAL_CU_MASK', 'value': '0xff'}]),
                'env[1] (ROC_GLOBAL_CU_MASK)'),
            'memory limit': (_pod({'amd.com/gpumem': '100'}, env=[
                {'name': 'HIP_DEVICE_MEMORY_LIMIT_0', 'value': '999g'}]),
                'env[0] (HIP_DEVICE_MEMORY_LIMIT_0)'),
            'LD_AUDIT': (_pod({'amd.com/gpucores': '10'}, env=[
                {'name': 'LD_AUDIT', 'value': ''}]), 'env[0] (LD_AUDIT)'),
            'visible devices': (_pod({'amd.com/gpu': '1'}, env=[
                {'name': 'ROCR_VISIBLE_DEVICES', 'value': '0,1,2'}]),
                'env[0] (ROCR_VISIBLE_DEVICES)'),
            'envFrom': (_pod({'amd.com/gpucores': '10'}, envFrom=[
                {'configMapRef': {'name': 'cfg'}}]),
                "envFrom[0] (prefix ''): its keys could set HSA_CU_MASK"),
            'envFrom prefix': (_pod({'amd.com/gpucores': '10'}, envFrom=[
                {'prefix': 'HIP_DEVICE_', 'secretRef': {'name': 's'}}]),
                "envFrom[0] (prefix 'HIP_DEVICE_'): its keys could set "
                "HIP_DEVICE_MEMORY_LIMIT*"),
        }
        for what, (pod, reason) in attacks.items():
            pod['metadata']['labels'] = {hami.WEBHOOK_LABEL:
                                         hami.WEBHOOK_IGNORE}
            if what == 'nodeName':
                pod['spec']['nodeName'] = 'n1'
            self.assertIn(reason, self._denied(pod), what)

    def test_shared_gpu_in_isolated_namespace(self) -> None:
        for limits, field in (({'amd.com/gpucores': '50'},
                               'amd.com/gpucores'),
                              ({'amd.com/gpu': '1', 'amd.com/gpumem': '10'},
                               'amd.com/gpumem')):
            pod = _pod(limits)
            pod['metadata'].update(namespace='secure', labels={
                hami.WEBHOOK_LABEL: hami.WEBHOOK_IGNORE})
            message = self._denied(pod)
            self.assertIn('resources.limits[%s]' % field, message)
            self.assertIn("namespace 'secure' (labelled "
                          "amdgpu-virt.io/tenancy=isolated) only gets whole "
                          "GPUs: tenancy is isolated", message)

    def test_safe_env_passes(self) -> None:
        pod = _pod({'amd.com/gpucores': '10'}, env=[
            {'name': 'HIP_VISIBLE_DEVICES_X', 'value': '1'}], envFrom=[
            {'prefix': 'APP_', 'configMapRef': {'name': 'cfg'}}])
        self.assertTrue(self._review(pod)['allowed'])

    def test_only_the_administrator_exempts_namespaces(self) -> None:
        pod = _pod({'amd.com/gpu': '1'}, securityContext={
            'privileged': True})
        pod['metadata']['namespace'] = 'ops'
        self.assertEqual({'uid': 'u-1', 'allowed': True}, self._review(pod))

    # -- threat 2: allocation annotations are not the tenant's -----------

    def test_creating_with_allocation_state_is_denied(self) -> None:
        for key, value in ((hami.DEVICES_ALLOCATED, 'g0,AMD,10,4:;'),
                           (hami.CU_ALLOCATED, '{"g0": "0-3"}'),
                           (hami.BIND_PHASE, 'success'),
                           (intent.DECISION_ANNOTATION, 'cu-slice')):
            pod = _pod({'amd.com/gpu': '1'})
            pod['metadata']['annotations'] = {key: value}
            message = self._denied(pod)
            self.assertIn('metadata.annotations[%s]' % key, message)
        pod = _pod({'amd.com/gpu': '1'})
        pod['metadata']['labels'] = {hami.VGPU_NODE: 'n1'}
        self.assertIn('metadata.labels[hami.io/vgpu-node]: allocation '
                      'state is written by the GPU scheduler only, not by '
                      'alice', self._denied(pod))

    def test_tenant_updates_of_allocation_state_are_denied(self) -> None:
        old = _pod({'amd.com/gpu': '1', 'amd.com/gpucores': '10'})
        old['metadata']['annotations'] = {
            hami.DEVICES_ALLOCATED: 'g0,AMD,100,30:;',
            hami.CU_ALLOCATED: '{"g0": "0-29"}', 'app': 'x'}
        attacks = {
            hami.CU_ALLOCATED: '{"g0": "300-303"}',   # make CUs look free
            hami.DEVICES_ALLOCATED: 'g0,AMD,1,1:;',
            hami.BIND_PHASE: 'success',
            hami.VGPU_NODE: 'n1',
        }
        for key, value in attacks.items():
            new = copy.deepcopy(old)
            new['metadata']['annotations'][key] = value
            message = self._denied(new, 'UPDATE', old)
            self.assertIn('metadata.annotations[%s]' % key, message)
            self.assertIn('not alice', message)
        removed = copy.deepcopy(old)
        del removed['metadata']['annotations'][hami.CU_ALLOCATED]
        self.assertIn(hami.CU_ALLOCATED, self._denied(removed, 'UPDATE',
                                                      old))
        # the tenant's own annotations stay the tenant's
        mine = copy.deepcopy(old)
        mine['metadata']['annotations']['app'] = 'y'
        self.assertTrue(self._review(mine, 'UPDATE', old)['allowed'])
        # the project's service accounts write the allocation
        for user, key in ((SCHEDULER, hami.DEVICES_ALLOCATED),
                          (NODE_AGENT, hami.CU_ALLOCATED)):
            new = copy.deepcopy(old)
            new['metadata']['annotations'][key] = attacks[key]
            self.assertTrue(self._review(new, 'UPDATE', old, user=user)[
                'allowed'])

    def test_stated_needs_cannot_be_changed_later(self) -> None:
        old = _pod({'amd.com/gpu': '1'})
        old['metadata']['annotations'] = {
            intent.ANNOTATION: 'compute: 25%',
            intent.DECISION_ANNOTATION: 'whole'}
        new = copy.deepcopy(old)
        new['metadata']['annotations'][intent.DECISION_ANNOTATION] = \
            'cu-slice'
        self.assertIn(intent.DECISION_ANNOTATION,
                      self._denied(new, 'UPDATE', old))

    def test_kubectl_debug_gets_no_gpu_and_no_privilege(self) -> None:
        # kubectl debug: UPDATE of pods/ephemeralcontainers with the
        # whole Pod
        gpu = _pod({'amd.com/gpu': '1', 'amd.com/gpucores': '50'})
        gpu['metadata']['annotations'] = {
            hami.DEVICES_ALLOCATED: 'g0,AMD,1024,152:;'}
        for container, reason in (
                ({'securityContext': {'privileged': True}},
                 'securityContext.privileged'),
                ({'env': [{'name': 'HSA_CU_MASK', 'value': '0:0-303'}]},
                 'env[0] (HSA_CU_MASK): set by the GPU device plugin'),
                ({'env': [{'name': 'LD_AUDIT', 'value': ''}]},
                 'env[0] (LD_AUDIT)'),
                ({'resources': {'limits': {'amd.com/gpu': '1'}}},
                 'resources.limits[amd.com/gpu]: an ephemeral container '
                 'gets no GPU')):
            debugged = copy.deepcopy(gpu)
            debugged['spec']['ephemeralContainers'] = [{
                'name': 'debugger', 'image': 'busybox',
                'targetContainerName': 'main', **container}]
            message = self._denied(debugged, 'UPDATE', gpu)
            self.assertIn("ephemeral container 'debugger' "
                          '(spec.ephemeralContainers[0]): ' + reason,
                          message)
        debugged = copy.deepcopy(gpu)
        debugged['spec']['ephemeralContainers'] = [{
            'name': 'debugger', 'image': 'busybox'}]
        self.assertTrue(self._review(debugged, 'UPDATE', gpu)['allowed'])

    # -- stated needs over HTTP ------------------------------------------

    def test_stated_needs_and_raw_resources_must_agree(self) -> None:
        pod = _pod({'amd.com/gpu': '1', 'amd.com/gpucores': '90'})
        pod['metadata']['annotations'] = {intent.ANNOTATION: 'compute: 25%'}
        self.assertIn('state either gpu.amd.com/workload or raw '
                      'amd.com/gpu resources, not both', self._denied(pod))
        pod = _pod()
        pod['metadata']['annotations'] = {
            intent.ANNOTATION: 'compute: 25%, memory: 20GiB'}
        response = self._review(pod)
        self.assertTrue(response['allowed'])
        # the same pod as mutated: a second call (reinvocation) agrees
        pod['spec']['containers'][0]['resources'] = {'limits': {
            'amd.com/gpu': '1', 'amd.com/gpucores': '25',
            'amd.com/gpumem': '20480'}}
        self.assertTrue(self._review(pod)['allowed'])

    def test_hostile_statements_are_denied(self) -> None:
        for needs, reason in (
                ('{memory: [', 'nested'),
                ('{memory: 1', 'not YAML or JSON'),
                ('a: &x 1\nb: *x', 'YAML aliases are not accepted'),
                ('memory: 1GiB, model: MI300X', 'unknown field(s) model'),
                ('compute: 12.5%', 'not a whole percentage'),
                ('x' * 5000, 'at most 512 are read'),
                ('42', 'expected a mapping')):
            pod = _pod()
            pod['metadata']['annotations'] = {intent.ANNOTATION: needs}
            self.assertIn(reason, self._denied(pod), needs)


class DraClaimTest(_WebhookTest):
    """With ``webhook_dra_claims``, stated needs become a claim of the DRA
    driver's DeviceClass (the template written through the real client
    into the stand-in's resource.k8s.io/v1 ResourceClaimTemplates)."""

    def setUp(self) -> None:
        super().setUp()
        api = self.kube.api
        self.resource_api = client.ResourceV1Api(api.api_client)
        self.server.intent = admission.IntentPolicy(
            self.server.intent.engine, self.server.intent.models, dra=True,
            templates=webhookapi.ClaimTemplates(self.resource_api))

    def _claimed(self, namespace: str) -> tuple[dict[str, Any],
                                                dict[str, Any]]:
        pod = _pod()
        pod['metadata'].update(namespace=namespace, annotations={
            intent.ANNOTATION: 'memory: 20GiB, compute: 25%'})
        response = self._review(pod)
        self.assertTrue(response['allowed'], response)
        patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(
            response['patch'])))
        (entry,) = patched['spec']['resourceClaims']
        self.assertEqual(intent.CLAIM_NAME, entry['name'])
        self.assertEqual([{'name': intent.CLAIM_NAME}], patched['spec'][
            'containers'][0]['resources']['claims'])
        self.assertNotIn('limits', patched['spec']['containers'][0][
            'resources'])
        self.assertNotIn('schedulerName', patched['spec'])
        response = self.resource_api.read_namespaced_resource_claim_template(
            entry['resourceClaimTemplateName'], namespace,
            _preload_content=False)
        return patched, json.loads(response.data)['spec']['spec']['devices'][
            'requests'][0]['exactly']

    def test_share_or_whole_gpu_claims(self) -> None:
        patched, request = self._claimed('shared')
        self.assertEqual({'allocationMode': 'ExactCount', 'count': 1,
                          'deviceClassName': 'share.gpu.amd.com',
                          'capacity': {'requests': {
                              'computeUnits': '76', 'memory': '20Gi'}}},
                         request)
        self.assertEqual('cu-slice', patched['metadata']['annotations'][
            intent.DECISION_ANNOTATION])
        _patched, request = self._claimed('secure')
        self.assertEqual({'allocationMode': 'ExactCount', 'count': 1,
                          'deviceClassName': 'gpu.amd.com'}, request)
        # a second pod with the same needs reuses the template
        self._claimed('shared')

    def test_a_tampered_template_is_refused(self) -> None:
        pod = _pod()
        pod['metadata']['annotations'] = {
            intent.ANNOTATION: 'memory: 20GiB, compute: 25%'}
        name = json.loads(base64.b64decode(self._review(pod)['patch']))
        template = [op['value'] for op in name
                    if op['path'] == '/spec/resourceClaims'][0][0][
            'resourceClaimTemplateName']
        self.resource_api.delete_namespaced_resource_claim_template(
            template, 'shared')
        self.resource_api.create_namespaced_resource_claim_template(
            'shared', {'apiVersion': 'resource.k8s.io/v1',
                       'kind': 'ResourceClaimTemplate',
                       'metadata': {'name': template},
                       'spec': {'spec': {'devices': {'requests': [{
                           'name': 'gpu', 'exactly': {
                               'deviceClassName': 'gpu.amd.com',
                               'count': 8}}]}}}})
        self.assertIn('exists with another spec', self._denied(pod))
