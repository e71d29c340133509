"""The node registration the agent writes (pure part)."""

from __future__ import annotations

import json

import testtools

from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.sharing import hami

UNITS = devices.units_from_inventory(simulate.design_host(
    simulate.HostSpec(hostname='n1')))


class RegistrationTest(testtools.TestCase):

    def test_one_entry_per_unit(self) -> None:
        infos = agent.registration(UNITS, 10, {UNITS[7].uuid: False})
        self.assertEqual(8, len(infos))
        first = infos[0]
        self.assertEqual(
            (UNITS[0].uuid, 0, 10, UNITS[0].vram_mib, 304,
             'AMD Instinct MI300X', 0, True, 'amd'),
            (first.id, first.index, first.count, first.devmem,
             first.devcore, first.type, first.numa, first.health,
             first.devicevendor))
        self.assertEqual({'pciBDF': UNITS[0].gpu_address}, first.custominfo)
        self.assertTrue(all('amd' in i.type.lower() for i in infos))
        self.assertFalse(infos[7].health)
        self.assertEqual(1, infos[7].numa)

    def test_encoding_is_hamis(self) -> None:
        value = hami.encode_node_register(agent.registration(UNITS[:1], 10,
                                                             {}))
        # Go's omitempty leaves index 0 and numa 0 out
        self.assertEqual(
            '[{"id":"%s","count":10,"devmem":%d,"devcore":304,'
            '"type":"AMD Instinct MI300X","health":true,'
            '"devicevendor":"amd","custominfo":{"pciBDF":"%s"}}]'
            % (UNITS[0].uuid, UNITS[0].vram_mib, UNITS[0].gpu_address),
            value)
        self.assertEqual(1, len(json.loads(value)))

    def test_type_always_says_amd(self) -> None:
        unit = devices.GpuUnit(index=0, uuid='ab', gpu_address='0000:05:00.0',
                               partition=0, card_minor=1, render_minor=128,
                               compute_units=80, vram_mib=1000,
                               product_name='Instinct X', cu_unit=2)
        (info,) = agent.registration([unit], 4, {})
        self.assertEqual('AMD Instinct X', info.type)
        self.assertEqual(2, info.cu_unit)
