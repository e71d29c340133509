"""The safe role-change workflow.

The sides and the host are in-memory stand-ins of the Side and Host
protocols: this module is the pure workflow; the Nova and Kubernetes
adapters that implement the protocols are tested against real servers in
the functional suite.
"""

import json
import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.ledger import GpuAssignment
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.pool import move

ADDR = PciAddress.parse('0000:05:00.0')
OLD = GpuAssignment('gim-0', ADDR, Role.NOVA_VF, 'MI300X', vf_count=8)
NEW = GpuAssignment('gim-0', ADDR, Role.K8S_SHARED, 'MI300X',
                    compute_mode='SPX', memory_mode='NPS1')


class FakeSide:

    def __init__(self, name, offered=(), users=None):
        self.name = name
        self.offered = set(offered)
        self.users = dict(users or {})
        self.confirm = True
        self.calls = []

    def consumers(self, host, address):
        return tuple(self.users.get((host, address), ()))

    def withdraw(self, host, address):
        self.calls.append(('withdraw', host, address))
        self.offered.discard((host, address))

    def is_withdrawn(self, host, address):
        return self.confirm and (host, address) not in self.offered

    def offer(self, assignment):
        self.calls.append(('offer', assignment.host, assignment.address))
        self.offered.add(assignment.key)

    def is_offered(self, host, address):
        return self.confirm and (host, address) in self.offered


class FakeHost:

    def __init__(self):
        self.state = OLD

    def instructions(self, old, new):
        return ['set the driver of %s to amdgpu' % old.address]

    def matches(self, assignment):
        return self.state == assignment


class TestMove(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                                 'move.json')
        self.nova = FakeSide('nova', offered=[OLD.key],
                             users={OLD.key: ['vm-1']})
        self.k8s = FakeSide('k8s')
        self.host = FakeHost()
        self.clock = iter('t%d' % i for i in range(100))

    def _move(self, old=OLD, new=NEW):
        return move.Move(self.path, old, new,
                         {'nova': self.nova, 'k8s': self.k8s}, self.host,
                         clock=lambda: next(self.clock))

    def test_refused_while_a_vm_holds_it_and_nothing_changes(self):
        result = self._move().run()
        self.assertEqual(move.Status.REFUSED, result.status)
        self.assertEqual(move.Step.CHECK_UNUSED, result.step)
        self.assertIn('vm-1', result.message)
        self.assertEqual([], self.nova.calls)
        self.assertIn(OLD.key, self.nova.offered)
        self.assertFalse(os.path.exists(self.path))

    def test_full_move_with_waits_and_resume(self):
        self.nova.users = {}
        self.nova.confirm = False
        result = self._move().run()
        self.assertEqual(move.Status.WAITING, result.status)
        self.assertEqual(move.Step.CONFIRM_WITHDRAWN, result.step)
        self.assertEqual([('withdraw', 'gim-0', ADDR)], self.nova.calls)

        # Interrupted: a new process picks the move up from the file.
        self.nova.confirm = True
        result = self._move().run()
        self.assertEqual(move.Status.WAITING, result.status)
        self.assertEqual(move.Step.HOST_CHANGE, result.step)
        self.assertIn('set the driver of 0000:05:00.0 to amdgpu',
                      result.message)
        self.assertIn('reboot gim-0', result.message)
        self.assertEqual([], self.k8s.calls)

        self.host.state = NEW
        result = self._move().run()
        self.assertEqual(move.Status.DONE, result.status)
        self.assertIsNone(result.step)
        self.assertEqual([('offer', 'gim-0', ADDR)], self.k8s.calls)
        self.assertEqual(list(move.STEPS), [r.step for r in result.history])
        # withdraw ran once, although run() was called three times
        self.assertEqual(1, len(self.nova.calls))

        with open(self.path) as handle:
            data = json.load(handle)
        self.assertEqual(['check-unused', 'stop-offering',
                          'confirm-withdrawn', 'host-change', 'offer',
                          'confirm-offered'],
                         [r['step'] for r in data['history']])
        # Running a finished move again changes nothing.
        again = self._move().run()
        self.assertEqual(move.Status.DONE, again.status)
        self.assertEqual(1, len(self.k8s.calls))

    def test_vm_arriving_before_confirmation_stops_the_move(self):
        self.nova.users = {}
        self.nova.confirm = False
        self._move().run()
        self.nova.users = {OLD.key: ['vm-late']}
        self.nova.confirm = True
        result = self._move().run()
        self.assertEqual(move.Status.REFUSED, result.status)
        self.assertEqual(move.Step.CONFIRM_WITHDRAWN, result.step)
        self.assertIn('vm-late', result.message)

    def test_from_idle_and_to_idle(self):
        idle = GpuAssignment('gim-0', ADDR, Role.IDLE, 'MI300X')
        self.host.state = NEW
        result = self._move(idle, NEW).run()
        self.assertEqual(move.Status.DONE, result.status)
        self.assertEqual(['not-applicable'] * 3 + ['ok'] * 3,
                         [r.outcome for r in result.history])
        os.unlink(self.path)
        self.host.state = idle
        self.nova.users = {}
        result = self._move(OLD, idle).run()
        self.assertEqual(move.Status.DONE, result.status)
        self.assertEqual(['ok'] * 4 + ['not-applicable'] * 2,
                         [r.outcome for r in result.history])

    def test_state_file_of_another_move_is_refused(self):
        self.nova.users = {}
        self.nova.confirm = False
        self._move().run()
        other = GpuAssignment('gim-0', ADDR, Role.K8S_DEDICATED, 'MI300X')
        err = self.assertRaises(exception.UnsafeRoleChange, self._move,
                                OLD, other)
        self.assertIn('records another move', str(err))
        self.assertIn(self.path, str(err))

    def test_tampered_state_file_cannot_skip_steps(self):
        self.nova.users = {}
        self.nova.confirm = False
        self._move().run()
        with open(self.path) as handle:
            data = json.load(handle)
        data['history'].append({'step': 'offer', 'outcome': 'ok',
                                'at': 'x'})
        with open(self.path, 'w') as handle:
            json.dump(data, handle)
        err = self.assertRaises(exception.UnsafeRoleChange, self._move)
        self.assertIn('out of order', str(err))

    def test_garbage_state_file(self):
        with open(self.path, 'w') as handle:
            handle.write('{not json')
        err = self.assertRaises(exception.UnsafeRoleChange, self._move)
        self.assertIn('unreadable', str(err))

    def test_bad_requests(self):
        other = GpuAssignment('gim-1', ADDR, Role.K8S_SHARED, 'MI300X')
        self.assertRaises(exception.UnsafeRoleChange, self._move, OLD, other)
        self.assertRaises(exception.UnsafeRoleChange, self._move, OLD, OLD)
        err = self.assertRaises(exception.UnsafeRoleChange, move.Move,
                                self.path, OLD, NEW, {'nova': self.nova},
                                self.host)
        self.assertIn('no k8s adapter', str(err))

    def test_needs_reboot(self):
        dedicated = GpuAssignment('gim-0', ADDR, Role.K8S_DEDICATED,
                                  'MI300X')
        one_vf = GpuAssignment('gim-0', ADDR, Role.NOVA_VF, 'MI300X',
                               vf_count=1)
        nps4 = GpuAssignment('gim-0', ADDR, Role.K8S_SHARED, 'MI300X',
                             compute_mode='CPX', memory_mode='NPS4')
        self.assertTrue(move.needs_reboot(OLD, NEW))
        self.assertTrue(move.needs_reboot(OLD, one_vf))
        self.assertFalse(move.needs_reboot(NEW, dedicated))
        self.assertTrue(move.needs_reboot(NEW, nps4))


class _Flaky:
    """Wraps a side: its ``fail_at``-th call (counted over every method)
    raises PlacementUnreachable, as a side whose API went away would."""

    def __init__(self, side, fail_at):
        self._side = side
        self.name = side.name
        self.fail_at = fail_at
        self.count = 0

    def __getattr__(self, method):
        real = getattr(self._side, method)

        def call(*args):
            self.count += 1
            if self.count == self.fail_at:
                raise exception.PlacementUnreachable(
                    request='GET /resource_providers', reason='refused')
            return real(*args)
        return call


class TestInterruptedAtEveryStep(testtools.TestCase):
    """A side unreachable at each of its calls, then the move run again:
    the same end state and history as an uninterrupted move, and never a
    step recorded that did not happen."""

    def _run_to_end(self, path, nova, k8s, host, fail_at=0):
        flaky = _Flaky(nova, fail_at), _Flaky(k8s, fail_at + 1000)
        outcomes = []
        for _round in range(10):
            work = move.Move(path, OLD, NEW,
                             {'nova': flaky[0], 'k8s': flaky[1]}, host,
                             clock=lambda: 't')
            try:
                result = work.run()
            except exception.PlacementUnreachable:
                outcomes.append('unreachable')
                continue
            outcomes.append(result.status.value)
            if result.status is move.Status.WAITING and \
                    result.step is move.Step.HOST_CHANGE:
                host.state = NEW
            if result.status is move.Status.DONE:
                return result, outcomes, flaky[0].count
        raise AssertionError('the move never finished: %s' % outcomes)

    def test_every_interruption_converges(self):
        def fresh():
            root = self.useFixture(fixtures.TempDir()).path
            return (os.path.join(root, 'move.json'),
                    FakeSide('nova', offered=[OLD.key]), FakeSide('k8s'),
                    FakeHost())

        path, nova, k8s, host = fresh()
        clean, _outcomes, nova_calls = self._run_to_end(path, nova, k8s,
                                                        host)
        self.assertGreater(nova_calls, 3)
        expected = ([r.step for r in clean.history], nova.offered,
                    k8s.offered, nova.calls, k8s.calls)
        for fail_at in range(1, nova_calls + 1):
            path, nova, k8s, host = fresh()
            result, outcomes, _count = self._run_to_end(path, nova, k8s,
                                                        host, fail_at)
            self.assertIn('unreachable', outcomes, fail_at)
            self.assertEqual(expected, (
                [r.step for r in result.history], nova.offered, k8s.offered,
                nova.calls, k8s.calls), (fail_at, outcomes))
            self.assertTrue(all(r.outcome in ('ok', 'not-applicable')
                                for r in result.history), fail_at)
