"""``amdgpu-virt apply`` killed with SIGKILL while it writes.

The fault seen: each killed run left a temporary file of its atomic
writes in the output tree (``h115/k8s/.amdgpu-virt-siwy9jmk``), and only
a run that got to its very end removed such files, so a run killed in
its turn left them all. Here the real command runs as a process of its
own on a ledger of 120 hosts and is killed in the middle of its writes;
the next run removes what the killed one left before it writes anything,
a dry run lists it, and a temporary file of a writer still running is
never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import fixtures
import testtools
import yaml

from amdgpu_virt import fileutil
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import Role

HOSTS = 120


def _spec(host: int, model: str) -> simulate.HostSpec:
    return simulate.HostSpec(hostname='h%03d' % host, model=model, gpus=8,
                             mode='spx', nps='nps1')


def _fleet(path: str, model: str) -> None:
    """A fleet file of the hosts (apply renders each Kubernetes host's
    ResourceSlices from its inventory)."""
    with open(path, 'w', encoding='utf-8') as stream:
        yaml.safe_dump({'hosts': [
            {'hostname': 'h%03d' % host, 'model': model, 'gpus': 8,
             'mode': 'spx', 'nps': 'nps1'} for host in range(HOSTS)]},
            stream)


def _ledger(path: str, model: str) -> None:
    av_ledger.save(av_ledger.build([
        av_ledger.GpuAssignment('h%03d' % host, gpu.address,
                                Role.K8S_SHARED, model)
        for host in range(HOSTS)
        for gpu in simulate.design_host(_spec(host, model)).gpus]), path)


class ApplyKilledTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.out = os.path.join(self.tmp, 'out')
        self.conf = os.path.join(self.tmp, 'amdgpu-virt.conf')
        open(self.conf, 'w').close()
        self.ledgers = []
        self.fleets = {}
        for model in ('MI300X', 'MI308X'):
            path = os.path.join(self.tmp, '%s.yaml' % model)
            _ledger(path, model)
            self.ledgers.append(path)
            self.fleets[path] = os.path.join(self.tmp, '%s-fleet.yaml'
                                             % model)
            _fleet(self.fleets[path], model)

    def _command(self, ledger: str, *extra: str,
                 out: str | None = None) -> list[str]:
        return [sys.executable, '-c', 'from amdgpu_virt.cmd.main import '
                'main; raise SystemExit(main())', '--config-file', self.conf,
                'apply', '--ledger', ledger, '--fleet', self.fleets[ledger],
                '--output-dir', out or self.out, '--progress-every', '0',
                *extra]

    def _files(self) -> list[str]:
        return [os.path.join(d, n) for d, _s, names in os.walk(self.out)
                for n in names]

    def _temps(self) -> set[str]:
        return {p for p in self._files() if os.path.basename(p).startswith(
            fileutil.TEMP_PREFIX) and not p.endswith('apply.json')}

    def _kill_while_writing(self, ledger: str, host: int) -> None:
        """Run apply; SIGKILL it as soon as it has written the slices of
        host number ``host`` (it is then writing the next hosts')."""
        mark = os.path.join(self.out, 'h%03d' % host, 'k8s',
                            'dra-resourceslices.yaml')

        def written() -> int:
            try:
                return os.stat(mark).st_mtime_ns
            except FileNotFoundError:
                return 0

        # apply's writes are idempotent: a file whose bytes would not
        # change is not written again, so the mark is removed first (an
        # earlier run may have written the same host's slices)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(mark)
        before = written()
        process = subprocess.Popen(self._command(ledger),
                                   stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        self.addCleanup(process.wait)
        deadline = time.monotonic() + 120
        while written() == before and process.poll() is None:
            self.assertLess(time.monotonic(), deadline, 'apply stalled')
            time.sleep(0.001)
        process.send_signal(signal.SIGKILL)
        process.wait()
        self.assertEqual(-signal.SIGKILL, process.returncode,
                         'apply ended before it was killed')

    def _run(self, ledger: str, *extra: str) -> str:
        done = subprocess.run(self._command(ledger, *extra),
                              capture_output=True, text=True, timeout=300,
                              check=True)
        return done.stdout

    def test_the_next_run_removes_what_a_killed_one_left(self) -> None:
        # killed while writing, as often as it takes to leave a temporary
        # file: a write's window is short beside the rendering, so on a
        # busy machine most kills land between writes. Each try writes a
        # tree of its own (every host's files new, none skipped as
        # unchanged), and the tree a kill left files in is the one used on
        for attempt in range(30):
            self.out = os.path.join(self.tmp, 'out%02d' % attempt)
            self._kill_while_writing(self.ledgers[attempt % 2], 20)
            if self._temps():
                break
        left = self._temps()
        self.assertTrue(left, 'no kill landed in a write')
        # a dry run says what a run would remove, and removes nothing
        output = self._run(self.ledgers[0], '--dry-run')
        for path in left:
            self.assertIn('would remove %s (left by an interrupted run)'
                          % path, output)
        self.assertEqual(left, self._temps())
        # a run killed in its turn has removed them first
        self._kill_while_writing(self.ledgers[1], 30)
        self.assertEqual(set(), left & self._temps())
        # and a whole run leaves the tree as an uninterrupted one
        output = self._run(self.ledgers[1])
        self.assertEqual(set(), self._temps())
        fresh = os.path.join(self.tmp, 'fresh')
        subprocess.run(self._command(self.ledgers[1], out=fresh),
                       capture_output=True, check=True, timeout=300)
        self.assertEqual(
            sorted(os.path.relpath(p, fresh) for d, _s, names in os.walk(
                fresh) for p in (os.path.join(d, n) for n in names)),
            sorted(os.path.relpath(p, self.out) for p in self._files()))
        self.assertIn('%d host(s)' % HOSTS, output)

    def test_a_writer_still_running_keeps_its_file(self) -> None:
        # a temporary file named for a live process of this host: not
        # stale, whatever its age; once the process is gone, it is
        sleeper = subprocess.Popen([sys.executable, '-c',
                                    'import time; time.sleep(60)'])
        self.addCleanup(sleeper.wait)
        self.addCleanup(sleeper.kill)
        self._run(self.ledgers[0])
        name = fileutil.temp_prefix(sleeper.pid) + 'abcd1234'
        path = os.path.join(self.out, 'h001', 'k8s', name)
        open(path, 'w').close()
        os.utime(path, (0, 0))
        self._run(self.ledgers[1])
        self.assertTrue(os.path.exists(path))
        sleeper.kill()
        sleeper.wait()
        output = self._run(self.ledgers[0])
        self.assertFalse(os.path.exists(path))
        self.assertIn('removed %s (left by an interrupted run)' % path,
                      output)
