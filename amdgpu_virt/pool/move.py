"""Safe role change of one GPU: a resumable, recorded workflow.

Moving a GPU from one role to another (say ``nova-vf`` to ``k8s-shared``)
is dangerous: unbinding a VF under a running VM can hang the host, and a GPU
offered to both sides can be double booked. The workflow therefore runs
fixed steps in order and records each one in a state file:

1. ``check-unused``: the current side has no consumer on the GPU
   (Placement allocations, pods naming it in their annotations); if it has,
   the move is refused and nothing changes.
2. ``stop-offering``: the current side stops offering the GPU
   (device_spec removed, registration withdrawn).
3. ``confirm-withdrawn``: wait until the side confirms (provider gone, no
   registration) and check again that nobody uses it.
4. ``host-change``: the host is changed (driver, VF count, partition or
   memory mode; a reboot when GIM or NPS changes). The workflow prints what
   to do and waits until the host's inventory shows the new state.
5. ``offer``: the new side starts offering the GPU.
6. ``confirm-offered``: wait until the new side confirms.

Steps that do not apply (a GPU coming from or going to ``idle``) are
recorded as skipped by rule, never by request: no step can be skipped on
demand. An interrupted move resumes at the first step not done. The sides
and the host are reached through small protocols implemented by the Nova
and Kubernetes adapters, so this module stays pure.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import yamlutil
from amdgpu_virt.ledger import GpuAssignment
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role

STATE_VERSION = 1


class Step(str, enum.Enum):
    CHECK_UNUSED = 'check-unused'
    STOP_OFFERING = 'stop-offering'
    CONFIRM_WITHDRAWN = 'confirm-withdrawn'
    HOST_CHANGE = 'host-change'
    OFFER = 'offer'
    CONFIRM_OFFERED = 'confirm-offered'


STEPS = tuple(Step)


class Status(str, enum.Enum):
    DONE = 'done'
    WAITING = 'waiting'
    REFUSED = 'refused'


class Side(Protocol):
    """One cloud's view of a GPU, as the move needs it."""

    name: str

    def consumers(self, host: str, address: PciAddress) -> tuple[str, ...]:
        """Who uses the GPU now (empty when nobody does)."""

    def withdraw(self, host: str, address: PciAddress) -> None:
        """Stop offering the GPU (idempotent)."""

    def is_withdrawn(self, host: str, address: PciAddress) -> bool:
        """The side confirms it no longer offers the GPU."""

    def offer(self, assignment: GpuAssignment) -> None:
        """Start offering the GPU in its new role (idempotent)."""

    def is_offered(self, host: str, address: PciAddress) -> bool:
        """The side confirms it offers the GPU."""


class Host(Protocol):
    """The host whose GPU changes."""

    def instructions(self, old: GpuAssignment,
                     new: GpuAssignment) -> list[str]:
        """Ordered, human-readable steps to change the host."""

    def matches(self, assignment: GpuAssignment) -> bool:
        """The host's inventory shows the GPU as ``assignment`` needs."""


@dataclasses.dataclass(frozen=True)
class StepRecord:
    step: Step
    outcome: str
    at: str
    note: str = ''


@dataclasses.dataclass(frozen=True)
class MoveResult:
    status: Status
    step: Step | None
    message: str
    history: tuple[StepRecord, ...]


def needs_reboot(old: GpuAssignment, new: GpuAssignment) -> bool:
    """True when the change touches GIM (VF layout) or the memory mode."""
    gim = {Role.NOVA_VF}
    if (old.role in gim) != (new.role in gim):
        return True
    if old.role in gim and old.vf_count != new.vf_count:
        return True
    return bool(old.memory_mode and new.memory_mode
                and old.memory_mode != new.memory_mode)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')


class Move:
    """The move of one GPU from ``old`` to ``new``, recorded in ``path``.

    :param sides: adapters by side name (``'nova'``, ``'k8s'``).
    :param clock: returns the time stamp recorded with each step.
    """

    def __init__(self, path: str, old: GpuAssignment, new: GpuAssignment,
                 sides: Mapping[str, Side], host: Host,
                 clock: Callable[[], str] = _now) -> None:
        if old.key != new.key:
            raise exception.UnsafeRoleChange(
                gpu='%s:%s' % (old.host, old.address),
                reason='the new assignment is for %s:%s'
                % (new.host, new.address))
        if old.role is new.role and old == new:
            raise exception.UnsafeRoleChange(
                gpu='%s:%s' % (old.host, old.address),
                reason='it already has role %s' % old.role.value)
        for role in (old.role, new.role):
            if role.side and role.side not in sides:
                raise exception.UnsafeRoleChange(
                    gpu='%s:%s' % (old.host, old.address),
                    reason='no %s adapter configured' % role.side)
        self.path = path
        self.old = old
        self.new = new
        self.sides = sides
        self.host = host
        self.clock = clock
        self.history: list[StepRecord] = self._load()

    # -- state file ---------------------------------------------------------

    @property
    def gpu(self) -> str:
        return '%s:%s' % (self.old.host, self.old.address)

    def _identity(self) -> dict[str, Any]:
        return {'from': self.old.to_dict(), 'to': self.new.to_dict(),
                'host': self.old.host}

    def _load(self) -> list[StepRecord]:
        if not os.path.exists(self.path):
            return []
        try:
            data = yamlutil.load_json(
                fileutil.read_text(self.path, 'move state file') or '',
                'move state file %s' % self.path)
            if data.get('version') != STATE_VERSION:
                raise ValueError('version %r' % data.get('version'))
            if data.get('move') != self._identity():
                raise exception.UnsafeRoleChange(
                    gpu=self.gpu, reason='state file %s records another move '
                    '(%s); finish it or remove the file' % (
                        self.path, json.dumps(data.get('move'),
                                              sort_keys=True)))
            history = [StepRecord(Step(r['step']), r['outcome'], r['at'],
                                  r.get('note', ''))
                       for r in data.get('history', [])]
        except (exception.FileInputError, ValueError, KeyError, TypeError,
                AttributeError) as err:
            raise exception.UnsafeRoleChange(
                gpu=self.gpu, reason='state file %s is unreadable: %s'
                % (self.path, err)) from None
        except exception.UnsafeRoleChange:
            raise
        except exception.AmdgpuVirtError as err:   # not JSON, too deep
            raise exception.UnsafeRoleChange(
                gpu=self.gpu, reason='state file %s is unreadable: %s'
                % (self.path, err)) from None
        expected = [r.step for r in history]
        if expected != list(STEPS[:len(expected)]):
            raise exception.UnsafeRoleChange(
                gpu=self.gpu, reason='state file %s records steps out of '
                'order: %s' % (self.path, ', '.join(s.value
                                                    for s in expected)))
        return history

    def _save(self) -> None:
        data = {'version': STATE_VERSION, 'move': self._identity(),
                'history': [dict(step=r.step.value, outcome=r.outcome,
                                 at=r.at, note=r.note)
                            for r in self.history]}
        fileutil.atomic_write(self.path, json.dumps(data, indent=2,
                                                    sort_keys=True) + '\n')

    def _record(self, step: Step, outcome: str, note: str = '') -> None:
        self.history.append(StepRecord(step, outcome, self.clock(), note))
        self._save()

    # -- the steps ----------------------------------------------------------

    @property
    def done(self) -> bool:
        return len(self.history) == len(STEPS)

    def next_step(self) -> Step | None:
        return None if self.done else STEPS[len(self.history)]

    def _result(self, status: Status, message: str) -> MoveResult:
        return MoveResult(status, self.next_step(), message,
                          tuple(self.history))

    def run(self) -> MoveResult:
        """Run the steps that can run now, in order; safe to call again.

        :returns: DONE when all steps are done; WAITING when a side or the
            host has to confirm something first (call again later);
            REFUSED when the GPU is in use (nothing was changed).
        """
        old_side = self.sides.get(self.old.role.side or '')
        new_side = self.sides.get(self.new.role.side or '')
        key = (self.old.host, self.old.address)
        while not self.done:
            step = self.next_step()
            if step in (Step.CHECK_UNUSED, Step.CONFIRM_WITHDRAWN):
                if old_side is None:
                    self._record(step, 'not-applicable',
                                 'the GPU was idle')
                    continue
                users = old_side.consumers(*key)
                if users:
                    return self._result(
                        Status.REFUSED, '%s still has consumers on %s: %s; '
                        'drain them first' % (old_side.name, self.gpu,
                                              ', '.join(users)))
                if step is Step.CONFIRM_WITHDRAWN and \
                        not old_side.is_withdrawn(*key):
                    return self._result(
                        Status.WAITING, 'waiting for %s to stop offering %s'
                        % (old_side.name, self.gpu))
                self._record(step, 'ok')
            elif step is Step.STOP_OFFERING:
                if old_side is None:
                    self._record(step, 'not-applicable', 'the GPU was idle')
                    continue
                old_side.withdraw(*key)
                self._record(step, 'ok')
            elif step is Step.HOST_CHANGE:
                if not self.host.matches(self.new):
                    steps = self.host.instructions(self.old, self.new)
                    if needs_reboot(self.old, self.new):
                        steps.append('reboot %s' % self.old.host)
                    return self._result(
                        Status.WAITING, 'change host %s, then run the move '
                        'again:\n%s' % (self.old.host, '\n'.join(
                            '  %d. %s' % (i, s)
                            for i, s in enumerate(steps, 1))))
                self._record(step, 'ok')
            elif step is Step.OFFER:
                if new_side is None:
                    self._record(step, 'not-applicable', 'the GPU goes idle')
                    continue
                new_side.offer(self.new)
                self._record(step, 'ok')
            elif step is Step.CONFIRM_OFFERED:
                if new_side is None:
                    self._record(step, 'not-applicable', 'the GPU goes idle')
                    continue
                if not new_side.is_offered(*key):
                    return self._result(
                        Status.WAITING, 'waiting for %s to offer %s'
                        % (new_side.name, self.gpu))
                self._record(step, 'ok')
        return self._result(Status.DONE, '%s is now %s' % (
            self.gpu, self.new.role.value))
