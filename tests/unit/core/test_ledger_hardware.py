"""The ledger against the hosts' GPUs: roles the hardware cannot take."""

import dataclasses
import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt import ledger
from amdgpu_virt.inventory import fleet
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role

A0 = PciAddress.parse('0000:05:00.0')
A1 = PciAddress.parse('0000:25:00.0')
GIM = simulate.design_host(simulate.HostSpec('h', gpus=2, mode='gim-cpx'))
BM = simulate.design_host(simulate.HostSpec('h', gpus=2, mode='spx'))


def _vf(address=A0, count=8, model='MI300X'):
    return ledger.GpuAssignment('h', address, Role.NOVA_VF, model,
                                vf_count=count)


def _k8s(address=A1, compute=None, memory=None):
    return ledger.GpuAssignment('h', address, Role.K8S_SHARED, 'MI300X',
                                compute_mode=compute, memory_mode=memory)


class TestCheckHardware(testtools.TestCase):

    def _check(self, items, inventory=GIM):
        ledger.check_hardware(ledger.build(items), [inventory], 'l.yaml')

    def _error(self, items, inventory=GIM):
        return str(self.assertRaises(exception.PlanError, self._check,
                                     items, inventory))

    def test_sample_ledger_fits_the_sample_fleet(self):
        inventories = fleet.load_fleet()
        items = [ledger.GpuAssignment(inv.hostname, g.address, Role.IDLE,
                                      g.model.name)
                 for inv in inventories for g in inv.gpus]
        ledger.check_hardware(ledger.build(items), inventories)

    def test_consistent_host(self):
        self._check([_vf(A0), _vf(A1)])
        # a pod GPU next to GIM GPUs, in the NPS mode GIM sets
        self._check([_vf(A0), _k8s(A1, 'CPX', 'NPS4')])

    def test_gpu_the_host_does_not_have(self):
        message = self._error([_vf(PciAddress.parse('0000:99:00.0'))])
        self.assertIn('l.yaml: host h GPU 0000:99:00.0', message)
        self.assertIn('field address', message)
        self.assertIn('0000:05:00.0, 0000:25:00.0', message)

    def test_model_differs(self):
        mi210 = simulate.design_host(simulate.HostSpec(
            'h', model='MI210', gpus=1, mode='spx'))
        message = self._error([_vf(A0)], mi210)
        self.assertIn('field model', message)
        self.assertIn('the host has MI210', message)

    def test_more_vfs_than_the_gpu_offers(self):
        gpu = dataclasses.replace(GIM.gpus[0], sriov_totalvfs=4)
        host = dataclasses.replace(GIM, gpus=(gpu,))
        message = self._error([_vf(A0)], host)
        self.assertIn('host h GPU 0000:05:00.0', message)
        self.assertIn('field vf_count', message)
        self.assertIn('at most 4 VFs', message)

    def test_partition_mode_the_gpu_does_not_list(self):
        gpu = dataclasses.replace(BM.gpus[1],
                                  available_compute_partitions=('SPX',))
        host = dataclasses.replace(BM, gpus=(BM.gpus[0], gpu))
        message = self._error([_k8s(A1, 'CPX', 'NPS4')], host)
        self.assertIn('field compute_mode', message)
        self.assertIn('offers only SPX', message)

    def test_mixed_memory_modes_on_one_host(self):
        message = self._error([_vf(A0), _k8s(A1, 'SPX', 'NPS1')])
        self.assertIn('l.yaml: host h', message)
        self.assertIn('field memory_mode', message)
        self.assertIn('0000:05:00.0 NPS4 (nova-vf)', message)
        self.assertIn('0000:25:00.0 NPS1 (k8s-shared)', message)
        message = self._error([_k8s(A0, 'SPX', 'NPS1'),
                               _k8s(A1, 'CPX', 'NPS4')], BM)
        self.assertIn('field memory_mode', message)

    def test_separate_hives_may_differ_without_gim(self):
        gpus = (dataclasses.replace(BM.gpus[0], hive_id=1),
                dataclasses.replace(BM.gpus[1], hive_id=2))
        host = dataclasses.replace(BM, gpus=gpus)
        self._check([_k8s(A0, 'SPX', 'NPS1'), _k8s(A1, 'CPX', 'NPS4')],
                    host)

    def test_hosts_without_inventory_are_not_checked(self):
        ledger.check_hardware(ledger.build([_vf(A0)]), [], 'l.yaml')

    def test_load_with_inventories(self):
        path = os.path.join(self.useFixture(fixtures.TempDir()).path,
                            'l.yaml')
        ledger.save(ledger.build([_vf(A0), _k8s(A1, 'SPX', 'NPS1')]), path)
        self.assertEqual(2, len(ledger.load(path).assignments))
        err = self.assertRaises(exception.PlanError, ledger.load, path,
                                [GIM])
        self.assertIn(path, str(err))


class TestLedgerEditing(testtools.TestCase):

    def test_required_memory_mode(self):
        self.assertEqual('NPS4', _vf().required_memory_mode())
        self.assertEqual('NPS1', _vf(count=1).required_memory_mode())
        self.assertIsNone(_k8s().required_memory_mode())
        self.assertEqual('NPS1', _k8s(memory='NPS1').required_memory_mode())

    def test_replace_and_restrict(self):
        base = ledger.build([_vf(A0), _vf(A1)])
        moved = base.replace(_k8s(A1))
        self.assertEqual(Role.K8S_SHARED, moved.get('h', A1).role)
        self.assertEqual(2, len(moved.assignments))
        other = ledger.GpuAssignment('o', A0, Role.IDLE, 'MI300X')
        both = moved.replace(other)
        self.assertEqual(('o',), both.restrict(['o']).hosts)
        self.assertEqual('h:0000:05:00.0', _vf().gpu)

    def test_save_is_atomic_idempotent_and_keeps_extra_keys(self):
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'l.yaml')
        items = ledger.build([_vf(A0)])
        extra = {'placements': [{'workload': 'w', 'kind': 'vf',
                                 'host': 'h', 'grants': [
                                     {'address': str(A0), 'vf': 0}]}]}
        self.assertTrue(ledger.save(items, path, extra))
        mtime = os.stat(path).st_mtime_ns
        self.assertFalse(ledger.save(items, path, extra))
        self.assertEqual(mtime, os.stat(path).st_mtime_ns)
        self.assertEqual(items, ledger.load(path))
        with open(path) as handle:
            self.assertIn('placements:', handle.read())
        self.assertEqual(['l.yaml'], os.listdir(tmp))
        # A directory is created when needed; a file in the way is named.
        self.assertTrue(ledger.save(items, os.path.join(tmp, 'new', 'l.yaml')))
        err = self.assertRaises(exception.OutputError, ledger.save, items,
                                os.path.join(path, 'l.yaml'))
        self.assertIn('l.yaml/l.yaml', str(err))
