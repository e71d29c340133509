"""Tenants and nodes attack through the API with their own tokens.

The API server stand-in authenticates bearer tokens, authorizes with RBAC
and runs ValidatingAdmissionPolicies with a real CEL engine (see
:mod:`tests.functional.fixtures.apiauth`). The RBAC objects and the
policies below are the ones the project's manifests describe: a tenant
owns the pods of its namespace and nothing else; the node account may
read and patch nodes and pods and read the allocation records; only the
project's accounts may change ``hami.io/*`` pod annotations, and a node's
account only its own Node and the pods bound to it.

Threat 2: a tenant creates or patches ``hami.io/*`` annotations on its
pod, to claim a GPU, to make its CUs look free, or to poison a node.
Threat 4: a node's token patches another node or another node's pod, or
writes an allocation record. Each attack must fail, and nothing that was
booked or allocated may be lost.
"""

from __future__ import annotations

import json
from typing import Any

import testtools
from kubernetes import client
from kubernetes.client import exceptions as k8s_exceptions

from amdgpu_virt.k8s import allocrecord
from amdgpu_virt.k8s import recordstore
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import apiauth
from tests.functional.fixtures import kubeclient
from tests.functional.k8s import cluster

NAMESPACE = 'amdgpu-virt'
SCHEDULER = 'system:serviceaccount:%s:amdgpu-virt-scheduler' % NAMESPACE
NODE = 'system:serviceaccount:%s:amdgpu-virt-node' % NAMESPACE
TOKENS = {
    'tenant': apiauth.UserInfo('tenant'),
    'node-a': apiauth.service_account(NAMESPACE, 'amdgpu-virt-node', 'a'),
    'scheduler': apiauth.service_account(NAMESPACE, 'amdgpu-virt-scheduler'),
}
_RBAC = 'rbac.authorization.k8s.io'


def _role(kind: str, name: str, rules: list[dict[str, Any]],
          namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {'name': name}
    if namespace:
        meta['namespace'] = namespace
    return {'apiVersion': '%s/v1' % _RBAC, 'kind': kind, 'metadata': meta,
            'rules': rules}


def _rule(resources: list[str], verbs: list[str],
          group: str = '') -> dict[str, Any]:
    return {'apiGroups': [group], 'resources': resources, 'verbs': verbs}


#: the RBAC of the manifests (least privilege, as they list it)
RBAC = [
    ('roles', _role('Role', 'tenant', [
        _rule(['pods'], ['get', 'list', 'watch', 'create', 'update',
                         'patch', 'delete'])], 'team'),
     'rolebindings', 'User', 'tenant', 'team'),
    ('clusterroles', _role('ClusterRole', 'amdgpu-virt-node', [
        _rule(['nodes'], ['get', 'list', 'watch', 'patch']),
        _rule(['pods'], ['get', 'list', 'watch', 'patch'])]),
     'clusterrolebindings', 'ServiceAccount', 'amdgpu-virt-node', None),
    ('roles', _role('Role', 'amdgpu-virt-node-records', [
        _rule(['configmaps'], ['get', 'list', 'watch'])], NAMESPACE),
     'rolebindings', 'ServiceAccount', 'amdgpu-virt-node', NAMESPACE),
    ('clusterroles', _role('ClusterRole', 'amdgpu-virt-scheduler', [
        _rule(['nodes'], ['get', 'list', 'watch', 'patch']),
        _rule(['pods'], ['get', 'list', 'watch', 'patch']),
        _rule(['pods/binding'], ['create'])]),
     'clusterrolebindings', 'ServiceAccount', 'amdgpu-virt-scheduler', None),
    ('roles', _role('Role', 'amdgpu-virt-scheduler-records', [
        _rule(['configmaps'], ['get', 'list', 'watch', 'create', 'update',
                               'patch'])], NAMESPACE),
     'rolebindings', 'ServiceAccount', 'amdgpu-virt-scheduler', NAMESPACE),
]

_HAMI_KEYS = ("(has(o.metadata.annotations) ? "
              "o.metadata.annotations.filter(k, k.startsWith('hami.io/'))"
              " : [])")

#: the admission policies of the manifests
POLICIES = [
    {'metadata': {'name': 'amdgpu-virt-hami-annotations'}, 'spec': {
        'failurePolicy': 'Fail',
        'matchConstraints': {'resourceRules': [{
            'apiGroups': [''], 'apiVersions': ['v1'],
            'operations': ['CREATE', 'UPDATE'], 'resources': ['pods']}]},
        'matchConditions': [{'name': 'not-the-project', 'expression':
                             "!(request.userInfo.username in ['%s', '%s'])"
                             % (SCHEDULER, NODE)}],
        'variables': [
            {'name': 'new', 'expression': '[object].map(o, %s)[0]'
             % _HAMI_KEYS},
            {'name': 'old', 'expression':
             "oldObject == null ? [] : [oldObject].map(o, %s)[0]"
             % _HAMI_KEYS}],
        'validations': [{
            'expression':
                "variables.new.size() == variables.old.size() && "
                "variables.new.all(k, k in variables.old && "
                "object.metadata.annotations[k] == "
                "oldObject.metadata.annotations[k])",
            'message': 'hami.io/* annotations of pods are written only by '
                       'the amdgpu-virt scheduler and node accounts'}]}},
    {'metadata': {'name': 'amdgpu-virt-node-restriction'}, 'spec': {
        'failurePolicy': 'Fail',
        'matchConstraints': {'resourceRules': [{
            'apiGroups': [''], 'apiVersions': ['v1'],
            'operations': ['UPDATE'], 'resources': ['nodes', 'pods',
                                                    'nodes/status',
                                                    'pods/status']}]},
        'matchConditions': [{'name': 'node-account', 'expression':
                             "request.userInfo.username == '%s'" % NODE}],
        'variables': [{'name': 'node', 'expression':
                       "'%s' in request.userInfo.extra ? "
                       "request.userInfo.extra['%s'][0] : ''"
                       % ((apiauth.NODE_NAME_EXTRA,) * 2)}],
        'validations': [{
            'expression':
                "variables.node != '' && (request.resource.resource == "
                "'nodes' ? object.metadata.name == variables.node : "
                "has(oldObject.spec.nodeName) && "
                "oldObject.spec.nodeName == variables.node)",
            'message': 'a node account writes only its own Node and the '
                       'pods bound to it'}]}},
]


class ThreatTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture(
            tokens=TOKENS))
        self.admin = self.kube.api
        for name in ('team', NAMESPACE):
            self.admin.create_namespace({'metadata': {'name': name}})
        rbac = client.RbacAuthorizationV1Api(self.kube.api_client)
        for plural, role, bplural, kind, subject, namespace in RBAC:
            name = role['metadata']['name']
            if plural == 'roles':
                rbac.create_namespaced_role(namespace, role)
            else:
                rbac.create_cluster_role(role)
            subjects = [{'kind': kind, 'name': subject}]
            if kind == 'ServiceAccount':
                subjects[0]['namespace'] = NAMESPACE
            binding = {'metadata': {'name': name}, 'subjects': subjects,
                       'roleRef': {'apiGroup': _RBAC, 'kind': role['kind'],
                                   'name': name}}
            if bplural == 'rolebindings':
                rbac.create_namespaced_role_binding(namespace, binding)
            else:
                rbac.create_cluster_role_binding(binding)
        admission = client.AdmissionregistrationV1Api(self.kube.api_client)
        for policy in POLICIES:
            admission.create_validating_admission_policy(policy)
            admission.create_validating_admission_policy_binding({
                'metadata': {'name': policy['metadata']['name']},
                'spec': {'policyName': policy['metadata']['name'],
                         'validationActions': ['Deny']}})
        for name in ('a', 'b'):
            self.admin.create_node({'metadata': {'name': name}})
        self.tenant = client.CoreV1Api(self.kube.client_for('tenant'))
        self.node = client.CoreV1Api(self.kube.client_for('node-a'))
        self.scheduler = client.CoreV1Api(self.kube.client_for('scheduler'))
        self.records = recordstore.RecordStore(self.scheduler)
        # a tenant pod the scheduler placed and the node allocated on a
        self.gpu = 'abcdef0123456789'
        self.capacity = {self.gpu: allocrecord.Capacity(10, 65536, 304)}
        self.pod = self._placed('job', 'a')

    def _placed(self, name: str, node: str) -> dict[str, Any]:
        pod = self.tenant.create_namespaced_pod('team', cluster.gpu_pod(
            name, [{'amd.com/gpu': '1', 'amd.com/gpucores': '50'}]),
            _preload_content=False)
        obj = json.loads(pod.data)
        devices = ((hami.ContainerDevice(self.gpu, 'AMD', 1024, 152),),)
        record = self.records.update(node, lambda r: allocrecord.book(
            r, obj['metadata']['uid'], 'team', name, 1, devices,
            self.capacity))
        value = hami.encode_pod_devices(devices)
        masks = record.pods[obj['metadata']['uid']].masks()
        self.scheduler.patch_namespaced_pod(name, 'team', {'metadata': {
            'annotations': {hami.DEVICES_ALLOCATED: value,
                            hami.DEVICES_TO_ALLOCATE: value,
                            hami.VGPU_NODE: node,
                            hami.CU_ALLOCATED: hami.encode_cu_allocated(
                                masks)}}})
        self.scheduler.create_namespaced_pod_binding(
            name, 'team', {'metadata': {'name': name,
                                        'uid': obj['metadata']['uid']},
                           'target': {'kind': 'Node', 'name': node}},
            _preload_content=False)
        return self.kube.server.get_object('pods', name, 'team')

    def _refused(self, func: Any, *args: Any, **kwargs: Any) -> str:
        err = self.assertRaises(k8s_exceptions.ApiException, func, *args,
                                **kwargs)
        self.assertIn(err.status, (403, 422), err.body)
        return str(json.loads(err.body)['message'])

    # -- threat 2: the tenant -------------------------------------------

    def test_tenant_cannot_claim_a_gpu_at_create(self) -> None:
        pod = cluster.gpu_pod('claim', [{'amd.com/gpu': '1'}], annotations={
            hami.DEVICES_ALLOCATED: '%s,AMD,65536,304:;' % self.gpu,
            hami.VGPU_NODE: 'a', hami.BIND_PHASE: 'allocating'})
        message = self._refused(self.tenant.create_namespaced_pod, 'team',
                                pod)
        self.assertIn('amdgpu-virt-hami-annotations', message)
        self.assertIsNone(self.kube.server.get_object('pods', 'claim',
                                                      'team'))

    def test_tenant_cannot_change_what_its_pod_holds(self) -> None:
        record = self.records.read('a')[0]
        attacks = [
            # make its CUs look free, so they are handed to a second pod
            {hami.CU_ALLOCATED: None},
            {hami.CU_ALLOCATED: '{"%s":"0"}' % self.gpu},
            # claim the whole GPU
            {hami.DEVICES_ALLOCATED: '%s,AMD,65536,304:;' % self.gpu},
            # poison the node: unreadable values tied to it
            {hami.DEVICES_ALLOCATED: 'garbage', hami.VGPU_NODE: 'b'},
            {hami.BIND_PHASE: 'allocating', hami.BIND_TIME: '1'},
            {hami.NODE_LOCK: 'x'},
        ]
        for annotations in attacks:
            for content_type in ('application/merge-patch+json',
                                 'application/strategic-merge-patch+json'):
                message = self._refused(
                    self.tenant.patch_namespaced_pod, 'job', 'team',
                    {'metadata': {'annotations': annotations}},
                    _content_type=content_type)
                self.assertIn('written only by the amdgpu-virt', message)
        # a JSON patch that removes every annotation
        self._refused(self.tenant.patch_namespaced_pod, 'job', 'team',
                      [{'op': 'remove', 'path': '/metadata/annotations'}])
        # nothing lost
        self.assertEqual(self.pod, self.kube.server.get_object(
            'pods', 'job', 'team'))
        self.assertEqual(record, self.records.read('a')[0])
        # the tenant still manages its pod otherwise
        self.tenant.patch_namespaced_pod('job', 'team', {'metadata': {
            'labels': {'app': 'x'}}})

    def test_tenant_cannot_write_records_or_nodes(self) -> None:
        name = allocrecord.configmap_name('a')
        self._refused(self.tenant.patch_namespaced_config_map, name,
                      NAMESPACE, {'data': {'allocations': '{}'}})
        self._refused(self.tenant.delete_namespaced_config_map, name,
                      NAMESPACE)
        self._refused(self.tenant.patch_node, 'a', {'metadata': {
            'annotations': {hami.NODE_LOCK: 'x'}}})
        self._refused(self.tenant.read_namespaced_config_map, name,
                      NAMESPACE)

    # -- threat 4: a node's token ---------------------------------------

    def test_node_token_stays_on_its_node(self) -> None:
        other = self._placed('elsewhere', 'b')
        nodes = {n: self.kube.server.get_object('nodes', n)
                 for n in ('a', 'b')}
        records = {n: self.records.read(n)[0] for n in ('a', 'b')}
        lock = {'metadata': {'annotations': {hami.NODE_LOCK: 'x'}}}
        message = self._refused(self.node.patch_node, 'b', lock)
        self.assertIn('only its own Node', message)
        self._refused(self.node.patch_node_status, 'b', {'status': {
            'capacity': {'amd.com/gpu': '0'}}})
        self._refused(self.node.patch_namespaced_pod, 'elsewhere', 'team',
                      {'metadata': {'annotations': {
                          hami.BIND_PHASE: 'failed'}}})
        # the records are the scheduler's
        for node in ('a', 'b'):
            self._refused(self.node.patch_namespaced_config_map,
                          allocrecord.configmap_name(node), NAMESPACE,
                          {'data': {'allocations': '{}'}})
        self._refused(self.node.create_namespaced_config_map, NAMESPACE,
                      {'metadata': {'name': 'amdgpu-virt-alloc-c'}})
        self._refused(self.node.delete_namespaced_pod, 'job', 'team')
        # nothing lost
        for name in ('a', 'b'):
            self.assertEqual(nodes[name], self.kube.server.get_object(
                'nodes', name))
            self.assertEqual(records[name], self.records.read(name)[0])
        self.assertEqual(other, self.kube.server.get_object(
            'pods', 'elsewhere', 'team'))
        # what the node does write is allowed: its node, its pods, and it
        # reads its record
        self.node.patch_node('a', {'metadata': {'annotations': {
            hami.NODE_REGISTER: '[]'}}})
        self.node.patch_namespaced_pod('job', 'team', {'metadata': {
            'annotations': {hami.BIND_PHASE: 'success'}}})
        self.assertEqual(records['a'], recordstore.RecordStore(
            self.node).read('a')[0])
