"""deploy/dra and deploy/examples/dra: schemas, CEL, and fit.

Every object validates strictly against the Kubernetes schemas of 1.34
to 1.37; the DeviceClasses equal what the code renders; the admission
policies' CEL runs in a real CEL engine against the requests the API
server would send; the example claims fit the slices of a simulated
host when allocated by the allocator stand-in.
"""

from __future__ import annotations

import os

import cel
import kubernetes_validate
import testtools
import yaml

from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import devices
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.model import Role
from tests.functional.fixtures import draallocator as da
from tests.unit.k8s.dra import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))))
DEPLOY = os.path.join(ROOT, 'deploy', 'dra')
EXAMPLES = os.path.join(ROOT, 'deploy', 'examples', 'dra')
VERSIONS = ('1.34.0', '1.35.0', '1.36.0', '1.37.0')
NODE_ACCOUNT = 'system:serviceaccount:amdgpu-virt:amdgpu-virt-node'
NODE_NAME_KEY = 'authentication.kubernetes.io/node-name'


def load(directory, name):
    with open(os.path.join(directory, name)) as handle:
        return [d for d in yaml.safe_load_all(handle) if d]


def policy(name):
    for doc in load(DEPLOY, name):
        if doc['kind'] == 'ValidatingAdmissionPolicy':
            return doc
    raise AssertionError('no policy in %s' % name)


def admit(pol, request, obj=None, old=None, namespace=None):
    """(matched, allowed) as the API server evaluates ``pol``."""
    context = {'request': request, 'object': obj, 'oldObject': old,
               'namespaceObject': namespace}

    def run(expression, variables):
        ctx = dict(context, variables=variables)
        return cel.evaluate(expression, ctx)

    variables = {}
    for cond in pol['spec'].get('matchConditions', []):
        if run(cond['expression'], variables) is not True:
            return False, True
    for var in pol['spec'].get('variables', []):
        variables[var['name']] = run(var['expression'], variables)
    return True, all(run(v['expression'], variables) is True
                     for v in pol['spec']['validations'])


class TestSchemas(testtools.TestCase):

    def test_every_object_validates_strictly(self):
        names = [(DEPLOY, n) for n in sorted(os.listdir(DEPLOY))] + [
            (EXAMPLES, n) for n in sorted(os.listdir(EXAMPLES))]
        self.assertEqual(7, len(names))
        for directory, name in names:
            for doc in load(directory, name):
                for version in VERSIONS:
                    try:
                        kubernetes_validate.validate(doc, version,
                                                     strict=True)
                    except kubernetes_validate.ValidationError as err:
                        self.fail('%s %s: %s' % (name, version, err))

    def test_device_classes_are_what_the_code_renders(self):
        self.assertEqual(classes.device_classes('gpu.amd.com'),
                         load(DEPLOY, 'deviceclasses.yaml'))

    def test_every_cel_expression_compiles(self):
        for name in os.listdir(DEPLOY):
            for doc in load(DEPLOY, name):
                spec = doc.get('spec') or {}
                for item in (spec.get('matchConditions', []) +
                             spec.get('variables', []) +
                             spec.get('validations', [])):
                    cel.compile(item['expression'])
                for sel in spec.get('selectors', []):
                    cel.compile(sel['cel']['expression'])


class TestOwnNodeSlices(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.policy = policy('rbac.yaml')

    def request(self, node='node-1', user=NODE_ACCOUNT, extra=True):
        info = {'username': user}
        if extra is True:
            info['extra'] = {NODE_NAME_KEY: [node]}
        elif extra is not None:
            info['extra'] = extra
        return {'userInfo': info}

    def slice(self, node):
        return {'kind': 'ResourceSlice', 'spec': {'nodeName': node,
                                                  'driver': 'gpu.amd.com'}}

    def test_own_node_is_allowed(self):
        self.assertEqual((True, True), admit(
            self.policy, self.request(), self.slice('node-1')))
        self.assertEqual((True, True), admit(
            self.policy, self.request(), self.slice('node-1'),
            self.slice('node-1')))
        self.assertEqual((True, True), admit(
            self.policy, self.request(), None, self.slice('node-1')))

    def test_other_nodes_are_denied(self):
        for obj, old in ((self.slice('node-2'), None),
                         (self.slice('node-1'), self.slice('node-2')),
                         (None, self.slice('node-2')),
                         ({'kind': 'ResourceSlice', 'spec': {
                             'allNodes': True}}, None)):
            self.assertEqual((True, False), admit(
                self.policy, self.request(), obj, old), (obj, old))

    def test_tokens_without_the_node_claim_are_denied(self):
        for extra in (None, {}, {NODE_NAME_KEY: []},
                      {NODE_NAME_KEY: ['node-1', 'node-2']},
                      {'other': ['node-1']}):
            self.assertEqual((True, False), admit(
                self.policy, self.request(extra=extra),
                self.slice('node-1')), extra)

    def test_other_accounts_are_not_matched(self):
        self.assertEqual((False, True), admit(
            self.policy, self.request(user='system:node:node-1'),
            self.slice('node-2')))


class TestNoSharesWhenIsolated(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.policy = policy('tenancy.yaml')

    def ns(self, labels):
        meta = {'name': 'team'}
        if labels is not None:
            meta['labels'] = labels
        return {'metadata': meta}

    isolated = {'amdgpu-virt.io/tenancy': 'isolated'}

    def test_isolated_claims_of_shares_are_denied(self):
        claim = da.claim('c', [da.request('s', 'share.gpu.amd.com')])
        self.assertEqual((True, False), admit(
            self.policy, {}, claim, None, self.ns(self.isolated)))
        template = {'kind': 'ResourceClaimTemplate', 'spec': {
            'spec': {'devices': {'requests': [{
                'name': 'g', 'firstAvailable': [
                    {'name': 'a', 'deviceClassName': 'gpu.amd.com'},
                    {'name': 'b', 'deviceClassName':
                     'share.gpu.amd.com'}]}]}}}}
        self.assertEqual((True, False), admit(
            self.policy, {}, template, None, self.ns(self.isolated)))

    def test_isolated_whole_and_partition_claims_are_allowed(self):
        for cls in ('gpu.amd.com', 'partition.gpu.amd.com'):
            claim = da.claim('c', [da.request('g', cls)])
            self.assertEqual((True, True), admit(
                self.policy, {}, claim, None, self.ns(self.isolated)))
        empty = {'kind': 'ResourceClaim', 'spec': {}}
        self.assertEqual((True, True), admit(
            self.policy, {}, empty, None, self.ns(self.isolated)))

    def test_other_namespaces_are_not_matched(self):
        claim = da.claim('c', [da.request('s', 'share.gpu.amd.com')])
        for labels in (None, {}, {'amdgpu-virt.io/tenancy': 'shared'}):
            self.assertEqual((False, True), admit(
                self.policy, {}, claim, None, self.ns(labels)))


class TestExamplesFit(testtools.TestCase):

    def claim_of(self, name):
        template = load(EXAMPLES, name)[0]
        return {'metadata': {'name': 'c', 'namespace': 'default'},
                'spec': template['spec']['spec']}

    def allocate(self, kind, roles, name):
        inv = helpers.host(kind)
        ledger = helpers.roles(inv, 'n', *roles)
        alloc = da.Allocator(slices.build(devices.plan(
            'n', inv, ledger.for_host('n')), 'gpu.amd.com'),
            load(DEPLOY, 'deviceclasses.yaml'))
        return alloc.allocate(self.claim_of(name), 'n')

    def test_whole(self):
        result = self.allocate('mi300x-spx', [Role.K8S_DEDICATED],
                               'whole.yaml')
        self.assertEqual('gpu-0000-05-00-0',
                         result['devices']['results'][0]['device'])

    def test_partition(self):
        result = self.allocate('mi300x-cpx-nps4', [Role.K8S_DEDICATED],
                               'partition.yaml')
        self.assertEqual('gpu-0000-05-00-0-p0',
                         result['devices']['results'][0]['device'])

    def test_share(self):
        result = self.allocate('mi300x-spx', [Role.K8S_SHARED], 'share.yaml')
        self.assertEqual({'computeUnits': '76', 'memory': '48Gi'},
                         result['devices']['results'][0]['consumedCapacity'])
