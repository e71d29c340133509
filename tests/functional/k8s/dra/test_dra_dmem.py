"""DRA shares capped by the kernel before their container's process runs.

The DRA plugin (built from its options) on a simulated node whose cgroup
v2 tree has the dmem controller: a share's CDI spec carries a
``createRuntime`` hook; the runtime model (:mod:`cdiruntime`) creates the
container's cgroup with its init process in it, runs the hook as a real
process (``amdgpu-virt k8s dmem-hook``) with the OCI state on stdin, and
only then would start the container. Mocked: the kernel (a simulated
cgroup tree) and the container engine.
"""

from __future__ import annotations

import os
import shutil
import sys

import fixtures
import testtools

from amdgpu_virt.k8s.dra import cdi
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import dmem
from tests.functional.fixtures import cdiruntime
from tests.functional.fixtures import cgroupfs
from tests.functional.fixtures import drakubelet
from tests.functional.k8s.dra import test_dra_plugin as base

GIB = 1 << 30
HOOK = shutil.which('amdgpu-virt') or os.path.join(
    os.path.dirname(sys.executable), 'amdgpu-virt')


class DmemHookTest(testtools.TestCase):

    def node(self, dmem_controller: bool = True,
             requirement: str = 'kernel-or-hook',
             hook: str = HOOK) -> base.DraNode:
        self.host = self.useFixture(fixtures.TempDir()).path
        root = os.path.join(self.host, 'sys', 'fs', 'cgroup')
        self.cg = cgroupfs.SimNode(root, dmem_controller=dmem_controller,
                                   enabled=False, gpus={
            str(g.address): 192 * GIB for g in
            base.helpers.host('mi300x-mixed-nps4').gpus})
        return self.useFixture(base.DraNode(
            dra={'dmem_hook': hook, 'dmem_hook_root': self.host},
            kubernetes={'cgroup_root': root,
                        'memory_enforcement': requirement}))

    def attributes(self, node: base.DraNode) -> dict[str, str]:
        return {d['name']: d['attributes']['memoryEnforcement']['string']
                for s in node.slices() for d in s['spec'].get('devices', [])
                if 'memoryEnforcement' in d['attributes']}

    def create(self, container: cdiruntime.Container, pod_uid: str,
               pid: int) -> cgroups.Parts:
        """The runtime's create: the container's cgroup holding its init
        process, then the createRuntime hooks."""
        pod = self.cg.pod(pod_uid, cgroups.QosClass.BURSTABLE)
        parts = self.cg.container(pod, 'cri-containerd-%d' % pid, pid)
        proc = os.path.join(self.host, 'proc', str(pid))
        os.makedirs(proc)
        with open(os.path.join(proc, 'cgroup'), 'w') as out:
            out.write('0::/%s\n' % '/'.join(parts))
        cdiruntime.run_hooks(container, 'createRuntime', {
            'ociVersion': '1.2.0', 'id': 'c%d' % pid, 'status': 'creating',
            'pid': pid, 'bundle': '/run/x'})
        return parts

    def test_a_share_starts_capped(self) -> None:
        node = self.node()
        levels = self.attributes(node)
        self.assertTrue(levels)
        self.assertEqual({'kernel'}, set(levels.values()))
        claim = node.allocate('s', [base.share_request(memory='8Gi')])
        entry = node.prepare(claim)[claim['metadata']['uid']]
        self.assertEqual('', entry.error)
        container = cdiruntime.inject([node.spec(claim)],
                                      drakubelet.container_cdi_ids(entry))
        (hook,) = container.hooks
        gpu = node.plugin.state.load()[claim['metadata']['uid']].devices[0]
        region = dmem.region(gpu.gpu)
        self.assertEqual(cdi.DmemHook(HOOK, self.host).entry(
            [(region, 8 * GIB)]), hook)
        parts = self.create(container, 'pod-a', 4321)
        # capped before start, on the container's own cgroup
        self.assertEqual(8 * GIB, self.cg.caps(parts)[region])
        self.assertEqual(None, self.cg.caps(parts[:-1])[region])

    def test_a_failing_hook_fails_the_creation(self) -> None:
        node = self.node()
        claim = node.allocate('s', [base.share_request(memory='4Gi')])
        entry = node.prepare(claim)[claim['metadata']['uid']]
        container = cdiruntime.inject([node.spec(claim)],
                                      drakubelet.container_cdi_ids(entry))
        # the init process is gone (no /proc/<pid>/cgroup)
        err = self.assertRaises(cdiruntime.HookFailed, cdiruntime.run_hooks,
                                container, 'createRuntime', {
                                    'pid': 999, 'status': 'creating'})
        self.assertIn(os.path.join(self.host, 'proc', '999', 'cgroup'),
                      err.stderr)
        # a state that names no process
        err = self.assertRaises(cdiruntime.HookFailed, cdiruntime.run_hooks,
                                container, 'createRuntime', {'pid': 'x'})
        self.assertIn('OCI state from the container runtime: pid', err.stderr)
        # a container cgroup replaced by a link out of the tree
        pod = self.cg.pod('pod-b', cgroups.QosClass.BEST_EFFORT)
        self.cg.container(pod, 'first', 76)   # dmem enabled down to pod-b
        os.symlink(self.host, self.cg.fs.where((*pod, 'evil')))
        proc = os.path.join(self.host, 'proc', '77')
        os.makedirs(proc)
        with open(os.path.join(proc, 'cgroup'), 'w') as out:
            out.write('0::/%s/evil\n' % '/'.join(pod))
        err = self.assertRaises(cdiruntime.HookFailed, cdiruntime.run_hooks,
                                container, 'createRuntime', {'pid': 77})
        self.assertIn('evil: a symbolic link', err.stderr)

    def test_without_dmem_no_hook_and_shares_by_requirement(self) -> None:
        node = self.node(dmem_controller=False, requirement='none')
        self.assertEqual({'none'}, set(self.attributes(node).values()))
        claim = node.allocate('s', [base.share_request(memory='4Gi')])
        entry = node.prepare(claim)[claim['metadata']['uid']]
        container = cdiruntime.inject([node.spec(claim)],
                                      drakubelet.container_cdi_ids(entry))
        self.assertEqual([], container.hooks)

    def test_kernel_required_and_missing_publishes_no_share(self) -> None:
        node = self.node(dmem_controller=False, requirement='kernel')
        types = {d['attributes']['type']['string'] for s in node.slices()
                 for d in s['spec'].get('devices', [])}
        self.assertNotIn('share', types)
        self.assertIn('gpu', types)
        self.assertIsNone(node.allocate(
            's', [base.share_request(memory='4Gi')]))

    def test_no_hook_command_no_kernel_level(self) -> None:
        node = self.node(hook='', requirement='none')
        self.assertEqual({'none'}, set(self.attributes(node).values()))
