"""The API server stand-in's authentication, RBAC and admission chain.

These are the semantics the threat tests rely on, tested on their own
through the real ``kubernetes`` client.
"""

from __future__ import annotations

import json
from typing import Any

import testtools
from kubernetes import client
from kubernetes.client import exceptions as k8s_exceptions

from tests.functional.fixtures import apiauth
from tests.functional.fixtures import kubeclient

TOKENS = {
    'alice': apiauth.UserInfo('alice', ('devs', 'system:authenticated')),
    'bob': apiauth.UserInfo('bob'),
    'node-a': apiauth.service_account('amdgpu-virt', 'amdgpu-virt-node',
                                      node='a'),
}


def _pod(name: str, namespace: str = 'team',
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {'metadata': {'name': name, 'namespace': namespace,
                         'annotations': annotations or {}},
            'spec': {'containers': [{'name': 'c', 'image': 'x'}]}}


class AuthTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture(
            tokens=TOKENS))
        self.admin = self.kube.api
        self.rbac = client.RbacAuthorizationV1Api(self.kube.api_client)
        self.admission = client.AdmissionregistrationV1Api(
            self.kube.api_client)
        for namespace in ('team', 'other'):
            self.admin.create_namespace({'metadata': {'name': namespace}})

    def _as(self, token: str | None) -> client.CoreV1Api:
        return client.CoreV1Api(self.kube.client_for(token))

    def _status(self, func: Any, *args: Any, **kwargs: Any) -> int:
        try:
            func(*args, **kwargs)
        except k8s_exceptions.ApiException as err:
            return int(err.status)
        return 200

    # -- authentication and RBAC ---------------------------------------

    def test_no_or_unknown_token_is_401(self) -> None:
        for token in (None, 'forged'):
            self.assertEqual(401, self._status(self._as(token).list_node))

    def test_role_in_one_namespace(self) -> None:
        self.rbac.create_namespaced_role('team', {
            'metadata': {'name': 'pods-read'},
            'rules': [{'apiGroups': [''], 'resources': ['pods'],
                       'verbs': ['get', 'list']}]})
        self.rbac.create_namespaced_role_binding('team', {
            'metadata': {'name': 'alice'},
            'roleRef': {'apiGroup': 'rbac.authorization.k8s.io',
                        'kind': 'Role', 'name': 'pods-read'},
            'subjects': [{'kind': 'User', 'name': 'alice'}]})
        self.admin.create_namespaced_pod('team', _pod('p'))
        self.admin.create_namespaced_pod('other', _pod('p', 'other'))
        alice = self._as('alice')
        self.assertEqual(200, self._status(alice.read_namespaced_pod, 'p',
                                           'team'))
        self.assertEqual(200, self._status(alice.list_namespaced_pod,
                                           'team'))
        err = self.assertRaises(k8s_exceptions.ApiException,
                                alice.patch_namespaced_pod, 'p', 'team',
                                {'metadata': {'labels': {'a': 'b'}}})
        self.assertEqual(403, err.status)
        self.assertIn('User "alice" cannot patch resource "pods" in API '
                      'group "" in the namespace "team"',
                      json.loads(err.body)['message'])
        self.assertEqual(403, self._status(alice.read_namespaced_pod, 'p',
                                           'other'))
        self.assertEqual(403, self._status(self._as('bob').read_namespaced_pod,
                                           'p', 'team'))

    def test_cluster_role_groups_service_accounts_names_subresources(
            self) -> None:
        self.rbac.create_cluster_role({
            'metadata': {'name': 'binder'},
            'rules': [{'apiGroups': [''], 'resources': ['pods/binding'],
                       'verbs': ['create']},
                      {'apiGroups': [''], 'resources': ['nodes'],
                       'resourceNames': ['a'], 'verbs': ['get', 'patch']}]})
        self.rbac.create_cluster_role_binding({
            'metadata': {'name': 'binder'},
            'roleRef': {'apiGroup': 'rbac.authorization.k8s.io',
                        'kind': 'ClusterRole', 'name': 'binder'},
            'subjects': [{'kind': 'Group', 'name': 'devs'},
                         {'kind': 'ServiceAccount', 'name':
                          'amdgpu-virt-node', 'namespace': 'amdgpu-virt'}]})
        for name in ('a', 'b'):
            self.admin.create_node({'metadata': {'name': name}})
        self.admin.create_namespaced_pod('team', _pod('p'))
        node = self._as('node-a')
        self.assertEqual(200, self._status(node.read_node, 'a'))
        self.assertEqual(403, self._status(node.read_node, 'b'))
        self.assertEqual(403, self._status(node.list_node))
        alice = self._as('alice')
        # pods/binding is not pods
        self.assertEqual(403, self._status(alice.read_namespaced_pod, 'p',
                                           'team'))
        self.assertEqual(200, self._status(
            alice.create_namespaced_pod_binding, 'p', 'team',
            {'metadata': {'name': 'p'}, 'target': {'kind': 'Node',
                                                   'name': 'a'}},
            _preload_content=False))
        self.assertEqual('a', self.admin.read_namespaced_pod(
            'p', 'team').spec.node_name)

    # -- admission -------------------------------------------------------

    def _policy(self, name: str, validations: list[dict[str, Any]],
                operations: tuple[str, ...] = ('CREATE', 'UPDATE'),
                bind: bool = True, actions: tuple[str, ...] = ('Deny',),
                **spec: Any) -> None:
        body = {'metadata': {'name': name}, 'spec': {
            'matchConstraints': {'resourceRules': [{
                'apiGroups': [''], 'apiVersions': ['v1'],
                'operations': list(operations), 'resources': ['pods']}]},
            'validations': validations, **spec}}
        self.admission.create_validating_admission_policy(body)
        if bind:
            self.admission.create_validating_admission_policy_binding({
                'metadata': {'name': name + '-binding'},
                'spec': {'policyName': name,
                         'validationActions': list(actions)}})

    def test_validation_denies_with_its_message(self) -> None:
        self._policy('no-foo', [{
            'expression': "!has(object.metadata.labels) || "
                          "!('foo' in object.metadata.labels)",
            'message': 'label foo is not allowed'}])
        err = self.assertRaises(
            k8s_exceptions.ApiException, self.admin.create_namespaced_pod,
            'team', dict(_pod('p'), metadata={'name': 'p', 'labels': {
                'foo': '1'}}))
        self.assertEqual(422, err.status)
        self.assertIn("ValidatingAdmissionPolicy 'no-foo' with binding "
                      "'no-foo-binding' denied request: label foo is not "
                      "allowed", err.body)
        self.assertIsNone(self.kube.server.get_object('pods', 'p', 'team'))
        self.admin.create_namespaced_pod('team', _pod('q'))

    def test_old_object_request_and_operations(self) -> None:
        # only UPDATE: an annotation may not change, except by bob
        self._policy('frozen', [{
            'expression': "request.userInfo.username == 'bob' || "
                          "object.metadata.annotations['x'] == "
                          "oldObject.metadata.annotations['x']",
            'messageExpression': "'x may not change from ' + "
                                 "oldObject.metadata.annotations['x']",
            'reason': 'Forbidden'}], operations=('UPDATE',))
        self.rbac.create_cluster_role({
            'metadata': {'name': 'pods'}, 'rules': [{
                'apiGroups': [''], 'resources': ['pods'], 'verbs': ['*']}]})
        self.rbac.create_cluster_role_binding({
            'metadata': {'name': 'bob'},
            'roleRef': {'kind': 'ClusterRole', 'name': 'pods',
                        'apiGroup': 'rbac.authorization.k8s.io'},
            'subjects': [{'kind': 'User', 'name': 'bob'},
                         {'kind': 'User', 'name': 'alice'}]})
        self.admin.create_namespaced_pod('team', _pod('p', annotations={
            'x': '1'}))
        patch = {'metadata': {'annotations': {'x': '2'}}}
        err = self.assertRaises(
            k8s_exceptions.ApiException,
            self._as('alice').patch_namespaced_pod, 'p', 'team', patch)
        self.assertEqual(403, err.status)
        self.assertIn('x may not change from 1', err.body)
        self._as('bob').patch_namespaced_pod('p', 'team', patch)
        self.assertEqual('2', self.kube.server.get_object(
            'pods', 'p', 'team')['metadata']['annotations']['x'])
        # DELETE is not matched
        self._as('alice').delete_namespaced_pod('p', 'team')

    def test_failure_policy_match_conditions_variables_and_bindings(
            self) -> None:
        broken = [{'expression': "object.metadata.annotations['missing'] "
                                 "== 'x'"}]
        self._policy('fails-closed', broken, operations=('CREATE',),
                     matchConditions=[{
                         'name': 'only-a', 'expression':
                         "object.metadata.name.startsWith('a')"}])
        self._policy('fails-open', broken, operations=('CREATE',),
                     failurePolicy='Ignore')
        self._policy('unbound', [{'expression': 'false'}], bind=False)
        self._policy('warn-only', [{'expression': 'false'}],
                     actions=('Warn',))
        self._policy('with-variables', [{
            'expression': 'variables.gpus <= 2',
            'message': 'at most 2 GPUs'}], variables=[
            {'name': 'limits', 'expression':
             "object.spec.containers.map(c, has(c.resources) && "
             "has(c.resources.limits) && 'amd.com/gpu' in "
             "c.resources.limits ? int(c.resources.limits['amd.com/gpu']) "
             ": 0)"},
            {'name': 'gpus', 'expression':
             'variables.limits.size() == 0 ? 0 : variables.limits[0]'}])
        err = self.assertRaises(k8s_exceptions.ApiException,
                                self.admin.create_namespaced_pod, 'team',
                                _pod('a1'))
        self.assertEqual(422, err.status)
        self.assertIn("'fails-closed'", err.body)
        self.assertIn('expression', err.body)
        self.admin.create_namespaced_pod('team', _pod('b1'))
        big = _pod('b2')
        big['spec']['containers'][0]['resources'] = {'limits': {
            'amd.com/gpu': '3'}}
        err = self.assertRaises(k8s_exceptions.ApiException,
                                self.admin.create_namespaced_pod, 'team',
                                big)
        self.assertIn('at most 2 GPUs', err.body)

    def test_namespace_selector_of_the_binding(self) -> None:
        self.admin.patch_namespace('other', {'metadata': {'labels': {
            'strict': 'yes'}}})
        self.admission.create_validating_admission_policy({
            'metadata': {'name': 'strict'}, 'spec': {
                'matchConstraints': {'resourceRules': [{
                    'apiGroups': [''], 'apiVersions': ['v1'],
                    'operations': ['CREATE'], 'resources': ['pods']}]},
                'validations': [{'expression': 'false',
                                 'message': 'strict namespace'}]}})
        self.admission.create_validating_admission_policy_binding({
            'metadata': {'name': 'strict'}, 'spec': {
                'policyName': 'strict', 'validationActions': ['Deny'],
                'matchResources': {'namespaceSelector': {
                    'matchLabels': {'strict': 'yes'}}}}})
        self.admin.create_namespaced_pod('team', _pod('p'))
        err = self.assertRaises(k8s_exceptions.ApiException,
                                self.admin.create_namespaced_pod, 'other',
                                _pod('p', 'other'))
        self.assertIn('strict namespace', err.body)

    def test_uid_preconditions(self) -> None:
        self.admin.create_node({'metadata': {'name': 'a'}})
        self.admin.create_namespaced_pod('team', _pod('p'))
        err = self.assertRaises(
            k8s_exceptions.ApiException, self.admin.patch_namespaced_pod,
            'p', 'team', {'metadata': {'uid': 'other', 'labels': {'a': 'b'}}})
        self.assertEqual(409, err.status)
        self.assertIn('Precondition failed: UID', err.body)
        err = self.assertRaises(
            k8s_exceptions.ApiException,
            self.admin.create_namespaced_pod_binding, 'p', 'team',
            {'metadata': {'name': 'p', 'uid': 'other'},
             'target': {'kind': 'Node', 'name': 'a'}},
            _preload_content=False)
        self.assertEqual(409, err.status)
        self.assertIsNone(self.kube.server.get_object(
            'pods', 'p', 'team')['spec'].get('nodeName'))
