"""``move`` killed at every write of the real adapters, then resumed.

The move of a GPU from Nova (``nova-vf``) to Kubernetes (``k8s-shared``)
runs against the real openstack-placement server and the Kubernetes API
server stand-in, through the real adapters (the Nova snippet and GIM
files, the ledger ConfigMap, the node registration, the state file and
the ledger). Each write is counted: files through
:func:`amdgpu_virt.fileutil.atomic_write` and the state file's final
rename, Kubernetes writes through the ``kubernetes`` client's REST layer.
For every write, once before it and once after it took effect, the
process "dies" there (an exception no code catches, as a kill would
leave things), and the same command is run again until the move is done,
with what nova-compute, the operator and the node agent do in between.

Whatever the write, the GPU ends in exactly one cloud (gone from the
Nova snippet and Placement, given to Kubernetes by the ledger ConfigMap,
the node registration and the ledger file), the other GPU keeps its role,
the files are those of an uninterrupted move, and a further run changes
nothing. ``move`` has no rollback: an interrupted move only resumes (a
move back is a move of its own).
"""

from __future__ import annotations

import contextlib
import os
import time
import types

import fixtures
from kubernetes.client import rest

from amdgpu_virt import fileutil
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.cmd import pool as cmd_pool
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import Role
from amdgpu_virt.pool import apply as pool_apply
from tests.functional.pool import test_pool

LEDGER_MAP = ledgermap.Location('kube-system', 'amdgpu-virt-ledger')
WRITES = ('POST', 'PUT', 'PATCH', 'DELETE')


class _Killed(BaseException):
    """The process died here (not an error anyone catches)."""


class _Writes:
    """Counts the move's writes; kills it at one of them."""

    def __init__(self) -> None:
        self.armed = False
        self.count = 0
        self.kill_at: int | None = None
        self.after = False
        self.log: list[str] = []

    def write(self, what: str, do):
        if not self.armed:
            return do()
        self.count += 1
        here = self.count == self.kill_at
        self.log.append(what)
        if here and not self.after:
            self.kill_at = None
            raise _Killed(what)
        result = do()
        if here:
            self.kill_at = None
            raise _Killed(what)
        return result


class InterruptedMoveTest(test_pool.PoolTestCase):

    def setUp(self):
        super().setUp()
        self.writes = writes = _Writes()
        real_write = fileutil.atomic_write
        real_request = rest.RESTClientObject.request

        def atomic_write(path, *args, **kwargs):
            return writes.write('write %s' % os.path.basename(path),
                                lambda: real_write(path, *args, **kwargs))

        def request(client, method, url, *args, **kwargs):
            if method not in WRITES:
                return real_request(client, method, url, *args, **kwargs)
            return writes.write('%s %s' % (method, url.split('/api')[-1]),
                                lambda: real_request(client, method, url,
                                                     *args, **kwargs))

        def replace(src, dst):
            return writes.write('rename %s' % os.path.basename(dst),
                                lambda: os.replace(src, dst))

        self.useFixture(fixtures.MonkeyPatch(
            'amdgpu_virt.fileutil.atomic_write', atomic_write))
        self.useFixture(fixtures.MonkeyPatch(
            'kubernetes.client.rest.RESTClientObject.request', request))
        # the state file's rename when the move is done (cmd/move's own)
        self.useFixture(fixtures.MonkeyPatch(
            'amdgpu_virt.cmd.move.os', types.SimpleNamespace(
                path=os.path, makedirs=os.makedirs, replace=replace)))
        self.root = self.tmp

    # -- one move, driven to the end ----------------------------------------

    #: the move under test: (host attribute, new role)
    host_attr, to = 'vm_host', 'k8s-shared'

    @property
    def host(self):
        return getattr(self, self.host_attr)

    def _fresh(self, name):
        self.tmp = os.path.join(self.root, name)
        os.makedirs(self.tmp)
        self.make_hosts()
        self.seed_nova()
        with contextlib.suppress(rest.ApiException):
            self.k8s.api.delete_namespaced_config_map(LEDGER_MAP.name,
                                                      LEDGER_MAP.namespace)
        self.prepare()

    def prepare(self):
        """What the cluster looks like before the move."""

    def _move(self):
        self.writes.armed = True
        try:
            return self.run_cli(
                'move', '--ledger', self.ledger_path, '--gpu',
                '%s:%s' % (self.host, test_pool.GPU1), '--to', self.to,
                '--snapshot-dir', self.snapshots,
                '--state-dir', os.path.join(self.tmp, 'state'),
                '--output-dir', os.path.join(self.tmp, 'out'))
        finally:
            self.writes.armed = False

    def _provider(self, address):
        return test_pool.TestMove.provider(self, address)

    def _drive(self):
        """Run the move until it is done; :returns: the kills seen."""
        kills = 0
        for _run in range(20):
            try:
                rc, stdout, stderr = self._move()
            except _Killed:
                kills += 1
                continue
            if rc == 0:
                # killed after the ledger was saved: the next run only
                # closes the state file
                self.assertTrue('is now %s' % self.to in stdout or
                                'already has role %s' % self.to in stdout,
                                stdout)
                return kills
            self.assertEqual(cmd_pool.EXIT_WAITING, rc, stdout + stderr)
            if 'waiting for nova to stop offering' in stdout:
                # nova-compute restarted with the new snippet
                provider = self._provider(test_pool.GPU1)
                if provider is not None:
                    self.seeder.delete(provider)
            elif 'change host' in stdout:
                changed = simulate.design_host(simulate.HostSpec(
                    self.vm_host, gpus=2, gpu_modes=('gim-cpx', 'spx')))
                self.write_snapshot(changed)
                self.inventories[self.vm_host] = changed
            elif 'waiting for k8s to offer' in stdout:
                self.run_agent(self.vm_host)
            else:
                self.fail('unexpected wait: %s' % stdout)
        raise AssertionError('the move never finished')

    def _left(self):
        """What the move leaves, with this run's host names taken out."""
        out = os.path.join(self.tmp, 'out')
        files = {}
        for directory, _dirs, names in os.walk(out):
            for name in names:
                path = os.path.join(directory, name)
                # no temporary file of a write cut short is left
                self.assertFalse(name.startswith(fileutil.TEMP_PREFIX) and
                                 name != pool_apply.MANIFEST, path)
                with open(path) as handle:
                    files[os.path.relpath(path, out).replace(
                        self.host, 'HOST')] = handle.read().replace(
                            self.host, 'HOST')
        state = os.path.join(self.tmp, 'state', 'move-%s-0000-25-00.0.json'
                             % self.host)
        self.assertFalse(os.path.exists(state))
        self.assertTrue(os.path.exists(state + '.done'))
        return files

    def check_one_cloud(self):
        gpu0, gpu1 = test_pool.GPU0, test_pool.GPU1
        # Nova: the snippet offers GPU0's VFs only, Placement has no GPU1
        snippet = os.path.join(self.tmp, 'out', self.vm_host,
                               pool_apply.NOVA_SNIPPET)
        with open(snippet) as handle:
            text = handle.read()
        self.assertEqual(1, text.count('device_spec = '))
        self.assertNotIn('0000:25:02', text)
        self.assertIsNone(self._provider(gpu1))
        self.assertIsNotNone(self._provider(gpu0))
        # Kubernetes: the ledger ConfigMap gives it GPU1, the node
        # registers GPU1 and nothing else of that host
        stored = ledgermap.read(self.k8s.api, LEDGER_MAP)
        self.assertEqual((gpu1,), ledgermap.k8s_gpus(stored, self.vm_host))
        self.assertEqual([gpu1], self.registered(self.vm_host))
        # the ledger file: GPU1 moved, GPU0 kept its role
        moved = av_ledger.load(self.ledger_path)
        self.assertEqual(Role.K8S_SHARED, moved.get(self.vm_host, gpu1).role)
        self.assertEqual(Role.NOVA_VF, moved.get(self.vm_host, gpu0).role)
        self.assertEqual(stored.get(self.vm_host, gpu0).role, Role.NOVA_VF)

    def _check_idempotent(self):
        before = self.writes.count
        rc, stdout, _stderr = self._move()
        self.assertEqual(0, rc, stdout)
        self.assertIn('already has role %s' % self.to, stdout)
        self.assertEqual(before, self.writes.count, self.writes.log[before:])

    def _kill_at_every_write(self, expected):
        """The clean move, then one killed at each write, before and
        after it; :returns: the clean move's writes."""
        self._fresh('clean')
        self.assertEqual(0, self._drive())
        total = self.writes.count
        log = self.writes.log[:total]
        for what in expected:
            self.assertTrue(any(w.startswith(what) for w in log),
                            (what, log))
        self.assertEqual('rename move-%s-0000-25-00.0.json.done'
                         % self.host, log[-1])
        reference = self._left()
        self.check_one_cloud()
        self._check_idempotent()
        started = time.monotonic()
        for at in range(1, total + 1):
            for after in (False, True):
                name = '%d-%s' % (at, 'after' if after else 'before')
                self._fresh(name)
                self.writes.count, self.writes.log = 0, []
                self.writes.kill_at, self.writes.after = at, after
                kills = self._drive()
                self.assertEqual(1, kills, name)
                self.assertEqual(reference, self._left(), name)
                self.check_one_cloud()
                self._check_idempotent()
        # (a figure, not an assertion)
        print('%s -> %s: %d writes, each killed before and after: %d '
              'resumed moves in %.1f s' % (self.host_attr, self.to, total,
                                           2 * total,
                                           time.monotonic() - started))
        return log

    def test_killed_at_every_write_then_resumed(self):
        # the Nova files, the ledger ConfigMap, the state file, the
        # ledger, the final rename
        self._kill_at_every_write([
            'write amdgpu-virt-pci.conf', 'POST /v1/namespaces/kube-system/'
            'configmaps', 'write move-', 'write ledger.yaml'])


class InterruptedWithdrawalTest(InterruptedMoveTest):
    """A GPU leaves Kubernetes: the ledger ConfigMap and the node
    registration are the adapter's writes."""

    host_attr, to = 'k8s_host', 'idle'

    def prepare(self):
        self.push_ledger()
        self.assertEqual([test_pool.GPU0, test_pool.GPU1],
                         self.run_agent(self.k8s_host))

    def check_one_cloud(self):
        gpu0, gpu1 = test_pool.GPU0, test_pool.GPU1
        self.assertEqual([gpu0], self.registered(self.k8s_host))
        stored = ledgermap.read(self.k8s.api, LEDGER_MAP)
        self.assertEqual((gpu0,), ledgermap.k8s_gpus(stored, self.k8s_host))
        moved = av_ledger.load(self.ledger_path)
        self.assertEqual(Role.IDLE, moved.get(self.k8s_host, gpu1).role)
        self.assertEqual(Role.K8S_SHARED,
                         moved.get(self.k8s_host, gpu0).role)
        # the node agent does not offer it again
        self.assertEqual([gpu0], self.run_agent(self.k8s_host))

    def test_killed_at_every_write_then_resumed(self):
        self._kill_at_every_write([
            'PUT /v1/namespaces/kube-system/configmaps',
            'PATCH /v1/nodes/', 'write ledger.yaml'])
