"""Memory enforcement on the DRA path: the attribute, shares a node may
publish, and the createRuntime hook of a share's CDI request."""

from __future__ import annotations

import testtools

from amdgpu_virt.k8s.dra import cdi
from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.dra import prepare as dra_prepare
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.k8s.dra import state as dra_state
from amdgpu_virt.k8s.node import devices as unit_devices
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.model import Role
from amdgpu_virt.sharing.enforcement import Level
from amdgpu_virt.sharing.enforcement import Requirement
from tests.unit.k8s.dra import helpers

NODE = 'n1'


class WithEnforcementTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.inventory = helpers.host('mi300x-spx')
        gpus = self.inventory.gpus
        self.shared = str(gpus[1].address)
        roles = [Role.K8S_DEDICATED, Role.K8S_SHARED] + [Role.IDLE] * (
            len(gpus) - 2)
        self.plan = dra_devices.plan(NODE, self.inventory, helpers.roles(
            self.inventory, NODE, *roles).for_host(NODE))
        self.levels = {str(g.address): Level.HOOK for g in gpus}

    def test_the_attribute_on_every_device(self) -> None:
        plan, dropped = dra_devices.with_enforcement(
            self.plan, self.levels, Requirement.KERNEL_OR_HOOK)
        self.assertEqual((), dropped)
        objs = [slices.device_object(d) for d in plan.devices]
        self.assertEqual({'hook'}, {o['attributes']['memoryEnforcement'][
            'string'] for o in objs})

    def test_shares_below_the_requirement_are_left_out(self) -> None:
        plan, dropped = dra_devices.with_enforcement(
            self.plan, self.levels, Requirement.KERNEL)
        self.assertEqual(['share'], sorted({d.type.value for d in
                                            self.plan.devices} - {
            d.type.value for d in plan.devices}))
        self.assertTrue(dropped)
        self.assertTrue(all(n.endswith('-share') for n in dropped))


class CdiHookTest(testtools.TestCase):

    def test_a_requests_shares_summed_per_gpu_in_one_hook(self) -> None:
        inventory = helpers.host('mi300x-cpx')
        units = unit_devices.units_from_inventory(inventory)
        gpu = units[0].gpu_address
        claim = dra_state.PreparedClaim(uid='u', namespace='ns', name='c',
                                        devices=tuple(
            dra_state.PreparedDevice(
                request='r', pool=NODE, device='d%d' % part, gpu=gpu,
                partitions=(part,), share_id='s%d' % part,
                compute_units=2, memory_mib=1024,
                masks=((part, 0b11),)) for part in (0, 1)))
        edits = dra_prepare.container_edits(claim, units, kernel={gpu})
        (request,) = edits.requests
        self.assertEqual(((dmem.region(gpu), 2048 << 20),), request.caps)
        hook = cdi.DmemHook('/usr/local/bin/amdgpu-virt')
        spec = cdi.spec('gpu.amd.com', 'u', claim, edits,
                        lambda path: (1, 2), hook)
        hooks = [d['containerEdits'].get('hooks') for d in spec['devices']]
        self.assertEqual([None, None, [{
            'hookName': 'createRuntime',
            'path': '/usr/local/bin/amdgpu-virt',
            'args': ['amdgpu-virt', 'k8s', 'dmem-hook', '--cap',
                     '%s=%d' % (dmem.region(gpu), 2048 << 20)],
            'timeout': 30}]], hooks)
        # the kernel does not cap that GPU: no caps, no hook
        plain = dra_prepare.container_edits(claim, units)
        self.assertEqual((), plain.requests[0].caps)
        self.assertNotIn('hooks', cdi.spec(
            'gpu.amd.com', 'u', claim, plain, lambda path: (1, 2),
            hook)['devices'][-1]['containerEdits'])
