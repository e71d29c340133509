"""Properties of the rendered device specs over random simulated hosts."""

from __future__ import annotations

import fnmatch
import re

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt.inventory.simulate import HostSpec
from amdgpu_virt.inventory.simulate import design_host
from amdgpu_virt.nova import pci
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.naming import Naming

MODES = ('gim-cpx', 'gim-spx', 'vfio', 'spx', 'cpx')


def _matches(spec: dict, address: str, product: str) -> bool:
    """Nova's matching rules for the spec forms we render."""
    if spec['product_id'] != product or spec['vendor_id'] != '1002':
        return False
    selector = spec['address']
    if isinstance(selector, str):
        return fnmatch.fnmatchcase(address, selector)
    domain, bus, rest = address.split(':')
    slot, function = rest.split('.')
    return all(re.match(selector[k], v) for k, v in (
        ('domain', domain), ('bus', bus), ('slot', slot),
        ('function', function)))


class TestSpecProperties(testtools.TestCase):

    @given(st.lists(st.sampled_from(MODES), min_size=1, max_size=8))
    def test_each_function_matched_once_or_never(self, modes):
        inventory = design_host(HostSpec('h', gpus=len(modes),
                                         gpu_modes=tuple(modes)))
        plan = nova_plan.plan_host(inventory, Naming())
        specs = pci.device_specs(plan,
                                 all_functions=pci.host_functions(inventory))
        self.assertEqual(specs, pci.device_specs(
            plan, all_functions=pci.host_functions(inventory)))
        for gpu in inventory.gpus:
            offered_whole = gpu.driver.value == 'vfio-pci'
            hits = [s for s in specs if _matches(
                s, str(gpu.address), '%04x' % gpu.device_id)]
            self.assertEqual(1 if offered_whole else 0, len(hits),
                             str(gpu.address))
            for vf in gpu.vfs:
                hits = [s for s in specs if _matches(
                    s, str(vf.address), '%04x' % vf.device_id)]
                self.assertEqual(1, len(hits), str(vf.address))
                # one class and trait set per PF
                self.assertEqual(
                    {(s['resource_class'], s['traits']) for s in hits},
                    {(plan.offer(gpu.address).resource_class,
                      ','.join(plan.offer(gpu.address).traits))})
