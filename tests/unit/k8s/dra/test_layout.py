"""The two ResourceSlice layouts of partitionable devices (1.34, 1.35+).

Kubernetes 1.34 resolves a device's counter set only in the device's own
slice; 1.35 and later refuse a slice with both devices and counter sets.
The slices of each layout are validated strictly against the schemas of
the releases that serve them, allocated by the allocator stand-in, and
checked against each release's limits.
"""

from __future__ import annotations

import dataclasses

import testtools

from amdgpu_virt import exception
from amdgpu_virt import model
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import devices
from amdgpu_virt.k8s.dra import publish
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.k8s.dra.slices import Layout
from amdgpu_virt.model import Role
from tests.functional.fixtures import draallocator as da
from tests.unit.k8s.dra import helpers
from tests.unit.k8s.dra import test_slices

DRIVER = helpers.DRIVER
MIXED_VERSIONS = ('1.34.0',)
SEPARATE_VERSIONS = ('1.35.0', '1.36.0', '1.37.0')


def mixed_host_plan():
    """4 CPX GPUs k8s-dedicated, 2 SPX-like shared, 2 whole: every kind."""
    inv = helpers.host('mi300x-cpx-nps4')
    ledger = helpers.roles(inv, 'n', *[Role.K8S_DEDICATED] * 4,
                           Role.K8S_SHARED, Role.K8S_SHARED,
                           Role.K8S_DEDICATED, Role.K8S_DEDICATED)
    return devices.plan('n', inv, ledger.for_host('n'))


def device_order(objs):
    return [d['name'] for s in sorted(objs, key=lambda o: o['metadata'][
        'name']) for d in s['spec'].get('devices', [])]


def check_1_34_limits(test, obj):
    spec = obj['spec']
    sets = {cs['name']: set(cs['counters'])
            for cs in spec.get('sharedCounters', [])}
    test.assertLessEqual(len(spec.get('devices', [])), 128)
    test.assertLessEqual(sum(len(c) for c in sets.values()), 32)
    consumed = 0
    for device in spec.get('devices', []):
        for use in device.get('consumesCounters', []):
            # the counter set is in this very slice
            test.assertIn(use['counterSet'], sets)
            test.assertLessEqual(set(use['counters']),
                                 sets[use['counterSet']])
            consumed += len(use['counters'])
    test.assertLessEqual(consumed, 1024)


class TestLayoutByVersion(testtools.TestCase):

    def test_layout_for(self):
        self.assertIs(Layout.MIXED, slices.layout_for((1, 34)))
        self.assertIs(Layout.SEPARATE, slices.layout_for((1, 35)))
        self.assertIs(Layout.SEPARATE, slices.layout_for((1, 37)))
        self.assertIs(Layout.SEPARATE, slices.layout_for((2, 0)))

    def test_parse_version(self):
        for body, want in (
                ({'major': '1', 'minor': '34'}, (1, 34)),
                ({'major': '1', 'minor': '35+',
                  'gitVersion': 'v1.35.2-eks-1'}, (1, 35)),
                ({'major': '', 'minor': '',
                  'gitVersion': 'v1.36.0-gke.1200'}, (1, 36)),
                ({'gitVersion': 'v1.34.1+k3s1'}, (1, 34))):
            self.assertEqual(want, publish.parse_version(body), body)

    def test_unusable_versions_name_the_endpoint(self):
        for body in (None, [], 'v1.35', {'major': 'one', 'minor': '35'},
                     {'major': '1', 'minor': '3' * 40},
                     {'gitVersion': 'release-1.35'},
                     {'major': '1', 'minor': '-1'}):
            err = self.assertRaises(exception.KubernetesError,
                                    publish.parse_version, body)
            self.assertIn('/version', str(err))

    def test_layout_of_stored_slices(self):
        plan = mixed_host_plan()
        self.assertIs(Layout.MIXED, slices.layout_of(
            slices.build(plan, DRIVER, layout=Layout.MIXED)))
        self.assertIs(Layout.SEPARATE, slices.layout_of(
            slices.build(plan, DRIVER, layout=Layout.SEPARATE)))
        whole_only = devices.plan('n', helpers.host('mi300x-spx'))
        self.assertIsNone(slices.layout_of(slices.build(
            whole_only, DRIVER, layout=Layout.MIXED)))


class TestMixedLayout(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.plan = mixed_host_plan()
        self.mixed = slices.build(self.plan, DRIVER, layout=Layout.MIXED)
        self.separate = slices.build(self.plan, DRIVER,
                                     layout=Layout.SEPARATE)

    def test_one_slice_with_every_device_and_counter_set(self):
        (obj,) = self.mixed
        self.assertEqual(1, obj['spec']['pool']['resourceSliceCount'])
        self.assertEqual(len(self.plan.devices),
                         len(obj['spec']['devices']))
        self.assertEqual([cs.name for cs in self.plan.counter_sets],
                         [cs['name'] for cs in
                          obj['spec']['sharedCounters']])
        check_1_34_limits(self, obj)
        # the separate layout needs two device slices and a counter slice
        self.assertEqual(3, len(self.separate))

    def test_publishing_order_is_the_same_in_both_layouts(self):
        self.assertEqual(device_order(self.separate),
                         device_order(self.mixed))

    def test_valid_for_the_releases_that_serve_each_layout(self):
        for obj in self.mixed:
            test_slices.validate(self, obj, MIXED_VERSIONS)
        for obj in self.separate:
            test_slices.validate(self, obj, SEPARATE_VERSIONS)
            spec = obj['spec']
            self.assertFalse(spec.get('devices') and
                             spec.get('sharedCounters'))

    def test_sixteen_partitioned_gpus_take_two_slices(self):
        # a simulated host's DRM minors run out after 63 partitions: a
        # second set of 8 GPUs at other addresses makes the 16
        inv = helpers.full_cpx_host()
        more = tuple(model.replace(g, address=simulate.pf_address(8 + n))
                     for n, g in enumerate(inv.gpus))
        inv = model.replace(inv, gpus=inv.gpus + more)
        plan = devices.plan('n', inv)
        objs = slices.build(plan, DRIVER, layout=Layout.MIXED)
        # 16 x (8 partitions + the whole GPU) = 144 devices and 32
        # counters: two slices of 8 GPUs each
        self.assertEqual(144, len(plan.devices))
        self.assertEqual(2, len(objs))
        for obj in objs:
            check_1_34_limits(self, obj)
            test_slices.validate(self, obj, MIXED_VERSIONS)
            # a GPU's devices never straddle two slices
            sets = {cs['name'] for cs in obj['spec']['sharedCounters']}
            self.assertEqual(sets, {d['consumesCounters'][0]['counterSet']
                                    for d in obj['spec']['devices']})
        self.assertEqual(len(plan.devices), len(device_order(objs)))
        self.assertEqual({2}, {o['spec']['pool']['resourceSliceCount']
                               for o in objs})

    def test_devices_without_counters_fill_the_last_slice_then_more(self):
        inv = helpers.host('mi300x-cpx-nps4')
        ledger = helpers.roles(inv, 'n', *[Role.K8S_SHARED] * 8)
        plan = devices.plan('n', inv, ledger.for_host('n'))
        objs = slices.build(plan, DRIVER, layout=Layout.MIXED)
        self.assertEqual([63], [len(o['spec']['devices']) for o in objs])
        self.assertNotIn('sharedCounters', objs[0]['spec'])

    def test_a_gpu_beyond_one_slice_is_refused(self):
        plan = mixed_host_plan()
        big = dataclasses.replace(plan.counter_sets[0], counters=tuple(
            ('c%d' % n, 1) for n in range(33)))
        plan = dataclasses.replace(plan, counter_sets=(big,) +
                                   plan.counter_sets[1:])
        err = self.assertRaises(exception.InventoryError, slices.build,
                                plan, DRIVER, layout=Layout.MIXED)
        self.assertIn(big.name, str(err))
        self.assertIn('1.34', str(err))


class TestSameAllocations(testtools.TestCase):
    """The allocator stand-in hands out the same devices either way."""

    def fill(self, objs, make):
        alloc = da.Allocator(objs, classes.device_classes(DRIVER))
        got = []
        n = 0
        while True:
            result = alloc.allocate(make('c%d' % n), 'node-1')
            if result is None:
                return got
            got.append([r['device'] for r in result['devices']['results']])
            n += 1

    def test_partitions_then_wholes(self):
        plan = devices.plan('node-1', helpers.full_cpx_host())

        def claim(name):
            if name in ('c3', 'c70'):
                return da.claim(name, [da.request('g', DRIVER)])
            return da.claim(name, [da.request('p', 'partition.' + DRIVER)])

        mixed = self.fill(slices.build(plan, DRIVER, layout=Layout.MIXED),
                          claim)
        separate = self.fill(slices.build(plan, DRIVER,
                                          layout=Layout.SEPARATE), claim)
        self.assertEqual(separate, mixed)
        # 64 partitions on 8 GPUs, and one whole GPU taken before they ran
        # out: 56 partitions and one whole
        self.assertEqual(57, len(mixed))
