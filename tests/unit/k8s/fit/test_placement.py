"""The extender's decision: requests, GPU fit, policies, node choice."""

from __future__ import annotations

import dataclasses
from typing import Any

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt.k8s import fit
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

MI300X = 'AMD Instinct MI300X'


def device(uuid: str, index: int = 0, count: int = 10, devmem: int = 196608,
           devcore: int = 304, kind: str = MI300X, numa: int = 0,
           health: bool = True, **custom: Any) -> hami.DeviceInfo:
    return hami.DeviceInfo(id=uuid, index=index, count=count, devmem=devmem,
                           devcore=devcore, type=kind, numa=numa,
                           health=health, custominfo=custom)


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] = (),
        **annotations: str) -> dict[str, Any]:
    def one(name: str, limits: dict[str, Any]) -> dict[str, Any]:
        return {'name': name, 'resources': {'limits': limits}}
    return {'metadata': {'name': 'p', 'namespace': 'ns',
                         'annotations': dict(annotations)},
            'spec': {'initContainers': [one('init%d' % n, c) for n, c in
                                        enumerate(init)],
                     'containers': [one('c%d' % n, c) for n, c in
                                    enumerate(containers)]}}


def used(uuid: str, mem: int, cores: int, owner: str = 'o',
         masks: dict[str, int] | None = None) -> fit.PodUsage:
    return (owner, ((hami.ContainerDevice(uuid, MI300X, mem, cores),),),
            masks)


def request(*containers: dict[str, Any], **annotations: str
            ) -> fit.PodRequest:
    return fit.pod_request(pod(*containers, **annotations))


class PodRequestTest(testtools.TestCase):

    def test_defaults_and_init_containers_first(self) -> None:
        req = fit.pod_request(pod({'amd.com/gpucores': '30'}, {},
                                  init=[{'amd.com/gpu': 2}]))
        self.assertEqual(
            [('init0', 2, 0, 100), ('c0', 1, 0, 30), ('c1', 0, 0, 100)],
            [(c.name, c.nums, c.mem, c.percent) for c in req.containers])
        self.assertTrue(req.containers[0].exclusive)
        self.assertFalse(req.containers[1].exclusive)
        self.assertEqual(('binpack', 'spread'), (req.node_policy,
                                                 req.gpu_policy))

    def test_limits_only_as_hami(self) -> None:
        # requests are not read (Kubernetes requires limits for extended
        # resources); a share without amd.com/gpu is one GPU here (the
        # webhook writes amd.com/gpu: 1 so that HAMi reads it the same)
        only_requests = pod()
        only_requests['spec']['containers'] = [{'name': 'c', 'resources': {
            'requests': {'amd.com/gpu': '1', 'amd.com/gpucores': '10'}}}]
        self.assertFalse(fit.pod_request(only_requests).wants_gpus)
        self.assertEqual(1, request({'amd.com/gpumem': '5'}).containers[
            0].nums)
        err = self.assertRaises(exception.ExtenderRequestError, request,
                                {'amd.com/gpucores': '12.5'})
        self.assertIn('integer percentage between 1 and 100', str(err))

    def test_no_gpu_request(self) -> None:
        self.assertFalse(fit.pod_request(pod({'cpu': '1'})).wants_gpus)
        self.assertFalse(fit.pod_request(pod({'amd.com/gpu': '0'}))
                         .wants_gpus)

    def test_annotations(self) -> None:
        req = request({'amd.com/gpu': 1}, **{
            hami.USE_GPUTYPE: 'MI300X, MI325X', hami.NOUSE_GPU_UUID: 'A,b',
            hami.NODE_SCHEDULER_POLICY: 'spread',
            hami.GPU_SCHEDULER_POLICY: 'numa'})
        self.assertEqual(('mi300x', 'mi325x'), req.use_types)
        self.assertEqual(frozenset({'a', 'b'}), req.nouse_uuids)
        self.assertEqual(('spread', 'numa'), (req.node_policy,
                                              req.gpu_policy))

    def test_limits_read_as_the_api_server_serves_them(self) -> None:
        # kube-apiserver returns quantities canonical: a pod created with
        # gpumem 10000 and gpucores 50 reads back as '10k' and '50'
        req = request({'amd.com/gpu': '2', 'amd.com/gpumem': '10k',
                       'amd.com/gpucores': '50'})
        self.assertEqual((2, 10000, 50), (req.containers[0].nums,
                                          req.containers[0].mem,
                                          req.containers[0].percent))
        req = request({'amd.com/gpumem': '24Ki', 'amd.com/gpu': '+1'})
        self.assertEqual((1, 24576), (req.containers[0].nums,
                                      req.containers[0].mem))

    def test_bad_values_name_the_field(self) -> None:
        for limits, field in (
                ({'amd.com/gpucores': '0'}, 'amd.com/gpucores'),
                ({'amd.com/gpucores': '101'}, 'amd.com/gpucores'),
                ({'amd.com/gpumem': '1500m'}, 'amd.com/gpumem'),
                ({'amd.com/gpumem': '4Gi'}, 'amd.com/gpumem'),
                ({'amd.com/gpumem': '10 k'}, 'amd.com/gpumem'),
                ({'amd.com/gpu': True}, 'amd.com/gpu'),
                ({'amd.com/gpu': '-1'}, 'amd.com/gpu')):
            err = self.assertRaises(exception.ExtenderRequestError,
                                    fit.pod_request, pod(limits))
            self.assertIn('containers[c0].resources.limits[%s]' % field,
                          str(err))
        err = self.assertRaises(
            exception.ExtenderRequestError, fit.pod_request,
            pod({'amd.com/gpu': 1}, **{hami.NODE_SCHEDULER_POLICY: 'tight'}))
        self.assertIn(hami.NODE_SCHEDULER_POLICY, str(err))
        self.assertRaises(exception.ExtenderRequestError, fit.pod_request,
                          {'spec': {'containers': 'x'}})


class FitNodeTest(testtools.TestCase):

    def view(self, devices: list[hami.DeviceInfo],
             usage: list[fit.PodUsage] = (), name: str = 'n'
             ) -> fit.NodeView:
        return fit.build_view(name, devices, usage)

    def test_half_a_gpu(self) -> None:
        result = fit.fit_node(self.view([device('g0')]), request(
            {'amd.com/gpucores': 50, 'amd.com/gpumem': 1024}))
        assert isinstance(result, fit.NodeFit)
        self.assertEqual('g0,AMD Instinct MI300X,1024,152:;',
                         hami.encode_pod_devices(result.containers))

    def test_slots_memory_cores_and_whole_gpus(self) -> None:
        full_slots = [used('g0', 1, 1, 'o%d' % n) for n in range(10)]
        cases = [
            (full_slots, {'amd.com/gpucores': 1, 'amd.com/gpumem': 1},
             'all 10 slots taken'),
            ([used('g0', 196000, 1)], {'amd.com/gpumem': 1024,
                                       'amd.com/gpucores': 1},
             'too little free memory'),
            ([used('g0', 1, 300)], {'amd.com/gpucores': 5,
                                    'amd.com/gpumem': 1},
             'too few free CUs (15 asked)'),
            ([used('g0', 1, 1)], {'amd.com/gpucores': 100},
             'in use (a whole GPU was asked)'),
            ([], {'amd.com/gpumem': 200000}, 'too little memory'),
        ]
        for usage, limits, reason in cases:
            result = fit.fit_node(self.view([device('g0')], usage),
                                  request(limits))
            self.assertIsInstance(result, str)
            self.assertIn(reason, result)
        # gpumem without gpucores takes every CU: the GPU is then full
        result = fit.fit_node(self.view([device('g0')], [used('g0', 1, 304)]),
                              request({'amd.com/gpumem': 1}))
        self.assertIn('too few free CUs', str(result))

    def test_selection_annotations(self) -> None:
        devices = [device('g0', 0, kind='AMD Instinct MI300X'),
                   device('g1', 1, kind='AMD Instinct MI325X')]
        view = self.view(devices)
        for extra, expected in (
                ({hami.USE_GPUTYPE: 'mi325'}, 'g1'),
                ({hami.NOUSE_GPUTYPE: 'mi300x'}, 'g1'),
                ({hami.USE_GPU_UUID: 'G1'}, 'g1'),
                ({hami.NOUSE_GPU_UUID: 'g0'}, 'g1')):
            result = fit.fit_node(view, request({'amd.com/gpu': 1},
                                                **extra))
            assert isinstance(result, fit.NodeFit), result
            self.assertEqual(expected, result.containers[0][0].uuid)
        result = fit.fit_node(view, request({'amd.com/gpu': 1}, **{
            hami.USE_GPUTYPE: 'mi250'}))
        self.assertIn('2 type not in amd.com/use-gputype', str(result))
        unhealthy = self.view([device('g0', health=False)])
        self.assertIn('unhealthy', str(fit.fit_node(unhealthy, request(
            {'amd.com/gpu': 1}))))

    def test_gpu_policies(self) -> None:
        devices = [device('g0', 0), device('g1', 1)]
        view = self.view(devices, [used('g1', 1024, 30)])
        pick = {}
        for policy in ('spread', 'binpack'):
            result = fit.fit_node(view, request(
                {'amd.com/gpucores': 10, 'amd.com/gpumem': 10},
                **{hami.GPU_SCHEDULER_POLICY: policy}))
            assert isinstance(result, fit.NodeFit)
            pick[policy] = result.containers[0][0].uuid
        self.assertEqual({'spread': 'g0', 'binpack': 'g1'}, pick)

    def test_numa_keeps_a_container_on_one_node(self) -> None:
        devices = [device('g0', 0, numa=0), device('g1', 1, numa=1),
                   device('g2', 2, numa=1)]
        result = fit.fit_node(self.view(devices), request(
            {'amd.com/gpu': 2, 'amd.com/gpucores': 10, 'amd.com/gpumem': 1},
            **{hami.GPU_SCHEDULER_POLICY: 'numa'}))
        assert isinstance(result, fit.NodeFit)
        self.assertEqual(['g1', 'g2'], [d.uuid for d in result.containers[0]])
        result = fit.fit_node(self.view(devices[:2]), request(
            {'amd.com/gpu': 2}, **{hami.GPU_SCHEDULER_POLICY: 'numa'}))
        self.assertIn('no NUMA node has 2 GPUs', str(result))

    def test_fragmentation_is_avoided(self) -> None:
        # g0: 200 CUs free but scattered (no run of 100); g1: one run of
        # 152. Spread alone would take g0 (less used); the run wins.
        scattered = 0
        for start in range(0, 304, 76):
            scattered |= ((1 << 38) - 1) << start
        devices = [device('g0', 0), device('g1', 1)]
        view = self.view(devices, [
            used('g0', 1, 152, 'a', {'g0': scattered}),
            used('g1', 1, 152, 'b', {'g1': (1 << 152) - 1}),
            used('g1', 50000, 0, 'c')])
        self.assertGreater(view.gpus[1].usage, view.gpus[0].usage)
        result = fit.fit_node(view, request({'amd.com/gpucores': 33,
                                             'amd.com/gpumem': 1}))
        assert isinstance(result, fit.NodeFit)
        self.assertEqual('g1', result.containers[0][0].uuid)

    def test_two_containers_do_not_overbook_one_gpu(self) -> None:
        view = self.view([device('g0')])
        result = fit.fit_node(view, request(
            {'amd.com/gpucores': 60, 'amd.com/gpumem': 1},
            {'amd.com/gpucores': 60, 'amd.com/gpumem': 1}))
        self.assertIn("container 'c1'", str(result))
        result = fit.fit_node(view, request(
            {'amd.com/gpucores': 50, 'amd.com/gpumem': 1},
            {'amd.com/gpucores': 50, 'amd.com/gpumem': 1}))
        self.assertIsInstance(result, fit.NodeFit)

    def test_rdna_units(self) -> None:
        view = self.view([device('g0', devcore=96, cuPerWGP=2)])
        result = fit.fit_node(view, request({'amd.com/gpucores': 1,
                                             'amd.com/gpumem': 1}))
        assert isinstance(result, fit.NodeFit)
        self.assertEqual(2, result.containers[0][0].usedcores)

    def test_unknown_gpus_in_pods_are_ignored_and_problems_close(self) -> None:
        view = self.view([device('g0')], [used('elsewhere', 1, 1)])
        self.assertEqual(0, view.gpus[0].used_slots)
        closed = fit.build_view('n', [device('g0')], [], problem='broken')
        self.assertEqual('broken', fit.fit_node(closed, request(
            {'amd.com/gpu': 1})))
        overlap = fit.build_view('n', [device('g0')], [
            used('g0', 1, 4, 'a', {'g0': 0xF}),
            used('g0', 1, 4, 'b', {'g0': 0x3})])
        self.assertIn('stored CU ranges unusable', str(overlap.problem))

    def test_usable_device(self) -> None:
        self.assertIsNone(fit.usable_device(device('g0')))
        # as in HAMi: a device of hami.io/node-amd-register is an AMD
        # device whatever its type says
        self.assertIsNone(fit.usable_device(device('g0', kind='Instinct')))
        for bad, reason in ((device('g,0'), 'id'),
                            (device('g0', devcore=0), 'devcore'),
                            (device('g0', devmem=0), 'devmem'),
                            (device('g0', count=0), 'count'),
                            (device('g0', kind='AMD;x'), 'type'),
                            (device('g0', devcore=95, cuPerWGP=2), 'units')):
            self.assertIn(reason, str(fit.usable_device(bad)))

    @given(st.lists(st.tuples(
        st.sampled_from(['g0', '', 'g,1', 'g;2', 'G3']),
        st.sampled_from([MI300X, 'AMD:x', '']),
        st.sampled_from([-1, 0, 95, 304, allocator.MAX_CUS + 1]),
        st.sampled_from([0, 196608]), st.sampled_from([0, 10]),
        st.sampled_from([None, 2, 2.0, 2.5, True, [2]])), max_size=8))
    def test_usable_device_memo_answers_as_a_fresh_check(
            self, specs: list[tuple[Any, ...]]) -> None:
        # what is kept per (type, devcore, devmem, count, unit) never
        # hides a bad id, nor another device's fields
        from amdgpu_virt.k8s.fit import view as fitview

        for uuid, kind, devcore, devmem, count, unit in specs:
            custom = {} if unit is None else {'cuPerWGP': unit}
            made = device(uuid, kind=kind, devcore=devcore, devmem=devmem,
                          count=count, **custom)
            warm = fit.usable_device(made)
            fitview._device_problem.cache_clear()
            self.assertEqual(fit.usable_device(made), warm)

    def test_usable_device_memo_is_bounded(self) -> None:
        from amdgpu_virt.k8s.fit import view as fitview

        for n in range(fitview._DEVICE_PROBLEM_ENTRIES + 5):
            self.assertIsNone(fit.usable_device(device('g0', devmem=n + 1)))
        self.assertLessEqual(fitview._device_problem.cache_info().currsize,
                             fitview._DEVICE_PROBLEM_ENTRIES)


class DecideTest(testtools.TestCase):

    def test_node_policies_and_reasons(self) -> None:
        idle = fit.build_view('a-idle', [device('a0')], [])
        busy = fit.build_view('b-busy', [device('b0')],
                              [used('b0', 100000, 152)])
        empty = fit.build_view('c-empty', [], [])
        req = request({'amd.com/gpucores': 25, 'amd.com/gpumem': 1})
        decision = fit.decide([idle, busy, empty], req, ['d-gone'])
        assert decision.fit is not None
        self.assertEqual('b-busy', decision.fit.node)
        self.assertIn('node b-busy was chosen', decision.failed['a-idle'])
        self.assertIn('no AMD GPU registered',
                      decision.unresolvable['c-empty'])
        self.assertIn('unknown', decision.unresolvable['d-gone'])
        self.assertIs(fit.FitCode.SUCCESS, decision.code)
        self.assertEqual(
            [('a-idle', fit.FitCode.UNSCHEDULABLE),
             ('c-empty', fit.FitCode.UNRESOLVABLE),
             ('d-gone', fit.FitCode.UNRESOLVABLE)],
            [(r.node, r.code) for r in decision.reasons()])
        req = request({'amd.com/gpucores': 25, 'amd.com/gpumem': 1},
                      **{hami.NODE_SCHEDULER_POLICY: 'spread'})
        decision = fit.decide([idle, busy], req)
        assert decision.fit is not None
        self.assertEqual('a-idle', decision.fit.node)

    def test_nothing_fits(self) -> None:
        full = fit.build_view('n', [device('g0')], [used('g0', 1, 304)])
        decision = fit.decide([full], request({'amd.com/gpucores': 5,
                                               'amd.com/gpumem': 1}))
        self.assertIsNone(decision.fit)
        self.assertIn('at most 0 CUs', decision.failed['n'])
        self.assertIs(fit.FitCode.UNSCHEDULABLE, decision.code)
        never = fit.decide([fit.build_view('e', [], [])], request(
            {'amd.com/gpucores': 5}))
        self.assertIs(fit.FitCode.UNRESOLVABLE, never.code)
        (reason,) = never.reasons()
        self.assertEqual(('e', 'no AMD GPU registered in '
                          'hami.io/node-amd-register'),
                         (reason.node, reason.reason))


@st.composite
def _requests(draw: Any) -> fit.PodRequest:
    containers = []
    for n in range(draw(st.integers(1, 2))):
        percent = draw(st.sampled_from((1, 5, 10, 25, 33, 50, 100)))
        mem = draw(st.sampled_from((0, 1, 1024, 65536, 196608)))
        containers.append(fit.ContainerRequest('c%d' % n, draw(
            st.integers(1, 2)), mem, percent))
    return fit.PodRequest(tuple(containers), gpu_policy=draw(
        st.sampled_from(('spread', 'binpack', 'numa'))))


class FitPropertyTest(testtools.TestCase):

    @given(st.lists(_requests(), min_size=1, max_size=25))
    def test_decisions_never_overcommit(self, requests: list[Any]) -> None:
        devices = [device('g%d' % n, n, numa=n // 2) for n in range(3)]
        usage: list[fit.PodUsage] = []
        strategy = allocator.BestFitStrategy()
        for number, req in enumerate(requests):
            view = fit.build_view('n', devices, usage, strategy)
            result = fit.fit_node(view, req, strategy)
            if isinstance(result, fit.NodeFit):
                usage.append(('p%d' % number, result.containers, None))
        totals: dict[str, list[int]] = {}
        for _owner, containers, _masks in usage:
            for container in containers:
                self.assertEqual(len(container), len({d.uuid for d in
                                                      container}))
                for d in container:
                    total = totals.setdefault(d.uuid, [0, 0, 0])
                    total[0] += 1
                    total[1] += d.usedcores
                    total[2] += d.usedmem
        for slots, cores, mem in totals.values():
            self.assertLessEqual(slots, 10)
            self.assertLessEqual(cores, 304)
            self.assertLessEqual(mem, 196608)
        # and the CU view can hold them all at once
        view = fit.build_view('n', devices, usage, strategy)
        self.assertIsNone(view.problem)


class MemoryEnforcementTest(testtools.TestCase):
    """A namespace requiring kernel enforcement: slices only on GPUs that
    register a kernel level; whole GPUs anywhere."""

    def kernel_only(self, *containers: dict[str, Any]) -> fit.PodRequest:
        return dataclasses.replace(
            request(*containers),
            memory_enforcement=enforcement.Requirement.KERNEL,
            memory_enforcement_why="namespace 'team' (label "
            "gpu.amd.com/memory-enforcement=kernel)")

    def test_slices_go_where_the_kernel_caps(self) -> None:
        view = fit.build_view('n', [
            device('hooked', 0, memoryEnforcement='hook'),
            device('kernel', 1, memoryEnforcement='kernel+hook')], [])
        placed = fit.fit_node(view, self.kernel_only(
            {'amd.com/gpucores': 25, 'amd.com/gpumem': 1024}))
        assert isinstance(placed, fit.NodeFit)
        self.assertEqual('kernel', placed.containers[0][0].uuid)
        self.assertTrue(self.kernel_only().filtered)

    def test_the_reason_names_the_label(self) -> None:
        view = fit.build_view('n', [
            device('hooked', 0, memoryEnforcement='hook'),
            device('unknown', 1)], [])
        why = fit.fit_node(view, self.kernel_only(
            {'amd.com/gpucores': 25}))
        self.assertIsInstance(why, str)
        self.assertIn('0 of 2 GPUs fit', why)
        self.assertIn('memory enforcement hook, but namespace', why)
        self.assertIn('gpu.amd.com/memory-enforcement=kernel', why)
        self.assertIn('memory enforcement unknown', why)

    def test_whole_gpus_need_no_level(self) -> None:
        view = fit.build_view('n', [device('hooked', 0,
                                           memoryEnforcement='hook')], [])
        placed = fit.fit_node(view, self.kernel_only({'amd.com/gpu': 1}))
        self.assertIsInstance(placed, fit.NodeFit)

    def test_without_a_requirement_any_level(self) -> None:
        view = fit.build_view('n', [device('g', 0,
                                           memoryEnforcement='none')], [])
        self.assertIsInstance(fit.fit_node(view, request(
            {'amd.com/gpucores': 25})), fit.NodeFit)
