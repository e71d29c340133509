"""Wide VMs (8, 16, 32 VFs on one host) get allocation candidates.

The host is an 8 x MI300X GIM CPX host (64 VFs) rendered by amdgpu_virt,
seeded into the real Placement server the way nova-compute reports it
(one provider per GPU with the device_spec's traits, per-GPU trait
included); the flavors are amdgpu_virt flavor specs; the query is the one
Nova 34's scheduler builds from them (:mod:`novaquery`), restricted to
the test's host with ``in_tree``. With per-GPU aliases every request
group matches exactly one provider, so there is one candidate and it
comes back at once; with the plain alias the candidates multiply (8^n
for n VFs, which for 8 VFs Placement never finishes building: measured
in ``bench/nova_wide.py``, not here).
"""

from __future__ import annotations

import logging
import time
import unittest
import uuid

import fixtures
import testtools

from tests.functional.fixtures import nova_env
from tests.functional.fixtures import placement as placement_fixture
from tests.functional.nova import novaquery

from amdgpu_virt.inventory.simulate import HostSpec
from amdgpu_virt.inventory.simulate import design_host
from amdgpu_virt.nova import flavors
from amdgpu_virt.nova import pci
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.naming import Naming

#: Generous: the answer takes milliseconds; the bound only catches an
#: enumeration (the plain 8-VF query does not finish within minutes).
BOUND_S = 20.0


def _flavor(count: int, gpus: int = 0) -> flavors.FlavorSpec:
    raw = {'name': 'wide-%d-%d' % (count, gpus), 'vcpus': 16,
           'ram_mib': 65536, 'disk_gb': 100, 'alias': 'amd-mi300x-cpx-vf',
           'count': count}
    if gpus:
        raw['gpus'] = gpus
    (spec,) = flavors.parse({'flavors': [raw]})
    return spec


@unittest.skipUnless(nova_env.AVAILABLE, nova_env.SKIP_REASON)
class TestWideVm(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.server = placement_fixture.get_server()
        self.conn = self.server.connection()
        self.host = 'wide-%s' % uuid.uuid4().hex[:8]
        self.plan = nova_plan.plan_host(
            design_host(HostSpec(self.host, mode='gim-cpx')), Naming())
        ids = placement_fixture.NovaLikeSeeder(self.conn).seed_offers(
            self.host, self.plan.offers)
        self.root = ids[self.host]
        self.provider_of = {
            o.gpu_trait: ids['%s_%s' % (self.host, str(o.address).upper())]
            for o in self.plan.offers}
        self.aliases = pci.aliases(
            a for o in self.plan.offers for a in pci.aliases_of(o))

    def candidates(self, spec: flavors.FlavorSpec):
        with novaquery.nova_aliases(self.aliases):
            params = novaquery.query(spec)
        params.append(('in_tree', self.root))
        start = time.monotonic()
        response = self.conn.placement.get(
            '/allocation_candidates', params=params,
            microversion=placement_fixture.MICROVERSION, raise_exc=False)
        elapsed = time.monotonic() - start
        self.assertEqual(200, response.status_code, response.text)
        return params, response.json(), elapsed

    def _check_spread(self, count: int):
        spec = _flavor(count, gpus=8)
        params, body, elapsed = self.candidates(spec)
        groups = novaquery.request_groups(params)
        self.assertEqual(count, len(groups))       # one group per VF
        self.assertLess(elapsed, BOUND_S)
        (request,) = body['allocation_requests']
        self.assertEqual({p: {'CUSTOM_AMD_MI300X_CPX_VF': count // 8}
                          for p in self.provider_of.values()},
                         {p: a['resources'] for p, a in
                          request['allocations'].items() if p != self.root})
        # every group landed on the provider of the GPU its alias names
        required = {key[len('required'):]: value for key, value in params
                    if key.startswith('required') and key != 'required'}
        for suffix, providers in request['mappings'].items():
            if suffix:
                self.assertEqual([self.provider_of[required[suffix]]],
                                 providers)

    def test_8_vfs_one_per_gpu(self):
        self._check_spread(8)

    def test_16_vfs_two_per_gpu(self):
        self._check_spread(16)

    def test_32_vfs_four_per_gpu(self):
        self._check_spread(32)

    def test_plain_alias_enumerates_combinations(self):
        # Why the plain alias cannot serve wide VMs: n groups over 8
        # identical providers give 8^n candidates (2 VFs: 64).
        _params, body, _elapsed = self.candidates(_flavor(2))
        self.assertEqual(64, len(body['allocation_requests']))
        _params, body, _elapsed = self.candidates(_flavor(2, gpus=2))
        self.assertEqual(1, len(body['allocation_requests']))

    def test_more_than_a_gpu_has_gets_no_candidate(self):
        # 72 VFs on 8 GPUs of 8 VFs: refused quickly, not enumerated
        _params, body, elapsed = self.candidates(_flavor(72, gpus=8))
        self.assertEqual([], body['allocation_requests'])
        self.assertLess(elapsed, BOUND_S)

    def test_several_devices_of_a_plain_alias_name_a_group_policy(self):
        # Nova's scheduler warns at every scheduling of a flavor whose
        # request groups number two or more without a group policy
        # (nova.scheduler.utils.resources_from_request_spec)
        logger = self.useFixture(fixtures.FakeLogger(
            name='nova.scheduler.utils', level=logging.WARNING))
        for spec in (_flavor(2), _flavor(4), _flavor(16, gpus=8)):
            params, body, _elapsed = self.candidates(spec)
            self.assertEqual(spec.count, len(novaquery.request_groups(
                params)))
            self.assertIn(('group_policy', 'none'), params, spec.name)
            self.assertTrue(body['allocation_requests'], spec.name)
        self.assertNotIn('group policy', logger.output)
        # one device: one group, no policy needed, none written
        params, _body, _elapsed = self.candidates(_flavor(1))
        self.assertNotIn('group_policy', dict(params))
        self.assertNotIn('group policy', logger.output)
