"""AMD node-labeller compatible labels (pure)."""

import testtools

from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import labels

def _host(**kw):
    inventory = simulate.design_host(simulate.HostSpec(hostname='n1', **kw))
    return ({str(g.address): g for g in inventory.gpus},
            devices.units_from_inventory(inventory))


class TestNodeLabels(testtools.TestCase):

    def test_mi300x_spx(self):
        gpus, units = _host(gpus=8, mode='spx')
        got = labels.node_labels(gpus, units)
        self.assertEqual({
            'amd.com/gpu.compute-memory-partition': 'spx_nps1',
            'amd.com/gpu.compute-partitioning-supported': 'true',
            'amd.com/gpu.cu-count': '304',
            'amd.com/gpu.device-id': '74a1',
            'amd.com/gpu.family': 'AI',
            'amd.com/gpu.memory-partitioning-supported': 'true',
            'amd.com/gpu.mode': 'container',
            'amd.com/gpu.product-name': 'AMD_Instinct_MI300X',
            'amd.com/gpu.simd-count': '1216',
            'amd.com/gpu.vram': '192G',
            'beta.amd.com/gpu.cu-count.304': '8',
            'beta.amd.com/gpu.device-id.74a1': '8',
            'beta.amd.com/gpu.family.AI': '8',
            'beta.amd.com/gpu.simd-count.1216': '8',
            'beta.amd.com/gpu.vram.192G': '8'}, got)

    def test_mi210_has_no_partition_labels(self):
        gpus, units = _host(model='MI210', gpus=4, mode='spx')
        got = labels.node_labels(gpus, units)
        self.assertEqual('104', got['amd.com/gpu.cu-count'])
        self.assertEqual('64G', got['amd.com/gpu.vram'])
        self.assertEqual('740f', got['amd.com/gpu.device-id'])
        self.assertEqual('false',
                         got['amd.com/gpu.compute-partitioning-supported'])
        self.assertNotIn('amd.com/gpu.compute-memory-partition', got)

    def test_disagreeing_units_get_counts_only(self):
        gpus, units = _host(gpus=2, gpu_modes=('spx', 'dpx'))
        got = labels.node_labels(gpus, units)
        self.assertNotIn('amd.com/gpu.cu-count', got)
        self.assertNotIn('amd.com/gpu.compute-memory-partition', got)
        self.assertEqual('1', got['beta.amd.com/gpu.cu-count.304'])
        self.assertEqual('2', got['beta.amd.com/gpu.cu-count.152'])
        self.assertEqual('74a1', got['amd.com/gpu.device-id'])

    def test_no_units_no_labels(self):
        gpus, _units = _host(gpus=1)
        self.assertEqual({}, labels.node_labels(gpus, []))

    def test_label_changes(self):
        current = {'kubernetes.io/hostname': 'n1', 'amd.com/gpu.vram': '1G',
                   'beta.amd.com/gpu.vram.1G': '1', 'amd.com/gpu.mode': 'x'}
        desired = {'amd.com/gpu.vram': '192G', 'amd.com/gpu.mode': 'x'}
        self.assertEqual({'amd.com/gpu.vram': '192G',
                          'beta.amd.com/gpu.vram.1G': None},
                         labels.label_changes(current, desired))
        self.assertEqual({}, labels.label_changes(desired, desired))
