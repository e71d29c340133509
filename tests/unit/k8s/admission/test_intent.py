"""Stated needs -> whole GPUs or a CU slice, by the planner's filters."""

from __future__ import annotations

import gc
import time

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import exception
from amdgpu_virt.k8s.admission import intent
from amdgpu_virt.model import Kind
from amdgpu_virt.policy import engine as policy_engine
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.filters import isolation
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.sharing import hami

MI300X = hami.DeviceInfo(id='a', count=10, devmem=196608, devcore=304,
                         type='AMD Instinct MI300X', health=True)
MI210 = hami.DeviceInfo(id='b', count=10, devmem=65536, devcore=104,
                        type='AMD Instinct MI210', health=True)
ISOLATED = "namespace 'secure' (labelled x=y)"


class DecideTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.engine = policy_engine.Engine(conf_pkg.new_conf())

    def _decide(self, needs: str, isolated: str | None = None,
                devices: tuple[hami.DeviceInfo, ...] = (MI300X,)
                ) -> intent.IntentDecision:
        w = intent.workload(intent.parse(needs, 'pod ns/p'), 'p', isolated)
        return intent.decide(w, intent.models_from_registrations(devices),
                             self.engine)

    def test_table(self) -> None:
        cases = (
            # needs, isolated, kind, limits, in the reason
            ('memory: 20GiB, compute: 25%', None, Kind.CU,
             {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
              'amd.com/gpumem': '20480'}, 'tenancy is trusted'),
            ('memory: 20GiB, compute: 25%', ISOLATED, Kind.DEDICATED,
             {'amd.com/gpu': '1'}, 'tenancy is isolated'),
            ('{"memory": "20GiB", "compute": "25%"}', None, Kind.CU,
             {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
              'amd.com/gpumem': '20480'}, '25%'),
            ('compute: 76, memory: 8GiB', None, Kind.CU,
             {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
              'amd.com/gpumem': '8192'}, '76 CUs'),
            # all memory of the GPU is the whole GPU
            ('compute: 76', None, Kind.DEDICATED, {'amd.com/gpu': '1'},
             'dedicated_threshold'),
            ('compute: 10%, memory: 8GiB, sensitivity: high',
             None, Kind.DEDICATED,
             {'amd.com/gpu': '1'}, 'sensitivity high is above medium'),
            ('gpus: 2, compute: 10%, memory: 8GiB, p2p: true',
             None, Kind.DEDICATED,
             {'amd.com/gpu': '2'}, 'P2P between 2 GPUs'),
            ('compute: 80%, memory: 8GiB', None, Kind.DEDICATED,
             {'amd.com/gpu': '1'}, 'dedicated_threshold'),
            ('tenancy: isolated, compute: 10%, memory: 8GiB',
             None, Kind.DEDICATED,
             {'amd.com/gpu': '1'}, 'tenancy is isolated'),
        )
        for needs, isolated, kind, limits, why in cases:
            decision = self._decide(needs, isolated)
            self.assertEqual((Code.PLACED, kind, limits),
                             (decision.code, decision.kind,
                              dict(decision.limits)), needs)
            self.assertIn(why, decision.reason, needs)
            self.assertTrue(decision.trail)

    def test_never_fits_gives_the_tightest_reason(self) -> None:
        decision = self._decide('memory: 300GiB')
        self.assertIs(Code.NEVER, decision.code)
        self.assertTrue(decision.reason.startswith(
            'fits no GPU of the cluster: [size] requested 304 CUs and '
            '307200 MiB'), decision.reason)
        self.assertIs(Code.NEVER, self._decide('compute: 10%',
                                               devices=()).code)

    def test_mixed_shapes_slice_only_where_it_fits_everywhere(self) -> None:
        # 40 GiB is 62 % of an MI210: too big for its CU slice, so whole
        # GPUs, on either model
        decision = self._decide('memory: 40GiB, compute: 10%',
                                devices=(MI300X, MI210))
        self.assertIs(Kind.DEDICATED, decision.kind)
        self.assertEqual((), decision.use_types)
        # 100 GiB fits only the MI300X: whole, and only there
        decision = self._decide('memory: 100GiB', devices=(MI300X, MI210))
        self.assertEqual(('AMD Instinct MI300X',), decision.use_types)

    def test_tenancy_comes_from_the_namespace(self) -> None:
        err = self.assertRaises(exception.WorkloadSpecError, intent.workload,
                                {'tenancy': 'trusted'}, 'p', ISOLATED)
        self.assertIn("tenancy: 'trusted' is not allowed: namespace "
                      "'secure'", str(err))
        self.assertIs(Tenancy.TRUSTED, intent.workload({}, 'p', None).tenancy)

    def test_the_tenancy_rule_is_one_function(self) -> None:
        self.assertIsNone(isolation.cu_slice_refusal(Tenancy.TRUSTED))
        self.assertIn('not a security boundary',
                      str(isolation.cu_slice_refusal(Tenancy.ISOLATED)))
        decision = self._decide('compute: 10%, memory: 1GiB', ISOLATED)
        self.assertIn(str(isolation.cu_slice_refusal(Tenancy.ISOLATED)),
                      decision.reason)

    def test_parse_refuses_what_a_spec_does_not_hold(self) -> None:
        for value, reason in ((3, 'not a string'),
                              ('name: x', 'unknown field(s) name'),
                              ('platform: vm', 'unknown field(s) platform'),
                              ('memory: &x 1GiB\ncompute: *x',
                               'aliases'),
                              ('a: &x [1]\nb: *x', 'nested'),
                              ('memory: {a: 1}', 'nested'),
                              ('[' * 200 + ']' * 200, 'nested'),
                              ('memory:\n  a: 1', 'memory: a plain value'),
                              ('y' * 3000, '3000 characters, at most '
                               '512')):
            err = self.assertRaises(exception.WorkloadSpecError,
                                    intent.parse, value, 'pod ns/p')
            self.assertIn(reason, str(err))
        self.assertEqual({'memory': '20GiB', 'compute': '25%'},
                         intent.parse('memory: 20GiB, compute: 25%', 'p'))
        self.assertEqual({'gpus': 2}, intent.parse('gpus: 2', 'p'))


class ClaimTemplateTest(testtools.TestCase):

    def test_share_and_whole(self) -> None:
        engine = policy_engine.Engine(conf_pkg.new_conf())
        models = intent.models_from_registrations([MI300X, MI210])
        share = intent.decide(intent.workload(
            {'compute': '20%', 'memory': '8GiB', 'gpus': 2}, 'p', None),
            models, engine)
        body = intent.claim_template(share)
        self.assertEqual(('resource.k8s.io/v1', 'ResourceClaimTemplate'),
                         (body['apiVersion'], body['kind']))
        (request,) = body['spec']['spec']['devices']['requests']
        # the most CUs any fitting shape needs: 20 % of 304 is 60
        self.assertEqual({'allocationMode': 'ExactCount', 'count': 2,
                          'deviceClassName': 'share.gpu.amd.com',
                          'capacity': {'requests': {
                              'computeUnits': '60', 'memory': '8Gi'}}},
                         request['exactly'])
        self.assertTrue(body['metadata']['name'].startswith(
            'amdgpu-virt-cu-slice-'))
        # the name follows the content: the same needs, the same template
        self.assertEqual(body, intent.claim_template(share))
        whole = intent.decide(intent.workload({'gpus': 2}, 'p', None),
                              models, engine)
        other = intent.claim_template(whole)
        self.assertEqual({'allocationMode': 'ExactCount', 'count': 2,
                          'deviceClassName': 'gpu.amd.com'},
                         other['spec']['spec']['devices']['requests'][0][
                             'exactly'])
        self.assertNotEqual(body['metadata']['name'],
                            other['metadata']['name'])


class MemoryRuleTest(testtools.TestCase):
    """A namespace requiring kernel enforcement: a slice only where a GPU
    registers it, else whole GPUs, with the label in the reason."""

    def setUp(self) -> None:
        super().setUp()
        self.engine = policy_engine.Engine(conf_pkg.new_conf())
        self.rule = intent.memory_rule('team', {
            'gpu.amd.com/memory-enforcement': 'kernel'})

    def _decide(self, *devices: hami.DeviceInfo) -> intent.IntentDecision:
        w = intent.workload(intent.parse('memory: 8GiB, compute: 25%',
                                         'pod team/p'), 'p', None)
        return intent.decide(w, intent.models_from_registrations(devices),
                             self.engine, self.rule,
                             intent.levels_from_registrations(devices))

    @staticmethod
    def _at(level: str | None) -> hami.DeviceInfo:
        return hami.DeviceInfo(
            id='a', count=10, devmem=196608, devcore=304,
            type='AMD Instinct MI300X', health=True,
            custominfo={'memoryEnforcement': level} if level else {})

    def test_rule_of_the_labels(self) -> None:
        assert self.rule is not None
        self.assertEqual("namespace 'team' (label "
                         "gpu.amd.com/memory-enforcement=kernel)",
                         self.rule.why)
        self.assertIsNone(intent.memory_rule('team', {}))
        self.assertIsNone(intent.memory_rule('team', {
            'gpu.amd.com/memory-enforcement': 'bogus'}))

    def test_a_slice_where_the_kernel_caps(self) -> None:
        decision = self._decide(self._at('kernel+hook'))
        self.assertIs(Kind.CU, decision.kind)
        self.assertIn('gpu.amd.com/memory-enforcement=kernel',
                      decision.reason)

    def test_whole_gpus_where_it_does_not(self) -> None:
        for level in ('hook', None):
            decision = self._decide(self._at(level))
            self.assertIs(Kind.DEDICATED, decision.kind)
            self.assertIn("no CU slice because namespace 'team' (label "
                          "gpu.amd.com/memory-enforcement=kernel) requires "
                          "the kernel (dmem cgroup)", decision.reason)
            self.assertIn('AMD Instinct MI300X: %s' % (level or 'none'),
                          decision.reason)
            self.assertIn('memory', [v.rule for v in decision.trail
                                     if not v.passed])

    def test_without_a_rule_nothing_changes(self) -> None:
        w = intent.workload(intent.parse('memory: 8GiB, compute: 25%',
                                         'pod team/p'), 'p', None)
        decision = intent.decide(w, intent.models_from_registrations(
            [self._at('hook')]), self.engine)
        self.assertIs(Kind.CU, decision.kind)
        self.assertNotIn('memory-enforcement', decision.reason)


class GpusBoundTest(testtools.TestCase):
    """``gpus`` is checked against the nodes, as memory and compute are
    against the GPUs."""

    def setUp(self) -> None:
        super().setUp()
        self.engine = policy_engine.Engine(conf_pkg.new_conf())

    def _decide(self, needs: str, nodes: list[list[hami.DeviceInfo]]
                ) -> intent.IntentDecision:
        devices = [d for node in nodes for d in node]
        counts = []
        for node in nodes:
            count: dict[intent.ShapeKey, int] = {}
            for device in node:
                key = intent.shape_key(device)
                assert key is not None
                count[key] = count.get(key, 0) + 1
            counts.append(count)
        w = intent.workload(intent.parse(needs, 'pod ns/p'), 'p', None)
        return intent.decide(w, intent.models_from_registrations(devices),
                             self.engine,
                             most=intent.most_per_node(counts))

    def test_more_gpus_than_any_node_has_never_fit(self) -> None:
        eight = [[MI300X] * 8, [MI300X] * 8]
        decision = self._decide('gpus: 17', eight)
        self.assertIs(Code.NEVER, decision.code)
        self.assertEqual(
            'fits no node of the cluster: [gpus] requested 17 GPUs for one '
            'pod, but no node registers more than 8 GPUs of one shape (AMD '
            'Instinct MI300X: 8); a pod\'s GPUs are all on its node',
            decision.reason)
        self.assertIs(Code.PLACED, self._decide('gpus: 8', eight).code)

    def test_only_the_shapes_with_enough_gpus_are_named(self) -> None:
        nodes = [[MI300X] * 8, [MI210] * 4]
        decision = self._decide('gpus: 6', nodes)
        self.assertIs(Code.PLACED, decision.code)
        self.assertEqual(('AMD Instinct MI300X',), decision.use_types)
        self.assertEqual((), self._decide('gpus: 4', nodes).use_types)


_FIELD = st.sampled_from(intent.FIELDS + ('name', 'platform', '<<', ''))
_SCALAR = st.sampled_from(['1', '17', '20GiB', '25%', 'whole', 'isolated',
                           'trusted', 'high', 'true', '-3', '1e999',
                           '9' * 80, "'x'", '"y"', '&a 1', '*a', '!!binary',
                           '|', '>', '~'])
#: statements as a pod could write them, well or badly formed
_STATEMENT = st.one_of(
    st.lists(st.tuples(_FIELD, _SCALAR), max_size=8).map(
        lambda pairs: ', '.join('%s: %s' % pair for pair in pairs)),
    st.lists(st.tuples(_FIELD, _SCALAR), max_size=8).map(
        lambda pairs: '\n'.join('%s: %s' % pair for pair in pairs)),
    st.text(st.sampled_from('{}[]:,&*!|>-?#%@` \'"\n\tagpus0'),
            max_size=3000),
    st.integers(1, 5000).map(lambda n: '[' * n + ']' * n),
    st.integers(1, 5000).map(lambda n: 'gpus: ' + '{a: ' * n + '1' +
                             '}' * n))


class StatementGrammarTest(testtools.TestCase):
    """Whatever a pod states: a mapping of plain values of the known
    fields, or an error naming the annotation, in bounded time."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # the first parse of a process builds the YAML loader's tables:
        # not the work a statement makes
        intent.parse('gpus: 1, memory: 1GiB', 'pod ns/p')

    @settings(max_examples=400, deadline=None)
    @given(_STATEMENT)
    def test_a_statement_or_a_named_error(self, text: str) -> None:
        # CPU time of this thread (not the machine's load), with the
        # collector off: a collection of what hypothesis made is not the
        # parse's work
        error: exception.WorkloadSpecError | None = None
        raw: dict[str, object] = {}
        gc.disable()
        began = time.thread_time()
        try:
            raw = intent.parse(text, 'pod ns/p', 'workload.gpu.amd.com/a')
        except exception.WorkloadSpecError as err:
            error = err
        finally:
            spent = time.thread_time() - began
            gc.enable()
        if error is not None:
            self.assertIn('workload.gpu.amd.com/a', str(error))
            if len(text) > intent.MAX_LENGTH:
                self.assertIn('at most %d are read' % intent.MAX_LENGTH,
                              str(error))
        else:
            self.assertLessEqual(len(text), intent.MAX_LENGTH)
            self.assertLessEqual(text.count('[') + text.count('{'), 1)
            self.assertTrue(set(raw) <= set(intent.FIELDS), raw)
            for value in raw.values():
                self.assertNotIsInstance(value, (dict, list))
        # bounded work: a parse of at most MAX_LENGTH characters and no
        # nesting (the deep ones took 0.55 s each before the bounds)
        self.assertLess(spent, 0.25)
