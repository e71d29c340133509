"""Every CEL expression the chart ships, run by a real CEL engine on
AdmissionRequest-shaped input: the webhook's matchConditions and the
ValidatingAdmissionPolicies, as rendered (the tested text is the shipped
text)."""

from __future__ import annotations

from typing import Any

import cel
import testtools

from amdgpu_virt.sharing import hami
from tests.unit.deploy import admission
from tests.unit.deploy import chart

NS = chart.NAMESPACE
SCHEDULER = 'system:serviceaccount:%s:amdgpu-virt-scheduler' % NS
NODE = 'system:serviceaccount:%s:amdgpu-virt-node' % NS
NODE_CLAIM = 'authentication.kubernetes.io/node-name'
ALLOCATION_ANNOTATIONS = (
    hami.DEVICES_TO_ALLOCATE, hami.DEVICES_ALLOCATED, hami.CU_ALLOCATED,
    hami.VGPU_NODE, hami.VGPU_TIME, hami.BIND_PHASE, hami.BIND_TIME)


def pod(name: str = 'job', *, limits: dict[str, str] | None = None,
        requests: dict[str, str] | None = None,
        init: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        node: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {'name': 'main', 'image': 'rocm/pytorch'}
    resources = {}
    if limits is not None:
        resources['limits'] = limits
    if requests is not None:
        resources['requests'] = requests
    if resources:
        container['resources'] = resources
    spec: dict[str, Any] = {'containers': [container]}
    if init is not None:
        spec['initContainers'] = [{'name': 'init', 'image': 'busybox',
                                   'resources': {'limits': init}}]
    if node is not None:
        spec['nodeName'] = node
    meta: dict[str, Any] = {'name': name, 'namespace': 'tenant-a'}
    if annotations is not None:
        meta['annotations'] = annotations
    if labels is not None:
        meta['labels'] = labels
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': meta,
            'spec': spec}


def _policy(name: str, variant: str = 'default') -> dict[str, Any]:
    return chart.find(chart.variant(variant), 'ValidatingAdmissionPolicy',
                      name)


class MatchConditionsTest(testtools.TestCase):
    """The webhook is called for GPU pods only."""

    def setUp(self) -> None:
        super().setUp()
        config = chart.find(chart.documents(),
                            'MutatingWebhookConfiguration', 'amdgpu-virt')
        (self.webhook,) = config['webhooks']

    def call(self, obj: Any, old: Any = None,
             operation: str = 'CREATE') -> str:
        return admission.webhook_call(
            self.webhook, admission.request(operation, obj, old))

    def test_gpu_pods_are_sent(self) -> None:
        for obj in (pod(limits={'amd.com/gpu': '1'}),
                    pod(requests={'amd.com/gpumem': '4096'}),
                    pod(limits={'cpu': '1', 'amd.com/gpucores': '30'}),
                    pod(init={'amd.com/gpu': '1'}),
                    pod(limits={'amd.com/future-resource': '1'}),
                    pod(annotations={hami.BIND_PHASE: 'allocating'}),
                    pod(annotations={'hami.io/anything': 'x'}),
                    # needs stated instead of resources
                    pod(annotations={'gpu.amd.com/workload':
                                     'memory: 20GiB, compute: 25%'}),
                    pod(annotations={'gpu.amd.com/decision': 'whole'})):
            self.assertEqual(admission.CALLED, self.call(obj), obj)
        self.assertEqual('NoneOnDryRun', self.webhook['sideEffects'])

    def test_other_pods_are_not(self) -> None:
        for obj in (pod(),
                    pod(limits={'cpu': '2', 'memory': '1Gi'}),
                    pod(limits={'nvidia.com/gpu': '1'}),
                    pod(limits={'example.org/amd.com/gpu': '1'}),
                    pod(limits={'AMD.COM/gpu': '1'}),
                    pod(limits={}, requests={}),
                    pod(annotations={'example.org/hami.io': 'x',
                                     'nothami.io/x': 'y',
                                     'example.org/gpu.amd.com/x': 'y',
                                     'amd.com/use-gputype': 'MI300X'}),
                    pod(labels={'hami.io/vgpu-node': 'n1'})):
            self.assertEqual(admission.SKIPPED, self.call(obj), obj)

    def test_no_pod_label_opts_out(self) -> None:
        obj = pod(limits={'amd.com/gpu': '1'},
                  labels={hami.WEBHOOK_LABEL: hami.WEBHOOK_IGNORE})
        self.assertEqual(admission.CALLED, self.call(obj))
        self.assertNotIn('objectSelector', self.webhook)

    def test_updates_are_judged_on_both_versions(self) -> None:
        gpu = pod(limits={'amd.com/gpu': '1'})
        self.assertEqual(admission.CALLED,
                         self.call(gpu, gpu, operation='UPDATE'))
        # removing hami.io annotations is seen too
        tagged = pod(annotations={hami.DEVICES_ALLOCATED: 'x'})
        self.assertEqual(admission.CALLED,
                         self.call(pod(), tagged, operation='UPDATE'))
        self.assertEqual(admission.SKIPPED,
                         self.call(pod(), pod(), operation='UPDATE'))
        self.assertEqual(['CREATE', 'UPDATE'],
                         self.webhook['rules'][0]['operations'])

    def test_needs_stated_per_container_are_sent(self) -> None:
        for key in ('workload.gpu.amd.com/train',
                    'decision.gpu.amd.com/train',
                    'decision-reason.gpu.amd.com/train'):
            self.assertEqual(admission.CALLED, self.call(pod(annotations={
                key: 'x'})), key)
        # other owners' keys, and look-alikes, are not ours
        for key in ('example.org/workload.gpu.amd.com',
                    'notgpu.amd.com/train', 'gpu.amd.com.example.org/x'):
            self.assertEqual(admission.SKIPPED, self.call(pod(annotations={
                key: 'x'})), key)

    def test_kubectl_debug_is_reviewed(self) -> None:
        # pods/ephemeralcontainers: an UPDATE of the whole Pod
        gpu = pod(limits={'amd.com/gpu': '1', 'amd.com/gpucores': '50'})
        debugged = pod(limits={'amd.com/gpu': '1',
                               'amd.com/gpucores': '50'})
        debugged['spec']['ephemeralContainers'] = [{
            'name': 'debugger', 'image': 'busybox',
            'securityContext': {'privileged': True}}]
        request = admission.request('UPDATE', debugged, gpu,
                                    subresource='ephemeralcontainers')
        self.assertTrue(admission.webhook_rules_match(self.webhook, request))
        self.assertEqual(admission.CALLED,
                         admission.webhook_call(self.webhook, request))
        # an unrelated pod's debug container costs no call
        plain = pod()
        request = admission.request('UPDATE', dict(plain, spec=dict(
            plain['spec'], ephemeralContainers=[{'name': 'd'}])), plain,
            subresource='ephemeralcontainers')
        self.assertTrue(admission.webhook_rules_match(self.webhook, request))
        self.assertEqual(admission.SKIPPED,
                         admission.webhook_call(self.webhook, request))
        # the other subresources stay out (status is the kubelet's)
        for sub in ('status', 'binding', 'exec', 'resize'):
            self.assertFalse(admission.webhook_rules_match(
                self.webhook, admission.request(
                    'UPDATE', gpu, gpu, subresource=sub)), sub)

    def test_hostile_shapes_never_reject_unrelated_pods(self) -> None:
        # an error would follow failurePolicy Fail and block the pod
        odd = [
            {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {}},
            {'apiVersion': 'v1', 'kind': 'Pod', 'spec': {}},
            {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'x'},
             'spec': {'containers': []}},
            {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'x'},
             'spec': {'containers': [{'name': 'a'}],
                      'initContainers': []}},
            {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {
                'annotations': {}}, 'spec': {'containers': [
                    {'name': 'a', 'resources': {}}]}},
        ]
        for obj in odd:
            self.assertEqual(admission.SKIPPED, self.call(obj), obj)
            self.assertEqual(admission.SKIPPED,
                             self.call(obj, obj, operation='UPDATE'), obj)

    def test_huge_inputs(self) -> None:
        many = {'example.org/k%05d' % n: 'v' for n in range(5000)}
        self.assertEqual(admission.SKIPPED, self.call(pod(annotations=many)))
        many['hami.io/vgpu-node'] = 'n1'
        self.assertEqual(admission.CALLED, self.call(pod(annotations=many)))
        obj = pod()
        obj['spec']['containers'] = [
            {'name': 'c%d' % n, 'resources': {'limits': {
                'example.org/r%d' % m: '1' for m in range(20)}}}
            for n in range(500)]
        self.assertEqual(admission.SKIPPED, self.call(obj))
        obj['spec']['containers'][-1]['resources']['limits'][
            'amd.com/gpu'] = '1'
        self.assertEqual(admission.CALLED, self.call(obj))

    def test_failure_policy_and_timeout_are_values(self) -> None:
        self.assertEqual(('Fail', 10), (self.webhook['failurePolicy'],
                                        self.webhook['timeoutSeconds']))
        (hook,) = chart.find(chart.variant('webhook-ignore'),
                             'MutatingWebhookConfiguration', 'amdgpu-virt')[
                                 'webhooks']
        self.assertEqual(('Ignore', 5),
                         (hook['failurePolicy'], hook['timeoutSeconds']))
        expressions = hook['namespaceSelector']['matchExpressions']
        self.assertEqual(['amdgpu-virt', 'kube-system', 'monitoring'],
                         expressions[0]['values'])
        self.assertEqual({'key': 'example.org/gpu-tenants',
                          'operator': 'Exists'}, expressions[1])

    def test_the_engine_reports_errors(self) -> None:
        # what the hostile tests rely on: a missing key is an error
        self.assertRaises(KeyError, cel.evaluate,
                          "object.metadata.annotations['x'] == 'y'",
                          {'object': {'metadata': {}}})


class _AllocationPolicyTest(testtools.TestCase):
    """(a) the policy on HAMi's allocation annotations and label."""

    def setUp(self) -> None:
        super().setUp()
        self.policy = _policy('amdgpu-virt-allocation-annotations')

    def admit(self, operation: str, obj: Any, old: Any = None,
              **kwargs: Any) -> admission.Decision:
        return admission.admit(self.policy, admission.request(
            operation, obj, old, **kwargs))


class AllocationLabelsPolicyTest(_AllocationPolicyTest):
    """(a) only the project's accounts write HAMi's allocation label on
    pods (``hami.io/vgpu-node``, by which a node's pods are selected)."""

    def test_the_names_are_hamis(self) -> None:
        (keys,) = [v for v in self.policy['spec']['variables']
                   if v['name'] == 'labelKeys']
        self.assertEqual(list(hami.ALLOCATION_LABELS),
                         cel.evaluate(keys['expression'], {}))

    def test_tenant_cannot_set_change_or_remove_it(self) -> None:
        placed = pod(labels={hami.VGPU_NODE: 'n1', 'app': 'x'}, node='n1')
        for operation, new, old in (
                ('CREATE', pod(labels={hami.VGPU_NODE: 'n1'}), None),
                ('UPDATE', pod(labels={hami.VGPU_NODE: 'n2', 'app': 'x'},
                               node='n1'), placed),
                ('UPDATE', pod(labels={'app': 'x'}, node='n1'), placed),
                ('UPDATE', pod(node='n1'), placed),
                ('UPDATE', pod(labels={hami.VGPU_NODE: ''}), pod())):
            decision = self.admit(operation, new, old)
            self.assertFalse(decision.allowed, (operation, new))
            self.assertEqual('user alice may not set, change or remove the '
                             'GPU allocation label hami.io/vgpu-node of a '
                             'pod: only the amdgpu-virt service accounts '
                             'write it', decision.message)
        decision = self.admit('UPDATE', pod(labels={hami.VGPU_NODE: 'n2'},
                                            node='n1'), placed,
                              subresource='status')
        self.assertFalse(decision.allowed)

    def test_everything_else_and_the_project_may(self) -> None:
        placed = pod(labels={hami.VGPU_NODE: 'n1'}, node='n1')
        self.assertTrue(self.admit('UPDATE', pod(labels={
            hami.VGPU_NODE: 'n1', 'app': 'y',
            hami.WEBHOOK_LABEL: hami.WEBHOOK_IGNORE}, node='n1'),
            placed).allowed)
        # the annotation of the same name is not the label
        self.assertFalse(self.admit('UPDATE', pod(
            labels={hami.VGPU_NODE: 'n1'},
            annotations={hami.VGPU_NODE: 'n1'}, node='n1'), placed).allowed)
        for user in (SCHEDULER, NODE):
            self.assertTrue(self.admit('UPDATE', pod(labels={
                hami.VGPU_NODE: 'n2'}), pod(), username=user).allowed, user)
        self.assertFalse(self.admit(
            'UPDATE', pod(labels={hami.VGPU_NODE: 'n2'}), pod(),
            username='system:serviceaccount:tenant-a:amdgpu-virt-node'
        ).allowed)

    def test_hostile_input(self) -> None:
        many = {'example.org/k%05d' % n: 'v' for n in range(5000)}
        self.assertTrue(self.admit('UPDATE', pod(labels=many),
                                   pod()).allowed)
        many[hami.VGPU_NODE] = 'n1'
        self.assertFalse(self.admit('UPDATE', pod(labels=many),
                                    pod()).allowed)
        bare = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {}}
        self.assertTrue(self.admit('UPDATE', bare, bare).allowed)
        binding = {'apiVersion': 'v1', 'kind': 'Binding',
                   'metadata': {'name': 'job'},
                   'target': {'kind': 'Node', 'name': 'n1'}}
        self.assertTrue(self.admit('CREATE', binding,
                                   username='system:kube-scheduler',
                                   subresource='binding',
                                   kind='Binding').allowed)


class AllocationAnnotationsPolicyTest(_AllocationPolicyTest):
    """(a) only the project's accounts write HAMi's allocation
    annotations on pods."""

    def test_the_names_are_hamis(self) -> None:
        (keys,) = [v for v in self.policy['spec']['variables']
                   if v['name'] == 'keys']
        self.assertEqual(sorted(ALLOCATION_ANNOTATIONS),
                         sorted(cel.evaluate(keys['expression'], {})))

    def test_tenant_cannot_set_any_of_them_on_create(self) -> None:
        for key in ALLOCATION_ANNOTATIONS:
            decision = self.admit('CREATE', pod(
                limits={'amd.com/gpu': '1'}, annotations={key: 'forged'}))
            self.assertFalse(decision.allowed, key)
            self.assertIn(key, decision.message)
            self.assertIn('user alice', decision.message)

    def test_tenant_cannot_change_or_remove_them(self) -> None:
        held = {hami.DEVICES_ALLOCATED: 'GPU-1,AMD,4096,30:;',
                hami.CU_ALLOCATED: '{"GPU-1": "0-91"}',
                hami.BIND_PHASE: 'success'}
        old = pod(annotations=dict(held), node='n1')
        for change in ({hami.CU_ALLOCATED: '{"GPU-1": ""}'},
                       {hami.BIND_PHASE: 'failed'},
                       {hami.DEVICES_TO_ALLOCATE: 'x'}):
            new = pod(annotations={**held, **change}, node='n1')
            self.assertFalse(self.admit('UPDATE', new, old).allowed, change)
        for gone in held:
            rest = {k: v for k, v in held.items() if k != gone}
            decision = self.admit('UPDATE', pod(annotations=rest, node='n1'),
                                  old)
            self.assertFalse(decision.allowed, gone)
            self.assertIn(gone, decision.message)
        decision = self.admit('UPDATE', pod(node='n1'), old)
        self.assertFalse(decision.allowed)
        self.assertIn('(and 2 more)', decision.message)
        # through the status subresource too
        decision = self.admit('UPDATE', pod(node='n1'), old,
                              subresource='status')
        self.assertFalse(decision.allowed)

    def test_tenant_may_change_everything_else(self) -> None:
        held = {hami.DEVICES_ALLOCATED: 'GPU-1,AMD,4096,30:;'}
        old = pod(annotations=dict(held))
        new = pod(annotations={**held, 'team': 'ml',
                               hami.NODE_SCHEDULER_POLICY: 'spread',
                               hami.USE_GPUTYPE: 'MI300X'},
                  labels={'app': 'x'})
        self.assertTrue(self.admit('UPDATE', new, old).allowed)
        self.assertTrue(self.admit('CREATE', pod(annotations={
            hami.GPU_SCHEDULER_POLICY: 'binpack'})).allowed)
        self.assertTrue(self.admit('CREATE', pod()).allowed)
        self.assertTrue(self.admit('UPDATE', pod(), pod()).allowed)

    def test_project_accounts_may(self) -> None:
        old = pod(node='n1')
        new = pod(annotations={hami.DEVICES_ALLOCATED: 'x',
                               hami.BIND_PHASE: 'success'}, node='n1')
        for user in (SCHEDULER, NODE):
            self.assertTrue(self.admit('UPDATE', new, old,
                                       username=user).allowed, user)
        # not an account of another namespace with the same name
        self.assertFalse(self.admit(
            'UPDATE', new, old,
            username='system:serviceaccount:tenant-a:amdgpu-virt-scheduler'
        ).allowed)

    def test_bindings_cannot_carry_them(self) -> None:
        # the API server copies a Binding's annotations onto the pod
        binding = {'apiVersion': 'v1', 'kind': 'Binding',
                   'metadata': {'name': 'job', 'annotations': {
                       hami.VGPU_NODE: 'n1'}},
                   'target': {'kind': 'Node', 'name': 'n1'}}
        kwargs = {'subresource': 'binding', 'kind': 'Binding'}
        self.assertFalse(self.admit('CREATE', binding,
                                    username='system:kube-scheduler',
                                    **kwargs).allowed)
        self.assertTrue(self.admit('CREATE', binding, username=SCHEDULER,
                                   **kwargs).allowed)
        del binding['metadata']['annotations']
        self.assertTrue(self.admit('CREATE', binding,
                                   username='system:kube-scheduler',
                                   **kwargs).allowed)

    def test_not_applied_to_deletes_or_other_resources(self) -> None:
        tagged = pod(annotations={hami.BIND_PHASE: 'success'})
        self.assertFalse(self.admit('DELETE', None, tagged).matched)
        self.assertFalse(self.admit('CREATE', tagged,
                                    resource='configmaps').matched)

    def test_hostile_input(self) -> None:
        many = {'example.org/k%05d' % n: 'v' for n in range(5000)}
        self.assertTrue(self.admit('UPDATE', pod(annotations=many),
                                   pod()).allowed)
        many[hami.BIND_TIME] = '1'
        self.assertFalse(self.admit('UPDATE', pod(annotations=many),
                                    pod()).allowed)
        bare = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {}}
        self.assertTrue(self.admit('CREATE', bare).allowed)
        self.assertTrue(self.admit('UPDATE', bare, bare).allowed)
        # an empty value is a value: adding it is a change
        self.assertFalse(self.admit('UPDATE', pod(annotations={
            hami.CU_ALLOCATED: ''}), pod()).allowed)

    def test_extra_writers_and_actions_are_values(self) -> None:
        policy = _policy('amdgpu-virt-allocation-annotations',
                         'policies-warn')
        decision = admission.admit(policy, admission.request(
            'CREATE', pod(annotations={hami.VGPU_NODE: 'n1'}),
            username='system:serviceaccount:kube-system:hami-scheduler'))
        self.assertTrue(decision.allowed)
        binding = chart.find(chart.variant('policies-warn'),
                             'ValidatingAdmissionPolicyBinding',
                             'amdgpu-virt-allocation-annotations')
        self.assertEqual(['Warn', 'Audit'],
                         binding['spec']['validationActions'])
        binding = chart.find(chart.documents(),
                             'ValidatingAdmissionPolicyBinding',
                             'amdgpu-virt-allocation-annotations')
        self.assertEqual(['Deny'], binding['spec']['validationActions'])


def node_obj(name: str) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'Node',
            'metadata': {'name': name, 'annotations': {}}}


class NodeRestrictionPolicyTest(testtools.TestCase):
    """(b) a node's account writes only its own Node and its pods."""

    def setUp(self) -> None:
        super().setUp()
        self.policy = _policy('amdgpu-virt-node-restriction')

    def admit(self, operation: str, obj: Any, old: Any = None,
              node: str | None = 'n1', **kwargs: Any) -> admission.Decision:
        kwargs.setdefault('username', NODE)
        if node is not None:
            kwargs.setdefault('extra', {NODE_CLAIM: [node],
                                        'authentication.kubernetes.io/'
                                        'pod-name': ['amdgpu-virt-node-x']})
        return admission.admit(self.policy, admission.request(
            operation, obj, old, **kwargs))

    def test_own_node(self) -> None:
        kwargs = {'resource': 'nodes', 'kind': 'Node', 'namespace': ''}
        self.assertTrue(self.admit('UPDATE', node_obj('n1'), node_obj('n1'),
                                   **kwargs).allowed)
        self.assertTrue(self.admit('UPDATE', node_obj('n1'), node_obj('n1'),
                                   subresource='status', **kwargs).allowed)
        for sub in ('', 'status'):
            decision = self.admit('UPDATE', node_obj('n2'), node_obj('n2'),
                                  subresource=sub, **kwargs)
            self.assertFalse(decision.allowed)
            self.assertIn('of node n1 may not write node n2',
                          decision.message)

    def test_pods_on_own_node_only(self) -> None:
        mine = pod(node='n1')
        self.assertTrue(self.admit('UPDATE', mine, mine).allowed)
        theirs = pod(node='n2')
        decision = self.admit('UPDATE', theirs, theirs)
        self.assertFalse(decision.allowed)
        self.assertIn('pod tenant-a/job, which is not bound to that node',
                      decision.message)
        unbound = pod()
        self.assertFalse(self.admit('UPDATE', unbound, unbound).allowed)
        self.assertTrue(self.admit('DELETE', None, mine).allowed)
        self.assertFalse(self.admit('DELETE', None, theirs).allowed)
        # a changed nodeName is judged on both versions of the pod
        self.assertFalse(self.admit('UPDATE', mine, theirs).allowed)
        self.assertFalse(self.admit('UPDATE', theirs, mine).allowed)
        self.assertFalse(self.admit('CREATE', theirs).allowed)

    def test_token_without_the_claim_writes_nothing(self) -> None:
        mine = pod(node='n1')
        for extra in (None, {}, {NODE_CLAIM: []}, {NODE_CLAIM: ['n1', 'n2']},
                      {'authentication.kubernetes.io/pod-name': ['x']}):
            decision = admission.admit(self.policy, admission.request(
                'UPDATE', mine, mine, username=NODE, extra=extra))
            self.assertFalse(decision.allowed, extra)
            self.assertIn('no node-name claim', decision.message)

    def test_other_users_are_not_concerned(self) -> None:
        # an admin has no userInfo.extra at all: no "no such key" error
        for user in ('kubernetes-admin', SCHEDULER,
                     'system:serviceaccount:other:amdgpu-virt-node'):
            decision = admission.admit(self.policy, admission.request(
                'UPDATE', pod(node='n2'), pod(node='n2'), username=user))
            self.assertTrue(decision.allowed, user)
            self.assertFalse(decision.matched, user)

    def test_hostile_objects_fail_closed(self) -> None:
        bare = {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': {'name': 'x'}, 'spec': {}}
        self.assertFalse(self.admit('UPDATE', bare, bare).allowed)
        self.assertFalse(self.admit('UPDATE', pod(node=''),
                                    pod(node='')).allowed)
        # a claim value that is no node name
        self.assertFalse(self.admit('UPDATE', pod(node='n1'), pod(node='n1'),
                                    node="n1' || true").allowed)


def configmap(name: str, labels: dict[str, str] | None = None,
              namespace: str = NS) -> dict[str, Any]:
    meta: dict[str, Any] = {'name': name, 'namespace': namespace}
    if labels is not None:
        meta['labels'] = labels
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': meta,
            'data': {'record': '{}'}}


RECORD_LABEL = {'app.kubernetes.io/component': 'allocation-record'}


class AllocationRecordPolicyTest(testtools.TestCase):
    """(c) only the scheduler account writes the allocation records."""

    def setUp(self) -> None:
        super().setUp()
        self.policy = _policy('amdgpu-virt-allocation-records')

    def admit(self, operation: str, obj: Any, old: Any = None,
              user: str = 'kubernetes-admin',
              namespace: str = NS) -> admission.Decision:
        return admission.admit(self.policy, admission.request(
            operation, obj, old, username=user, resource='configmaps',
            kind='ConfigMap', namespace=namespace))

    def test_scheduler_writes(self) -> None:
        record = configmap('amdgpu-virt-alloc-n1', RECORD_LABEL)
        for operation, old in (('CREATE', None), ('UPDATE', record),
                               ('DELETE', record)):
            obj = None if operation == 'DELETE' else record
            self.assertTrue(self.admit(operation, obj, old,
                                       user=SCHEDULER).allowed, operation)

    def test_nobody_else_does(self) -> None:
        record = configmap('amdgpu-virt-alloc-n1', RECORD_LABEL)
        for user in (NODE, 'kubernetes-admin', 'alice'):
            decision = self.admit('UPDATE', record, record, user=user)
            self.assertFalse(decision.allowed, user)
            self.assertIn('only %s writes them' % SCHEDULER,
                          decision.message)
            self.assertFalse(self.admit('CREATE', record, user=user).allowed)
            self.assertFalse(self.admit('DELETE', None, record,
                                        user=user).allowed)
        # found by name or by label, before or after the change
        self.assertFalse(self.admit('CREATE', configmap(
            'amdgpu-virt-alloc-n2')).allowed)
        self.assertFalse(self.admit('CREATE', configmap(
            'innocent', RECORD_LABEL)).allowed)
        self.assertFalse(self.admit('UPDATE', configmap('innocent'),
                                    configmap('innocent', RECORD_LABEL)
                                    ).allowed)

    def test_namespace_teardown_may_delete(self) -> None:
        record = configmap('amdgpu-virt-alloc-n1', RECORD_LABEL)
        for user in ('system:serviceaccount:kube-system:namespace-controller',
                     'system:serviceaccount:kube-system:'
                     'generic-garbage-collector'):
            self.assertTrue(self.admit('DELETE', None, record,
                                       user=user).allowed)
            self.assertFalse(self.admit('UPDATE', record, record,
                                        user=user).allowed)

    def test_other_configmaps_are_not_concerned(self) -> None:
        self.assertFalse(self.admit('UPDATE', configmap('amdgpu-virt-config'),
                                    configmap('amdgpu-virt-config')).matched)
        self.assertFalse(self.admit(
            'CREATE', configmap('amdgpu-virt-alloc-n1', RECORD_LABEL,
                                namespace='tenant-a'),
            namespace='tenant-a').matched)
        self.assertFalse(self.admit(
            'CREATE', configmap('x', {'app.kubernetes.io/component': 'web'}
                                )).matched)
