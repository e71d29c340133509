"""``amdgpu-virt k8s install-hook``: exit statuses and messages, in-process
and through the installed console script (two at once)."""

from __future__ import annotations

import os
import subprocess
import sys



from tests.unit.cmd import test_inventory_cli
from tests.unit.k8s.node import test_hookinstall


class InstallHookCliTest(test_inventory_cli.CliTestCase):

    def setUp(self) -> None:
        super().setUp()
        self.source = os.path.join(self.tmp, 'libamvgpu.so')
        with open(self.source, 'wb') as stream:
            stream.write(test_hookinstall.library())
        self.host = os.path.join(self.tmp, 'vgpu')
        os.mkdir(self.host)
        self.target = os.path.join(self.host, 'libamvgpu.so')
        self.message = os.path.join(self.tmp, 'termination-log')

    def install(self, *extra: str, source: str | None = None,
                target: str | None = None) -> tuple[int, str, str]:
        return self.run_cli('k8s', 'install-hook', '--from',
                            source or self.source, '--to',
                            target or self.target, *extra)

    def message_text(self) -> str:
        with open(self.message) as stream:
            return stream.read()

    def text_file(self) -> str:
        path = os.path.join(self.tmp, 'notes.txt')
        with open(path, 'w') as stream:
            stream.write('not a library\n')
        return path

    def test_installs_then_is_up_to_date(self) -> None:
        status, out, _err = self.install('--message-file', self.message)
        self.assertEqual(0, status)
        self.assertIn('installed %s from %s' % (self.target, self.source),
                      out)
        self.assertIn('sha256 ', self.message_text())
        status, out, _err = self.install()
        self.assertEqual((0, True), (status, 'is up to date' in out))

    def test_exit_statuses_name_the_file(self) -> None:
        cases = [
            (66, 'no such file', {'source': os.path.join(self.tmp, 'no.so')}),
            (65, 'no ELF magic', {'source': self.text_file()}),
            (73, 'does not exist', {'target': os.path.join(
                self.tmp, 'missing', 'libamvgpu.so')}),
        ]
        for status, reason, paths in cases:
            code, _out, _err = self.install('--message-file', self.message,
                                            **paths)
            self.assertEqual(status, code, paths)
            culprit = paths.get('source') or paths.get('target')
            self.assertIn(culprit, self.message_text())
            self.assertIn(reason, self.message_text())
            self.assertIn(reason, self.logger.output)
        self.assertFalse(os.path.exists(self.target))

    def test_best_effort_reports_and_exits_0(self) -> None:
        status, _out, err = self.install('--best-effort', '--message-file',
                                         self.message,
                                         source=self.text_file())
        self.assertEqual(0, status)
        self.assertIn('no ELF magic', err)
        self.assertIn('the node offers whole GPUs only', err)
        self.assertEqual(err.strip(), 'warning: %s' % self.message_text())
        # a good library already there stays, and the message says so
        self.assertEqual(0, self.install()[0])
        status, _out, err = self.install('--best-effort',
                                         source=self.text_file())
        self.assertEqual(0, status)
        self.assertIn('the library already at %s is kept' % self.target,
                      err)
        with open(self.target, 'rb') as stream:
            self.assertEqual(test_hookinstall.library(), stream.read())

    def test_lock_timeout_is_checked(self) -> None:
        status, _out, _err = self.install('--lock-timeout', '-1')
        self.assertEqual(64, status)

    def test_two_console_scripts_at_once(self) -> None:
        script = os.path.join(os.path.dirname(sys.executable), 'amdgpu-virt')
        if not os.path.exists(script):
            self.skipTest('amdgpu-virt is not installed next to %s'
                          % sys.executable)
        other = os.path.join(self.tmp, 'other.so')
        with open(other, 'wb') as stream:
            stream.write(test_hookinstall.library(b'\1' * 8192))
        runs = [subprocess.Popen(
            [script, 'k8s', 'install-hook', '--from', source, '--to',
             self.target], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True)
            for source in (self.source, other, self.source, other)]
        outcomes = [run.communicate(timeout=120) for run in runs]
        self.assertEqual([0] * 4, [run.returncode for run in runs],
                         outcomes)
        with open(self.target, 'rb') as stream:
            self.assertIn(stream.read(), (
                test_hookinstall.library(),
                test_hookinstall.library(b'\1' * 8192)))
        self.assertEqual(['libamvgpu.so'], os.listdir(self.host))
