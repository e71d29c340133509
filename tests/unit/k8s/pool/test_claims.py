"""GPUs held by allocated ResourceClaims (the pool side's consumers)."""

from __future__ import annotations

import testtools

from amdgpu_virt.k8s.pool import claims as holders
from amdgpu_virt.model import PciAddress


def _claim(name, results, allocated=True):
    claim = {'metadata': {'namespace': 'ns', 'name': name}}
    if allocated:
        claim['status'] = {'allocation': {'devices': {'results': results}}}
    return claim


def _result(device, driver='gpu.amd.com', pool='n1'):
    return {'request': 'r', 'driver': driver, 'pool': pool,
            'device': device}


class TestHolders(testtools.TestCase):

    def test_device_names_map_to_their_gpu(self):
        gpu = PciAddress.parse('0000:25:00.0')
        for name in ('gpu-0000-25-00-0', 'gpu-0000-25-00-0-p7',
                     'gpu-0000-25-00-0-share', 'gpu-0000-25-00-0-p3-share'):
            self.assertEqual(gpu, holders.device_gpu(name))
        for name in ('gpu-0000-25-00-9', 'gpu-25-00-0', 'x', '', None,
                     'gpu-0000-25-1f-0-p3-share-extra'):
            self.assertIsNone(holders.device_gpu(name))

    def test_only_allocated_claims_of_the_driver(self):
        held = holders.held_gpus([
            _claim('a', [_result('gpu-0000-05-00-0-p1'),
                         _result('gpu-0000-05-00-0', driver='x.io')]),
            _claim('b', [_result('gpu-0000-05-00-0-share')]),
            _claim('c', [_result('gpu-0000-05-00-0')], allocated=False),
            _claim('d', [_result('mystery')]),
            {'status': {'allocation': {'devices': {'results': 'bad'}}}},
        ], 'gpu.amd.com')
        self.assertEqual({
            ('n1', PciAddress.parse('0000:05:00.0')):
                {'ResourceClaim ns/a', 'ResourceClaim ns/b'},
            ('n1', None): {'ResourceClaim ns/d'}}, held)


class FakeCore:
    api_client = None


class TestClaimConsumers(testtools.TestCase):

    def test_consumers_of_a_node(self):
        source = holders.ClaimConsumers(FakeCore(), 'gpu.amd.com')
        source.claims = lambda: [
            _claim('a', [_result('gpu-0000-05-00-0-p1'),
                         _result('gpu-0000-25-00-0')]),
            _claim('b', [_result('mystery')]),
            _claim('c', [_result('gpu-0000-05-00-0', pool='n2')])]
        found = source.consumers('n1')
        self.assertEqual(['ns/a', 'ns/b'], [c.name for c in found])
        self.assertEqual(frozenset({PciAddress.parse('0000:05:00.0'),
                                    PciAddress.parse('0000:25:00.0')}),
                         found[0].addresses)
        self.assertIsNone(found[0].problem)
        self.assertIn('maps to no GPU', found[1].problem)
        self.assertEqual('ns/a (allocated ResourceClaim)',
                         found[0].describe())
        self.assertEqual(3, len(source.consumers(None)))
