"""Kubernetes holdings for the planner (k8s.running): pods and claims as
the API serves them, hostile ones included."""

from __future__ import annotations

import testtools

from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.pool import consumers
from amdgpu_virt.k8s.pool import running as k8s_running
from amdgpu_virt.sharing import hami

DRIVER = 'gpu.amd.com'


def _claim(*results, name='c'):
    return {'metadata': {'name': name, 'namespace': 'ns'},
            'status': {'allocation': {'devices': {'results': list(results)}}}}


def _result(device, pool='n1', driver=DRIVER, **extra):
    return dict({'request': 'r', 'driver': driver, 'pool': pool,
                 'device': device}, **extra)


class ClaimHoldingsTest(testtools.TestCase):

    def holdings(self, claim):
        return k8s_running._claim_holdings(claim, DRIVER)

    def test_whole_gpu_partition_and_share(self):
        (whole, part, share) = self.holdings(_claim(
            _result('gpu-0000-05-00-0'), _result('gpu-0000-25-00-0-p3'),
            _result('gpu-0000-45-00-0-share', consumedCapacity={
                'computeUnits': '76', 'memory': '20Gi'})))
        self.assertEqual(('claim/ns/c', 'n1', '0000:05:00.0', True, None),
                         (whole.consumer, whole.host, whole.address,
                          whole.whole, whole.partition))
        self.assertEqual((True, 3), (part.whole, part.partition))
        self.assertEqual((False, None, 76, 20480),
                         (share.whole, share.partition, share.compute_units,
                          share.memory_mib))
        self.assertIsNone(share.problem)

    def test_other_drivers_and_unallocated_claims_hold_nothing(self):
        self.assertEqual([], self.holdings(_claim(
            _result('gpu-0000-05-00-0', driver='gpu.nvidia.com'))))
        self.assertEqual([], self.holdings({'metadata': {}}))
        self.assertEqual([], self.holdings(
            {'status': {'allocation': {'devices': {'results': 'x'}}}}))

    def test_hostile_results_are_problems_naming_the_field(self):
        bad_device, bad_capacity, huge = self.holdings(_claim(
            _result('../../etc'),
            _result('gpu-0000-05-00-0-share',
                    consumedCapacity={'computeUnits': '1e400000'}),
            _result('gpu-0000-05-00-0-share', consumedCapacity={
                'computeUnits': 'x' * 10000, 'memory': '1Gi'})))
        self.assertIsNone(bad_device.address)
        self.assertIn("results[0] names device '../../etc', which maps to "
                      'no GPU', bad_device.problem)
        self.assertEqual('0000:05:00.0', bad_capacity.address)
        self.assertIn('results[1].consumedCapacity', bad_capacity.problem)
        self.assertIn('results[2].consumedCapacity', huge.problem)
        self.assertLess(len(huge.problem), 400)

    def test_too_many_results(self):
        found = self.holdings(_claim(*[_result('gpu-0000-05-00-0-share',
                                               consumedCapacity={
                                                   'computeUnits': '1',
                                                   'memory': '1'})] * 500))
        self.assertEqual(k8s_running.MAX_RESULTS + 1, len(found))
        self.assertIn('more than 64 results', found[-1].problem)


class PodHoldingsTest(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.inventory = simulate.design_host(simulate.HostSpec(
            'n1', gpus=2, mode='cpx'))
        self.units = k8s_running._unit_index([self.inventory])
        self.unit = devices.units_from_inventory(self.inventory)[3]

    def consumer(self, *grants, problem=None, masks=None):
        return consumers.Consumer(
            'ns/p', 'n1', consumers.State.BOUND,
            devices=frozenset(g[0] for g in grants), problem=problem,
            grants=tuple(grants), cu_masks=masks)

    def test_a_unit_maps_to_its_gpu_and_partition(self):
        (held,) = k8s_running._pod_holdings(
            self.consumer((self.unit.uuid, 4096, 19),
                          masks={self.unit.uuid: 0b111}),
            self.units, {}, None)
        self.assertEqual(('pod/ns/p', self.unit.gpu_address, 3, 19, 4096,
                          (0, 1, 2)),
                         (held.consumer, held.address, held.partition,
                          held.compute_units, held.memory_mib, held.cus))

    def test_the_allocation_record_wins_over_the_annotation(self):
        (held,) = k8s_running._pod_holdings(
            self.consumer((self.unit.uuid, 4096, 2),
                          masks={self.unit.uuid: 0b11}),
            self.units, {}, {self.unit.uuid: 0b1100})
        self.assertEqual((2, 3), held.cus)

    def test_unknown_devices_and_unreadable_pods_are_problems(self):
        registered = {'n1': {'rogue': '0000:05:00.0'}}
        rogue, ghost = k8s_running._pod_holdings(
            self.consumer(('rogue', 1, 1), ('ghost', 1, 1)), self.units,
            registered, None)
        self.assertEqual('0000:05:00.0', rogue.address)
        self.assertIn('device rogue is registered on GPU 0000:05:00.0, but '
                      'it is not a device of that GPU', rogue.problem)
        self.assertIsNone(ghost.address)
        self.assertIn('device ghost is neither a GPU of the inventory',
                      ghost.problem)
        (bad,) = k8s_running._pod_holdings(
            self.consumer(problem='unreadable allocation: x'), self.units,
            {}, None)
        self.assertEqual((None, 'unreadable allocation: x'),
                         (bad.address, bad.problem))

    def test_the_consumer_view_carries_the_sizes(self):
        value = hami.encode_pod_devices([[hami.ContainerDevice(
            'GA', 'AMD', 10, 3)], [hami.ContainerDevice('GB', 'AMD', 20, 4)]])
        consumer = consumers.from_pod({
            'metadata': {'name': 'p', 'namespace': 'ns', 'annotations': {
                hami.DEVICES_ALLOCATED: value,
                hami.CU_ALLOCATED: '{"GA": "0-2"}'}},
            'spec': {'nodeName': 'n1'}, 'status': {'phase': 'Running'}})
        self.assertEqual((('ga', 10, 3), ('gb', 20, 4)), consumer.grants)
        self.assertEqual({'ga': 0b111}, consumer.cu_masks)
