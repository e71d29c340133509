"""``apply`` killed at every step, then resumed or rolled back.

Whatever step an apply was killed at (each file write, including one
killed half-way that leaves its temporary file, each removal, each
record write), running apply again with the new ledger, or with the
older one (a rollback), must leave exactly what that ledger renders:
the same tree as an apply into an empty directory, nothing stale, and a
further run writes nothing.
"""

from __future__ import annotations

import os
from typing import Any

import fixtures
import testtools

from amdgpu_virt import fileutil
from amdgpu_virt.pool import apply

OLD = [apply.OutputFile(*item) for item in (
    ('h1/nova/nova.conf.d/amdgpu-virt-pci.conf', '[pci]\nold = 1\n'),
    ('h1/host/etc/modprobe.d/gim.conf', 'options gim vf_num=4\n'),
    ('h2/k8s/roles.yaml', 'gpus: [a]\n'),
    ('h2/k8s/amdgpu-virt-agent.conf', '[kubernetes]\n'),
    ('ledger-configmap.yaml', 'kind: ConfigMap\nold: 1\n'))]
# h1 moves from Nova to Kubernetes, h2 keeps a file and changes one, h3
# is new
NEW = [apply.OutputFile(*item) for item in (
    ('h1/k8s/roles.yaml', 'gpus: [b]\n'),
    ('h1/k8s/amdgpu-virt-agent.conf', '[kubernetes]\n'),
    ('h2/k8s/roles.yaml', 'gpus: [a, c]\n'),
    ('h2/k8s/amdgpu-virt-agent.conf', '[kubernetes]\n'),
    ('h3/nova/nova.conf.d/amdgpu-virt-pci.conf', '[pci]\nnew = 1\n'),
    ('ledger-configmap.yaml', 'kind: ConfigMap\nnew: 1\n'))]


#: the process id of a writer that is gone (beyond Linux's largest pid)
DEAD = (1 << 22) + 1


class _Killed(BaseException):
    """The process died here (not an error anyone catches)."""


def tree(root: str) -> dict[str, Any]:
    """Every file and directory under ``root`` with its content."""
    result: dict[str, Any] = {}
    for directory, _dirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        if rel != '.':
            result[rel + '/'] = None
        for name in files:
            path = os.path.join(directory, name)
            with open(path) as stream:
                result[os.path.relpath(path, root)] = stream.read()
    return result


class InterruptedApplyTest(testtools.TestCase):

    def _dir(self) -> str:
        return self.useFixture(fixtures.TempDir()).path

    def _expected(self, files: list[apply.OutputFile]) -> dict[str, Any]:
        out = self._dir()
        apply.apply_files(out, files)
        return tree(out)

    def _steps(self) -> int:
        """How many writes and removals OLD -> NEW takes."""
        out = self._dir()
        apply.apply_files(out, OLD)
        counting = _KilledAt(10 ** 6)
        with counting:
            apply.apply_files(out, NEW)
        return counting.done

    def test_every_interruption_converges(self) -> None:
        expected_old = self._expected(OLD)
        expected_new = self._expected(NEW)
        steps = self._steps()
        self.assertGreater(steps, 8)
        for kill_at in range(steps):
            for then, expected in ((NEW, expected_new),
                                   (OLD, expected_old)):
                out = self._dir()
                apply.apply_files(out, OLD)
                with _KilledAt(kill_at):
                    self.assertRaises(_Killed, apply.apply_files, out, NEW)
                apply.apply_files(out, then)
                self.assertEqual(expected, tree(out),
                                 'killed at step %d, then %s' % (
                                     kill_at, 'resumed' if then is NEW
                                     else 'rolled back'))
                again = apply.apply_files(out, then)
                self.assertFalse(again.changed, kill_at)

    def test_interrupted_dry_run_state_is_untouched(self) -> None:
        out = self._dir()
        apply.apply_files(out, OLD)
        before = tree(out)
        apply.apply_files(out, NEW, dry_run=True)
        self.assertEqual(before, tree(out))


class _KilledAt:
    """Within the block, the process dies at write-or-removal number
    ``steps`` (counted from 0; a write dies half-way, leaving its
    temporary file); ``done`` counts those that went through."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.done = 0
        self.patches: list[fixtures.MonkeyPatch] = []

    def _die_here(self) -> bool:
        if self.done == self.steps:
            return True
        self.done += 1
        return False

    def __enter__(self) -> _KilledAt:
        real_write = fileutil.atomic_write
        real_remove = apply._remove

        def write(path: str, content: str, mode: int = 0o644) -> None:
            if self._die_here():
                directory = os.path.dirname(path)
                os.makedirs(directory, exist_ok=True)
                with open(os.path.join(directory, fileutil.temp_prefix(
                        DEAD) + 'x1y2z3ab'), 'w') as stream:
                    stream.write(content[:3])
                raise _Killed()
            real_write(path, content, mode)

        def remove(path: str) -> None:
            if self._die_here():
                raise _Killed()
            real_remove(path)

        self.patches = [
            fixtures.MonkeyPatch('amdgpu_virt.fileutil.atomic_write', write),
            fixtures.MonkeyPatch('amdgpu_virt.pool.apply._remove', remove)]
        for patch in self.patches:
            patch.setUp()
        return self

    def __exit__(self, *exc: object) -> None:
        for patch in reversed(self.patches):
            patch.cleanUp()
