"""Tenants and nodes attack through the API with their own tokens.

The API server stand-in authenticates bearer tokens, authorizes with RBAC
and runs ValidatingAdmissionPolicies with a real CEL engine (see
:mod:`tests.functional.fixtures.apiauth`). The project's RBAC objects and
admission policies are loaded from the shipped manifests
(``deploy/kubernetes/rbac.yaml``, ``admission-policies.yaml``); a tenant
owns the pods of its namespace and nothing else.

Threat 2: a tenant creates or patches ``hami.io/*`` annotations on its
pod, to claim a GPU, to make its CUs look free, or to poison a node.
Threat 4: a node's token patches another node or another node's pod, or
writes an allocation record. Each attack must fail, and nothing that was
booked or allocated may be lost.
"""

from __future__ import annotations

import json
import os
from typing import Any

import testtools
import yaml
from kubernetes import client
from kubernetes.client import exceptions as k8s_exceptions

from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import store as recordstore
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
MANIFESTS = os.path.join(os.path.dirname(__file__), '..', '..', '..',
                         'deploy', 'kubernetes')
_PLURALS = apiauth.PLURALS


def shipped(name: str) -> list[dict[str, Any]]:
    """The RBAC and admission objects of a shipped manifest."""
    with open(os.path.join(MANIFESTS, name)) as stream:
        return [doc for doc in yaml.safe_load_all(stream)
                if doc and doc.get('kind') in _PLURALS]


#: a tenant owns the pods of its namespace, and nothing else
TENANT = [
    {'kind': 'Role', 'metadata': {'name': 'tenant', 'namespace': 'team'},
     'rules': [{'apiGroups': [''], 'resources': ['pods'], 'verbs': [
         'get', 'list', 'watch', 'create', 'update', 'patch', 'delete']}]},
    {'kind': 'RoleBinding', 'metadata': {'name': 'tenant',
                                         'namespace': 'team'},
     'subjects': [{'kind': 'User', 'name': 'tenant'}],
     'roleRef': {'apiGroup': _RBAC, 'kind': 'Role', 'name': 'tenant'}},
]


class ThreatTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture(
            tokens=TOKENS))
        self.admin = self.kube.api
        for name in ('team', NAMESPACE):
            self.admin.create_namespace({'metadata': {'name': name}})
        # the project's RBAC and admission policies as the manifests
        # ship them
        objects = TENANT + shipped('rbac.yaml') + shipped(
            'admission-policies.yaml')
        self.assertIn('amdgpu-virt-allocation-annotations', [
            o['metadata']['name'] for o in objects])
        for obj in objects:
            self.kube.server.put_object(_PLURALS[obj['kind']], obj)
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
        self.assertIn('amdgpu-virt-allocation-annotations', message)
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
        ]
        for attack in attacks:
            for content_type in ('application/merge-patch+json',
                                 'application/strategic-merge-patch+json'):
                message = self._refused(
                    self.tenant.patch_namespaced_pod, 'job', 'team',
                    {'metadata': {'annotations': attack}},
                    _content_type=content_type)
                self.assertIn('may not set, change or remove the GPU '
                              'allocation annotation', message)
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

    def _label_attacks(self) -> list[tuple[Any, str]]:
        """Ways a tenant sets, moves or drops the allocation label of its
        pod (body, content type)."""
        merge = 'application/merge-patch+json'
        strategic = 'application/strategic-merge-patch+json'
        return [
            ({'metadata': {'labels': {hami.VGPU_NODE: 'b'}}}, merge),
            ({'metadata': {'labels': {hami.VGPU_NODE: 'b'}}}, strategic),
            ({'metadata': {'labels': {hami.VGPU_NODE: None}}}, merge),
            ({'metadata': {'labels': {hami.VGPU_NODE: ''}}}, strategic),
            ([{'op': 'replace', 'path': '/metadata/labels/hami.io~1vgpu-node',
               'value': 'b'}], 'application/json-patch+json'),
        ]

    def test_tenant_cannot_move_its_pod_between_nodes_by_label(self) -> None:
        # the scheduler labels the pod with the node it chose; a node's
        # pods are selected by that label
        self.scheduler.patch_namespaced_pod('job', 'team', {'metadata': {
            'labels': {hami.VGPU_NODE: 'a'}}})
        placed = self.kube.server.get_object('pods', 'job', 'team')
        for body, content_type in self._label_attacks():
            message = self._refused(self.tenant.patch_namespaced_pod, 'job',
                                    'team', body,
                                    _content_type=content_type)
            self.assertIn('may not set, change or remove the GPU '
                          'allocation label hami.io/vgpu-node of a pod',
                          message)
            self.assertIn('amdgpu-virt-allocation-annotations', message)
        # nor put it on a new pod, to be counted on a node it is not on
        pod = cluster.gpu_pod('squat', [{'amd.com/gpu': '1'}])
        pod['metadata']['labels'] = {hami.VGPU_NODE: 'b'}
        self._refused(self.tenant.create_namespaced_pod, 'team', pod)
        # nothing lost: the node's pods are the same
        self.assertEqual(placed, self.kube.server.get_object(
            'pods', 'job', 'team'))
        self.assertIsNone(self.kube.server.get_object('pods', 'squat',
                                                      'team'))
        self.assertEqual(['job'], [p.metadata.name for p in
                                   self.admin.list_namespaced_pod(
                                       'team', label_selector='%s=a' %
                                       hami.VGPU_NODE).items])
        # its other labels stay the tenant's, and the project writes it
        self.tenant.patch_namespaced_pod('job', 'team', {'metadata': {
            'labels': {'app': 'y'}}})
        self.scheduler.patch_namespaced_pod('job', 'team', {'metadata': {
            'labels': {hami.VGPU_NODE: 'b'}}})

    def test_without_the_label_rule_the_tenant_moves_it(self) -> None:
        # the control: the shipped policy minus its label validation lets
        # every attack above through, so the policy is what stops them
        (policy,) = [o for o in shipped('admission-policies.yaml')
                     if o['kind'] == 'ValidatingAdmissionPolicy' and
                     o['metadata']['name'] ==
                     'amdgpu-virt-allocation-annotations']
        validations = policy['spec']['validations']
        policy['spec']['validations'] = [
            v for v in validations if 'changedLabels' not in v['expression']]
        self.assertEqual(len(validations) - 1,
                         len(policy['spec']['validations']))
        client.AdmissionregistrationV1Api(
            self.admin.api_client).delete_validating_admission_policy(
                policy['metadata']['name'])
        self.kube.server.put_object('validatingadmissionpolicies', policy)
        self.scheduler.patch_namespaced_pod('job', 'team', {'metadata': {
            'labels': {hami.VGPU_NODE: 'a'}}})
        for body, content_type in self._label_attacks():
            self.tenant.patch_namespaced_pod('job', 'team', body,
                                             _content_type=content_type)
            self.scheduler.patch_namespaced_pod('job', 'team', {
                'metadata': {'labels': {hami.VGPU_NODE: 'a'}}})
        self.tenant.patch_namespaced_pod('job', 'team', {'metadata': {
            'labels': {hami.VGPU_NODE: 'b'}}})
        self.assertEqual('b', self.kube.server.get_object(
            'pods', 'job', 'team')['metadata']['labels'][hami.VGPU_NODE])

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
        self.assertIn('of node a may not write node b', message)
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
