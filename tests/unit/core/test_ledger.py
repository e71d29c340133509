"""Tests of the GPU role ledger (load, validate, dump)."""

import os
import tempfile

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt import ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role

GOOD = """
version: 1
hosts:
  compute-1:
    gpus:
      - {address: "0000:05:00.0", model: MI300X, role: nova-vf, vf_count: 8}
      - {address: "0000:25:00.0", model: MI300X, role: k8s-shared,
         compute_mode: spx, memory_mode: nps1}
  compute-2:
    gpus:
      - {address: "0000:05:00.0", model: MI210, role: nova-dedicated}
"""


def _load(text, source='plan.yaml'):
    return ledger.from_dict(yamlutil.load(text, source), source)


class TestLedgerLoad(testtools.TestCase):

    def test_good_file(self):
        result = _load(GOOD)
        self.assertEqual(('compute-1', 'compute-2'), result.hosts)
        vf = result.get('compute-1', '0000:05:00.0')
        self.assertEqual(Role.NOVA_VF, vf.role)
        self.assertEqual(8, vf.vf_count)
        shared = result.get('compute-1', PciAddress(0, 0x25, 0, 0))
        self.assertEqual(('SPX', 'NPS1'),
                         (shared.compute_mode, shared.memory_mode))
        self.assertEqual(Role.NOVA_DEDICATED,
                         result.for_host('compute-2')[0].role)
        self.assertIsNone(result.get('compute-2', '0000:25:00.0'))

    def test_round_trip(self):
        first = _load(GOOD)
        self.assertEqual(first, _load(first.dumps()))
        self.assertEqual(first.dumps(), _load(first.dumps()).dumps())

    def test_file_round_trip(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'ledger.yaml')
            with open(path, 'w') as handle:
                handle.write(GOOD)
            self.assertEqual(_load(GOOD), ledger.load(path))

    def _error(self, text):
        return self.assertRaises(exception.PlanError, _load, text)

    def test_gpu_with_two_roles(self):
        text = GOOD.replace('25:00.0', '05:00.0')
        err = self._error(text)
        self.assertIn('plan.yaml', str(err))
        self.assertIn('0000:05:00.0 of host compute-1 has two roles', str(err))

    def test_duplicate_yaml_key_is_not_silently_dropped(self):
        text = 'version: 1\nhosts:\n  a: {gpus: []}\n  a: {gpus: []}\n'
        err = self.assertRaises(exception.AmdgpuVirtError, _load, text)
        self.assertIn("duplicate key 'a'", str(err))

    def test_vf_count_the_model_cannot_take(self):
        err = self._error(GOOD.replace('vf_count: 8', 'vf_count: 4'))
        self.assertIn('hosts.compute-1.gpus[0]', str(err))
        self.assertIn('VF count 4; allowed: 1, 8', str(err))

    def test_vf_role_without_vf_count(self):
        err = self._error(GOOD.replace(', vf_count: 8', ''))
        self.assertIn('vf_count (an integer) is required', str(err))

    def test_vf_count_on_another_role(self):
        err = self._error(GOOD.replace('role: nova-dedicated',
                                       'role: nova-dedicated, vf_count: 1'))
        self.assertIn('hosts.compute-2.gpus[0]', str(err))
        self.assertIn('only valid for nova-vf', str(err))

    def test_vf_role_on_model_without_sriov(self):
        text = GOOD.replace('model: MI210, role: nova-dedicated',
                            'model: MI300A, role: nova-vf, vf_count: 1')
        err = self._error(text)
        self.assertIn('no SR-IOV', str(err))

    def test_invalid_mode_pair(self):
        err = self._error(GOOD.replace('memory_mode: nps1',
                                       'memory_mode: nps4'))
        self.assertIn("memory mode with spx 'nps4'", str(err))

    def test_unknown_role(self):
        err = self._error(GOOD.replace('role: nova-dedicated',
                                       'role: nova-shared'))
        self.assertIn("role 'nova-shared' is not one of", str(err))

    def test_unknown_key(self):
        err = self._error(GOOD.replace('role: nova-dedicated',
                                       'role: nova-dedicated, colour: red'))
        self.assertIn('unknown key(s) colour', str(err))

    def test_unknown_model(self):
        err = self._error(GOOD.replace('MI210', 'MI999'))
        self.assertIn("Unknown GPU model 'MI999'", str(err))

    def test_bad_address(self):
        err = self._error(GOOD.replace('"0000:05:00.0", model: MI210',
                                       '"05:00", model: MI210'))
        self.assertIn("'05:00' is not a PCI address", str(err))

    def test_missing_field(self):
        err = self._error(GOOD.replace('model: MI210, ', ''))
        self.assertIn('model is required', str(err))

    def test_wrong_shapes(self):
        self._error('[]')
        self._error('hosts: [1, 2]')
        self._error('version: 1\nhosts:\n  a: {gpus: 3}\n')
        self._error('version: 1\nhosts:\n  a: {gpus: [3]}\n')
        err = self._error('version: 2\nhosts: {}\n')
        self.assertIn('version 2 is not supported', str(err))

    def test_empty_ledger(self):
        # as the ledger ConfigMap may hold (nothing offered yet); a file
        # the operator names is refused (TestLedgerFile)
        self.assertEqual((), _load('version: 1\nhosts: {}\n').assignments)
        self.assertEqual((), _load('version: 1\nhosts:\n').assignments)

    def test_a_ledger_without_a_version_is_refused(self):
        err = self._error('hosts: {}\n')
        self.assertIn('plan.yaml', str(err))
        self.assertIn('no "version"', str(err))
        err = self._error(GOOD.replace('version: 1\n', ''))
        self.assertIn('no "version"', str(err))

    def test_an_unquoted_address_names_its_entry(self):
        # YAML 1.1 reads 0000:05:00.0 as 300.0 (base 60), 0000:25:00.0 as
        # 1500.0; 0000:c5:00.0 stays a string
        text = GOOD.replace('"0000:25:00.0"', '0000:25:00.0')
        err = self._error(text)
        self.assertIn('plan.yaml: hosts.compute-1.gpus[1]', str(err))
        self.assertIn('1500.0 is a number', str(err))
        self.assertIn('write it quoted', str(err))
        err = self._error(GOOD.replace('"0000:25:00.0"', '[1]'))
        self.assertIn('[1] is not a PCI address string', str(err))

    def test_every_address_is_written_quoted(self):
        items = _load(GOOD).assignments + (ledger.GpuAssignment(
            'compute-1', PciAddress.parse('0000:c5:00.0'),
            Role.IDLE, 'MI300X'),)
        text = ledger.build(items).dumps()
        self.assertIn("address: '0000:c5:00.0'", text)
        self.assertIn("address: '0000:05:00.0'", text)
        self.assertNotRegex(text, r'address: [0-9]')
        self.assertEqual(ledger.build(items), _load(text))


class TestLedgerFile(testtools.TestCase):

    def test_a_file_that_gives_no_gpu_a_role_is_refused(self):
        path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                            'ledger.yaml')
        with open(path, 'w') as handle:
            handle.write('version: 1\nhosts: {}\n')
        err = self.assertRaises(exception.PlanError, ledger.load, path)
        self.assertIn(path, str(err))
        self.assertIn('gives no GPU a role', str(err))

    def test_missing_file_says_it_is_the_ledger(self):
        path = os.path.join(tempfile.gettempdir(), 'absent-ledger-%d.yaml'
                            % os.getpid())
        err = self.assertRaises(exception.AmdgpuVirtError, ledger.load, path)
        self.assertIn('cannot read ledger %s' % path, str(err))
