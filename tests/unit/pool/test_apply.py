"""Per-host rendering and idempotent writes of ``amdgpu-virt apply``."""

import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt import ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.pool import apply

A0 = PciAddress.parse('0000:05:00.0')
A1 = PciAddress.parse('0000:25:00.0')
GIM = simulate.design_host(simulate.HostSpec('gim', gpus=2, mode='gim-cpx'))


class FakeNova:
    """Stands in for the Nova renderers (tested in tests/unit/nova)."""

    def __init__(self):
        self.calls = []

    def compute_snippet(self, inventory, ledger, host):
        self.calls.append(host)
        return '[pci]\n# %s %s\n' % (host, ','.join(
            str(a.address) for a in ledger.for_host(host)
            if a.role.side == 'nova'))

    def host_files(self, inventory, ledger, host):
        return (apply.HostFile('/etc/gim_config', 'vf_num=8\n'),
                apply.HostFile('/etc/x.sh', '#!/bin/sh\n', 0o755))


def _ledger(*items):
    return ledger.build(items)


VF0 = ledger.GpuAssignment('gim', A0, Role.NOVA_VF, 'MI300X', vf_count=8)
VF1 = ledger.GpuAssignment('gim', A1, Role.NOVA_VF, 'MI300X', vf_count=8)
POD = ledger.GpuAssignment('bm', A0, Role.K8S_SHARED, 'MI300X')
IDLE = ledger.GpuAssignment('spare', A0, Role.IDLE, 'MI300X')


class TestRenderHost(testtools.TestCase):

    def test_nova_host(self):
        files = apply.render_host('gim', _ledger(VF0, VF1), GIM, FakeNova())
        self.assertEqual([
            'gim/host/etc/gim_config', 'gim/host/etc/x.sh',
            'gim/nova/nova.conf.d/amdgpu-virt-pci.conf'],
            [f.relpath for f in files])
        self.assertEqual(0o755, files[1].mode)

    def test_k8s_host_needs_no_file(self):
        # the chart's node pods read the ledger ConfigMap and their node's
        # name from the downward API: nothing per host to install
        self.assertEqual((), apply.render_host('bm', _ledger(VF0, POD),
                                               None, None))

    def test_k8s_host_dra_review_file(self):
        files = apply.render_host('bm', _ledger(VF0, POD), GIM, None,
                                  dra=lambda inv, led, host: 'slices\n')
        self.assertEqual(['bm/' + apply.K8S_DRA_SLICES],
                         [f.relpath for f in files])

    def test_idle_host_has_nothing(self):
        self.assertEqual((), apply.render_host('spare', _ledger(IDLE), None,
                                               None))

    def test_nova_host_without_inventory_is_named(self):
        err = self.assertRaises(exception.PlanError, apply.render_host,
                                'gim', _ledger(VF0), None, FakeNova())
        self.assertIn('host gim', str(err))
        self.assertIn('no inventory', str(err))

    def test_render_all_reports_progress(self):
        seen = []
        files = apply.render_all(_ledger(VF0, POD, IDLE),
                                 ['bm', 'gim', 'spare'], {'gim': GIM},
                                 FakeNova(), 'cm-text\n', seen.append)
        self.assertEqual([1, 2, 3], seen)
        self.assertIn(apply.CONFIGMAP_FILE, [f.relpath for f in files])
        self.assertTrue(apply.has_k8s_roles(_ledger(POD)))
        self.assertFalse(apply.has_k8s_roles(_ledger(VF0, IDLE)))


class TestApplyFiles(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.out = self.useFixture(fixtures.TempDir()).path

    def _files(self, *items):
        return [apply.OutputFile(p, c) for p, c in items]

    def test_second_run_writes_nothing(self):
        files = self._files(('a/x.conf', 'one\n'), ('b/y.conf', 'two\n'))
        report = apply.apply_files(self.out, files)
        self.assertEqual(['a/x.conf', 'b/y.conf'], report.written)
        self.assertTrue(report.changed)
        mtime = os.stat(os.path.join(self.out, 'a/x.conf')).st_mtime_ns
        report = apply.apply_files(self.out, files)
        self.assertEqual([], report.written)
        self.assertEqual(['a/x.conf', 'b/y.conf'], report.unchanged)
        self.assertFalse(report.changed)
        self.assertEqual(mtime, os.stat(os.path.join(
            self.out, 'a/x.conf')).st_mtime_ns)

    def test_dry_run_shows_a_diff_and_writes_nothing(self):
        apply.apply_files(self.out, self._files(('a/x.conf', 'one\n')))
        report = apply.apply_files(
            self.out, self._files(('a/x.conf', 'uno\n'),
                                  ('a/z.conf', 'new\n')), dry_run=True)
        self.assertEqual(['a/x.conf', 'a/z.conf'], report.written)
        text = ''.join(report.diffs)
        self.assertIn('-one\n+uno\n', text)
        self.assertIn('--- /dev/null\n+++ b/a/z.conf', text)
        with open(os.path.join(self.out, 'a/x.conf')) as handle:
            self.assertEqual('one\n', handle.read())
        self.assertFalse(os.path.exists(os.path.join(self.out, 'a/z.conf')))

    def test_files_no_longer_rendered_are_removed_in_scope_only(self):
        apply.apply_files(self.out, self._files(('a/x.conf', '1\n'),
                                                ('b/y.conf', '2\n')))
        with open(os.path.join(self.out, 'a/mine.txt'), 'w') as handle:
            handle.write('not ours\n')
        report = apply.apply_files(self.out, [],
                                   scope=lambda p: p.startswith('a/'))
        self.assertEqual(['a/x.conf'], report.removed)
        self.assertFalse(os.path.exists(os.path.join(self.out, 'a/x.conf')))
        self.assertTrue(os.path.exists(os.path.join(self.out, 'b/y.conf')))
        self.assertTrue(os.path.exists(os.path.join(self.out,
                                                    'a/mine.txt')))
        report = apply.apply_files(self.out, [])
        self.assertEqual(['b/y.conf'], report.removed)

    def test_corrupt_record_is_named(self):
        with open(os.path.join(self.out, apply.MANIFEST), 'w') as handle:
            handle.write('{"nope": 1}')
        err = self.assertRaises(exception.AmdgpuVirtError,
                                apply.apply_files, self.out, [])
        self.assertIn(apply.MANIFEST, str(err))
