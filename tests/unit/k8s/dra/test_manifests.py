"""The chart's DRA objects (dra.enabled) and deploy/examples/dra.

The chart is rendered by the real Helm engine. Every object validates
strictly against the Kubernetes schemas of 1.34 to 1.37; the
DeviceClasses equal what the code renders; the admission policies' CEL
runs in a real CEL engine against the requests the API server would
send; the example claims fit the slices of a simulated host when
allocated by the allocator stand-in.
"""

from __future__ import annotations

import os

import cel
import helm_python
import kubernetes_validate
import testtools
import yaml

from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import devices
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.model import Role
from tests.functional.fixtures import draallocator as da
from tests.unit.deploy import chart
from tests.unit.k8s.dra import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))))
EXAMPLES = os.path.join(ROOT, 'deploy', 'examples', 'dra')
VERSIONS = ('1.34.0', '1.35.0', '1.36.0', '1.37.0')
NODE_ACCOUNT = 'system:serviceaccount:amdgpu-virt:amdgpu-virt-node'
NODE_NAME_KEY = 'authentication.kubernetes.io/node-name'


def load(directory, name):
    with open(os.path.join(directory, name)) as handle:
        return [d for d in yaml.safe_load_all(handle) if d]


DRA_NAMES = {'amdgpu-virt-dra-plugin', 'amdgpu-virt-dra-own-node-slices',
             'amdgpu-virt-dra-no-shares-when-isolated'}


def dra_docs(values=None, namespace=chart.NAMESPACE):
    values = dict(values or {})
    values['dra'] = dict(values.get('dra') or {}, enabled=True)
    return [d for d in chart.documents(values, namespace)
            if d['metadata']['name'] in DRA_NAMES
            or d['kind'] == 'DeviceClass']


def policy(name, values=None, namespace=chart.NAMESPACE):
    return chart.find(dra_docs(values, namespace),
                      'ValidatingAdmissionPolicy', name)


OWN_NODE = 'amdgpu-virt-dra-own-node-slices'
NO_SHARES = 'amdgpu-virt-dra-no-shares-when-isolated'


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
        docs = dra_docs({'dra': {'extendedResourceName': 'amd.com/gpu'}})
        self.assertEqual(10, len(docs))
        for name in sorted(os.listdir(EXAMPLES)):
            docs.extend(load(EXAMPLES, name))
        for doc in docs:
            for version in VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as err:
                    self.fail('%s %s on %s: %s' % (
                        doc['kind'], doc['metadata']['name'], version, err))

    def test_helm_lint_is_clean_and_the_schema_checks_values(self):
        values = {'dra': {'enabled': True,
                          'extendedResourceName': 'amd.com/gpu'}}
        report = helm_python.lint(chart.CHART, values, strict=True,
                                  namespace=chart.NAMESPACE)
        self.assertEqual([], report['errors'])
        self.assertEqual([], [m for m in report['messages']
                              if m['severity'] >= 2])
        bad = helm_python.lint(chart.CHART, {'dra': {
            'enabled': True, 'driverName': 'Not A DNS Name'}},
            strict=True, namespace=chart.NAMESPACE)
        self.assertTrue(bad['errors'] or [
            m for m in bad['messages'] if m['severity'] >= 2])

    def test_nothing_by_default(self):
        self.assertEqual([], [d for d in chart.documents()
                              if d['metadata']['name'] in DRA_NAMES
                              or d['kind'] == 'DeviceClass'])

    def test_device_classes_are_what_the_code_renders(self):
        for driver, extended in (('gpu.amd.com', ''),
                                 ('gpu.example.org', 'example.org/gpu')):
            found = [d for d in dra_docs({'dra': {
                'driverName': driver, 'extendedResourceName': extended}})
                if d['kind'] == 'DeviceClass']
            self.assertEqual(classes.device_classes(driver, extended),
                             found)

    def test_daemonset_sockets_and_directories(self):
        (ds,) = [d for d in dra_docs() if d['kind'] == 'DaemonSet']
        spec = ds['spec']['template']['spec']
        (container,) = spec['containers']
        env = {e['name']: e.get('value', e.get('valueFrom'))
               for e in container['env']}
        self.assertEqual({'fieldRef': {'fieldPath': 'metadata.uid'}},
                         env['OS_DRA__POD_UID'])
        self.assertEqual('/var/lib/kubelet/plugins/gpu.amd.com',
                         env['OS_DRA__PLUGIN_DIR'])
        paths = {v['hostPath']['path'] for v in spec['volumes']
                 if 'hostPath' in v}
        self.assertTrue({'/var/lib/kubelet/plugins_registry',
                         '/var/lib/kubelet/plugins', '/var/run/cdi'}
                        <= paths)
        self.assertEqual('amdgpu-virt-node', spec['serviceAccountName'])
        self.assertEqual(1, ds['spec']['updateStrategy']['rollingUpdate'][
            'maxSurge'])

    def test_every_cel_expression_compiles(self):
        for doc in dra_docs():
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
        self.policy = policy(OWN_NODE)

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

    def test_the_release_namespace_names_the_account(self):
        other = policy(OWN_NODE, namespace='gpu-system')
        user = 'system:serviceaccount:gpu-system:amdgpu-virt-node'
        self.assertEqual((True, False), admit(
            other, self.request(user=user), self.slice('node-2')))
        self.assertEqual((False, True), admit(
            other, self.request(), self.slice('node-2')))


class TestNoSharesWhenIsolated(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.policy = policy(NO_SHARES)

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

    def test_the_label_and_driver_are_values(self):
        other = policy(NO_SHARES, {
            'isolatedNamespaceLabel': 'corp.example/secure=yes',
            'dra': {'driverName': 'gpu.example.org'}})
        claim = da.claim('c', [da.request('s', 'share.gpu.example.org')])
        self.assertEqual((True, False), admit(
            other, {}, claim, None,
            self.ns({'corp.example/secure': 'yes'})))
        self.assertEqual((False, True), admit(
            other, {}, claim, None, self.ns(self.isolated)))

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

    def allocator(self, kind, roles):
        inv = helpers.host(kind)
        ledger = helpers.roles(inv, 'n', *roles)
        return da.Allocator(slices.build(devices.plan(
            'n', inv, ledger.for_host('n')), 'gpu.amd.com'),
            [d for d in dra_docs() if d['kind'] == 'DeviceClass'])

    def allocate(self, kind, roles, name):
        return self.allocator(kind, roles).allocate(self.claim_of(name), 'n')

    def test_every_selector_compiles(self):
        for name in sorted(os.listdir(EXAMPLES)):
            for doc in load(EXAMPLES, name):
                if doc['kind'] != 'ResourceClaimTemplate':
                    continue
                for request in doc['spec']['spec']['devices']['requests']:
                    for sel in request['exactly'].get('selectors', []):
                        cel.compile(sel['cel']['expression'])

    def test_the_partition_is_a_cpx_one_on_a_mixed_node(self):
        # SPX, DPX, QPX and CPX GPUs side by side: the partition class
        # alone gives the first partition in PCI order, a 152-CU DPX one;
        # the example's selector gives a 38-CU CPX partition
        roles = [Role.K8S_DEDICATED] * 8
        inv = helpers.host('mi300x-mixed')
        cpx = next(g for g in inv.gpus if g.compute_partition == 'CPX'
                   and g.driver.value == 'amdgpu')
        alloc = self.allocator('mi300x-mixed', roles)
        (result,) = alloc.allocate(self.claim_of('partition.yaml'), 'n')[
            'devices']['results']
        self.assertTrue(result['device'].startswith(
            devices.gpu_label(cpx.address) + '-p'))
        self.assertEqual(38, cpx.partitions[0].compute_units)
        (plain,) = alloc.allocate({'spec': {'devices': {'requests': [{
            'name': 'p', 'exactly': {'deviceClassName':
                                     'partition.gpu.amd.com'}}]}}}, 'n')[
            'devices']['results']
        dpx = next(g for g in inv.gpus if g.compute_partition == 'DPX')
        self.assertTrue(plain['device'].startswith(
            devices.gpu_label(dpx.address) + '-p'))

    def test_whole_node(self):
        for kind in ('mi300x-spx', 'mi300x-cpx-nps4'):
            alloc = self.allocator(kind, [Role.K8S_DEDICATED] * 8)
            result = alloc.allocate(self.claim_of('whole-node.yaml'), 'n')
            self.assertEqual(8, len(result['devices']['results']), kind)
        # a GPU partly in use: the node is not whole any more
        alloc = self.allocator('mi300x-cpx-nps4', [Role.K8S_DEDICATED] * 8)
        self.assertIsNotNone(alloc.allocate(self.claim_of(
            'partition.yaml'), 'n'))
        self.assertIsNone(alloc.allocate(self.claim_of('whole-node.yaml'),
                                         'n'))

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
