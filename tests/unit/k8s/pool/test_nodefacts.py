"""Health and memory enforcement per GPU, from node registrations."""

from __future__ import annotations

import testtools

from amdgpu_virt.k8s.pool import nodefacts
from amdgpu_virt.model import PciAddress
from amdgpu_virt.pool.observed import NodeFacts
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

GPU0 = '0000:05:00.0'
GPU1 = '0000:25:00.0'


def _info(device_id, address, healthy=True, **custominfo):
    return hami.DeviceInfo(
        id=device_id, count=10, devmem=196288, devcore=304,
        type='AMD Instinct MI300X', health=healthy, devicevendor='amd',
        custominfo=dict(custominfo, **{hami.CUSTOMINFO_PCI_BDF: address}))


def _node(infos, name='n1'):
    return {'metadata': {'name': name, 'annotations': {
        hami.NODE_REGISTER: hami.encode_node_register(infos)}}}


REASON = hami.CUSTOMINFO_HEALTH_REASON
LEVEL = enforcement.CUSTOMINFO_KEY


class TestNodeFacts(testtools.TestCase):

    def test_health_and_enforcement_per_gpu(self):
        facts, warnings = nodefacts.node_facts(_node([
            _info('a-p0', GPU0, **{LEVEL: 'kernel'}),
            _info('a-p1', GPU0, **{LEVEL: 'kernel'}),
            _info('b', GPU1, False, **{LEVEL: 'hook',
                                       REASON: 'RAS: 2 uncorrectable'}),
        ]))
        self.assertEqual([], warnings)
        self.assertEqual(NodeFacts('healthy', '', 'kernel'),
                         facts[PciAddress.parse(GPU0)])
        self.assertEqual(NodeFacts('unhealthy', 'RAS: 2 uncorrectable',
                                   'hook'), facts[PciAddress.parse(GPU1)])

    def test_one_sick_partition_makes_its_gpu_sick(self):
        facts, _warnings = nodefacts.node_facts(_node([
            _info('a-p0', GPU0), _info('a-p1', GPU0, False,
                                       **{REASON: 'DRM device gone'}),
            _info('a-p2', GPU0, False, **{REASON: 'DRM device gone'})]))
        gpu = facts[PciAddress.parse(GPU0)]
        self.assertEqual(('unhealthy', 'DRM device gone'),
                         (gpu.health, gpu.reason))

    def test_what_the_node_does_not_say_is_unknown(self):
        facts, warnings = nodefacts.node_facts(_node([
            _info('a', GPU0), _info('b-p0', GPU1, **{LEVEL: 'kernel'}),
            _info('b-p1', GPU1, **{LEVEL: 'hook'})]))
        self.assertEqual([], warnings)
        self.assertEqual('unknown', facts[PciAddress.parse(GPU0)].enforcement)
        # partitions that disagree: not one level
        self.assertEqual('unknown', facts[PciAddress.parse(GPU1)].enforcement)
        self.assertEqual(({}, []), nodefacts.node_facts(
            {'metadata': {'name': 'bare'}}))

    def test_hostile_registrations(self):
        facts, warnings = nodefacts.node_facts(_node([
            _info('a', GPU0, False, **{
                LEVEL: 'unlimited', REASON: '\x1b[2J\x1b]0;owned\x07evil'
                '\u202etxt.exe ' + 'x' * 5000}),
            _info('b', 'not-an-address', False, **{REASON: 'x'}),
            _info('c', GPU1, False, **{REASON: {'nested': ['json']},
                                       LEVEL: ['kernel']})]))
        sick = facts[PciAddress.parse(GPU0)]
        self.assertEqual('unknown', sick.enforcement)
        self.assertLessEqual(len(sick.reason), nodefacts.MAX_REASON)
        self.assertTrue(sick.reason.startswith(
            '\\x1b[2J\\x1b]0;owned\\x07evil\\u202etxt.exe xx'), sick.reason)
        self.assertFalse(any(ord(c) < 32 or c == '\u202e'
                             for c in sick.reason))
        self.assertEqual('{"nested": ["json"]}',
                         facts[PciAddress.parse(GPU1)].reason)
        self.assertEqual(2, len(facts))
        self.assertEqual(2, len(warnings))
        self.assertIn('node n1: device a registers memoryEnforcement '
                      'unlimited, which is not one of kernel, hook, '
                      'kernel+hook, none', warnings[0])
        facts, warnings = nodefacts.node_facts({'metadata': {
            'name': 'n2', 'annotations': {hami.NODE_REGISTER: '[{"id": 7'}}})
        self.assertEqual({}, facts)
        self.assertIn('node n2: ', warnings[0])
