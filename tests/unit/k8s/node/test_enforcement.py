"""Each GPU's memory enforcement level, and whether a node offers slices."""

from __future__ import annotations

import os
import shutil
import types
from typing import Any

import _ctypes
import fixtures
import testtools

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.k8s.node import enforcement
from amdgpu_virt.k8s.node import memhook
from amdgpu_virt.k8s.node.enforcement import Level
from amdgpu_virt.k8s.node.enforcement import Requirement
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import cgroupfs

GIB = 1 << 30
A = '0000:05:00.0'
B = '0000:85:00.0'


class AssessTest(testtools.TestCase):

    USABLE = memhook.HookStatus('/lib.so', True)
    MISSING = memhook.HookStatus('/lib.so', False, 'no such file')
    KERNEL = dmem.NodeDmem(True, '', {dmem.region(A): GIB,
                                      dmem.region(B): GIB})

    def test_levels(self) -> None:
        none = dmem.NodeDmem(False, 'no dmem controller')
        for node, hook, level in (
                (self.KERNEL, self.USABLE, Level.KERNEL_HOOK),
                (self.KERNEL, self.MISSING, Level.KERNEL),
                (none, self.USABLE, Level.HOOK),
                (none, self.MISSING, Level.NONE),
                (None, None, Level.NONE)):
            judged = enforcement.assess(Requirement.KERNEL_OR_HOOK, [A, B],
                                        node, hook)
            self.assertEqual({A: level, B: level}, dict(judged.levels))

    def test_a_gpu_without_a_region(self) -> None:
        node = dmem.NodeDmem(True, '', {dmem.region(A): GIB})
        judged = enforcement.assess(Requirement.KERNEL, [A, B], node,
                                    self.USABLE)
        self.assertEqual({A: Level.KERNEL_HOOK, B: Level.HOOK},
                         dict(judged.levels))
        self.assertFalse(judged.offers_slices)
        self.assertTrue(judged.kernel)
        self.assertIs(Level.HOOK, judged.weakest())
        refusal = judged.refusal()
        self.assertIn('memory_enforcement = kernel', refusal)
        self.assertIn('%s hook (no kernel cap: the dmem controller lists '
                      'no region drm/%s/vram' % (B, B), refusal)
        self.assertNotIn(A, refusal)

    def test_requirements(self) -> None:
        for requirement, offers in (
                (Requirement.KERNEL_OR_HOOK, True), (Requirement.KERNEL,
                                                     False),
                (Requirement.HOOK, True), (Requirement.KERNEL_AND_HOOK,
                                           False),
                (Requirement.NONE, True)):
            judged = enforcement.assess(
                requirement, [A], dmem.NodeDmem(False, 'old kernel'),
                self.USABLE)
            self.assertEqual(offers, judged.offers_slices, requirement)
        judged = enforcement.assess(Requirement.KERNEL_OR_HOOK, [A],
                                    dmem.NodeDmem(False, 'old kernel'),
                                    self.MISSING)
        self.assertIn('no kernel cap: old kernel; no LD_AUDIT hook: no '
                      'such file', judged.refusal())


class ShareCountTest(testtools.TestCase):
    """The requirement applied to a (simulated) node's cgroups and hook."""

    def setUp(self) -> None:
        super().setUp()
        self.conf = conf_pkg.new_conf()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.logger = self.useFixture(fixtures.FakeLogger())
        self.library = os.path.join(self.tmp, 'libamvgpu.so')
        self.conf.set_override('vgpu_library', self.library, 'kubernetes')
        self.conf.set_override('cgroup_root', os.path.join(self.tmp, 'cg'),
                               'kubernetes')

    def hook(self) -> None:
        shutil.copy(_ctypes.__file__, self.library)

    def node(self, **kwargs: Any) -> cgroupfs.SimNode:
        kwargs.setdefault('gpus', {A: 64 * GIB})
        return cgroupfs.SimNode(os.path.join(self.tmp, 'cg'), **kwargs)

    def count(self, requirement: str = 'kernel-or-hook'
              ) -> tuple[int, enforcement.NodeEnforcement | None]:
        self.conf.set_override('memory_enforcement', requirement,
                               'kubernetes')
        return enforcement.share_count(self.conf, [A])

    def test_kernel_alone_keeps_sharing_by_default(self) -> None:
        self.node()
        count, judged = self.count()
        self.assertEqual(10, count)
        assert judged is not None
        self.assertEqual({A: Level.KERNEL}, dict(judged.levels))

    def test_hook_alone_keeps_sharing_by_default(self) -> None:
        self.hook()
        count, judged = self.count()
        self.assertEqual(10, count)
        assert judged is not None
        self.assertIs(Level.HOOK, judged.levels[A])
        self.assertIn('No such file', judged.kernel_reasons[A])

    def test_neither_whole_gpus_only_and_why(self) -> None:
        self.node(dmem_controller=False)
        count, judged = self.count()
        self.assertEqual(1, count)
        self.assertIn('offering whole GPUs only', self.logger.output)
        self.assertIn(self.library, self.logger.output)
        self.assertIn('lists no dmem controller', self.logger.output)

    def test_kernel_required(self) -> None:
        self.hook()
        self.assertEqual(1, self.count('kernel')[0])
        self.assertIn('memory_enforcement = kernel needs the kernel',
                      self.logger.output)
        self.node()
        self.assertEqual(10, self.count('kernel')[0])
        self.assertEqual(10, self.count('kernel-and-hook')[0])

    def test_kernel_needs_kubelets_cgroups(self) -> None:
        self.node()
        shutil.rmtree(os.path.join(self.tmp, 'cg', 'kubepods.slice'))
        count, judged = self.count('kernel')
        self.assertEqual(1, count)
        assert judged is not None
        self.assertIn('kubepods.slice', judged.kernel_reasons[A])

    def test_not_needed_without_sharing(self) -> None:
        self.conf.set_override('allocation_mode', 'whole', 'kubernetes')
        self.assertEqual((10, None), self.count('kernel'))
        self.conf.set_override('allocation_mode', 'hami', 'kubernetes')
        self.conf.set_override('share_count', 1, 'kubernetes')
        self.assertEqual((1, None), self.count('kernel'))

    def test_none_shares_whatever_the_node_has(self) -> None:
        self.assertEqual(10, self.count('none')[0])


class PublishedTest(testtools.TestCase):

    def test_registration_carries_each_gpus_level(self) -> None:
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1',
                                                           gpus=2))
        units = devices.units_from_inventory(inventory)
        levels = {units[0].gpu_address: Level.KERNEL_HOOK,
                  units[1].gpu_address: Level.HOOK}
        infos = agent.registration(units, 10, {}, levels=levels)
        self.assertEqual(['kernel+hook', 'hook'],
                         [i.custominfo['memoryEnforcement'] for i in infos])
        decoded = hami.decode_node_register(hami.encode_node_register(infos))
        self.assertEqual(infos, decoded)
        self.assertNotIn('memoryEnforcement', agent.registration(
            units, 10, {})[0].custominfo)

    def test_label_and_event(self) -> None:
        judged = enforcement.assess(
            Requirement.KERNEL, [A, B],
            dmem.NodeDmem(True, '', {dmem.region(A): GIB}),
            memhook.HookStatus('/l.so', True))
        self.assertEqual('hook', enforcement.label_value(judged))
        store = _Store()
        api = _Events()
        enforcement.report(store, api, judged, 1, 'now')
        self.assertEqual([{enforcement.NODE_LABEL: 'hook'}], store.labels)
        (body,) = api.events
        self.assertEqual(enforcement.EVENT_REASON, body['reason'])
        self.assertIn(B, body['message'])
        self.assertIn('whole GPUs only', body['message'])
        enforcement.report(store, api, judged, 1, 'later')
        self.assertEqual(body['metadata']['name'],
                         api.events[-1]['metadata']['name'])
        both = enforcement.assess(
            Requirement.KERNEL, [A], dmem.NodeDmem(True, '', {
                dmem.region(A): GIB}), memhook.HookStatus('/l.so', True))
        self.assertEqual('kernel-hook', enforcement.label_value(both))


class _Store:

    def __init__(self) -> None:
        self.labels: list[dict[str, Any]] = []

    def read(self) -> dict[str, Any]:
        labels = {}
        for change in self.labels:
            labels.update(change)
        return {'metadata': {'name': 'n1', 'uid': 'u1', 'labels': labels}}

    def label(self, node: Any, labels: dict[str, Any]) -> None:
        self.labels.append(dict(labels))


class _Events:

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def create_namespaced_event(self, namespace: str, body: Any,
                                **kwargs: Any) -> Any:
        self.events.append(body)
        return types.SimpleNamespace(data=b'{}', status=201,
                                     release_conn=lambda: None)
