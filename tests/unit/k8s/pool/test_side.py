"""Reading the Kubernetes side of the pool: registrations and pods."""

import testtools

from amdgpu_virt import ledger
from amdgpu_virt.k8s.pool import side as pool
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import hami

A0 = PciAddress.parse('0000:05:00.0')


def _info(device_id, address, health=True, count=10):
    return hami.DeviceInfo(id=device_id, count=count, devcore=38,
                           type='AMD Instinct MI300X', health=health,
                           custominfo={hami.CUSTOMINFO_PCI_BDF: address})


def _node(value):
    meta = {'name': 'n1'}
    if value is not None:
        meta['annotations'] = {hami.NODE_REGISTER: value}
    return {'metadata': meta}


class TestNodeView(testtools.TestCase):

    def test_partitions_of_one_gpu_are_one_offer(self):
        value = hami.encode_node_register([
            _info('p0', '0000:05:00.0'), _info('p1', '0000:05:00.0'),
            _info('q0', '0000:25:00.0', health=False),
            _info('bad', 'not-an-address')])
        view = pool.node_view(_node(value))
        self.assertEqual((True, 20, ('p0', 'p1')), view.offers[A0])
        healthy, count, _ids = view.offers[PciAddress.parse('0000:25:00.0')]
        self.assertEqual((False, 0), (healthy, count))
        self.assertEqual({'p0', 'p1', 'q0'}, set(view.devices))

    def test_address_without_domain(self):
        self.assertEqual(PciAddress.parse('0000:83:00.0'), pool.gpu_address(
            _info('x', '83:00.0')))
        self.assertIsNone(pool.gpu_address(hami.DeviceInfo(id='y')))

    def test_no_or_bad_registration(self):
        self.assertEqual({}, pool.node_view(_node(None)).offers)
        view = pool.node_view(_node('{not json'))
        self.assertEqual({}, view.offers)
        self.assertIn(hami.NODE_REGISTER, view.problem)


class TestLedgerMap(testtools.TestCase):

    def test_manifest_and_host_roles(self):
        items = ledger.build([
            ledger.GpuAssignment('n1', A0, Role.K8S_SHARED, 'MI300X'),
            ledger.GpuAssignment('n1', PciAddress.parse('0000:25:00.0'),
                                 Role.NOVA_DEDICATED, 'MI300X')])
        where = ledgermap.Location('gpu', 'roles')
        body = ledgermap.manifest(items, where)
        self.assertEqual({'name': 'roles', 'namespace': 'gpu'},
                         {k: body['metadata'][k]
                          for k in ('name', 'namespace')})
        self.assertEqual(items.dumps(), body['data'][ledgermap.DATA_KEY])
        self.assertEqual(('0000:05:00.0',), ledgermap.k8s_gpus(items, 'n1'))
        self.assertEqual((), ledgermap.k8s_gpus(items, 'other'))
        self.assertEqual((), ledgermap.k8s_gpus(None, 'n1'))
        self.assertEqual('configmap gpu/roles', str(where))
