"""ResourceSlices and DeviceClasses built from inventory + ledger."""

from __future__ import annotations

import cel
import kubernetes_validate
import testtools

from amdgpu_virt import model
from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import devices
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.model import Role
from tests.functional.fixtures import draallocator
from tests.unit.k8s.dra import helpers

#: Kubernetes versions that serve resource.k8s.io/v1
VERSIONS = ('1.34.0', '1.35.0', '1.36.0', '1.37.0')


def validate(test, obj, versions=VERSIONS):
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            test.fail('%s %s invalid for %s: %s' % (
                obj['kind'], obj['metadata']['name'], version, err))


def all_devices(objs):
    return [d for s in objs for d in s['spec'].get('devices', [])]


class TestWhatIsPublished(testtools.TestCase):

    def test_nova_and_idle_gpus_are_never_published(self):
        inv = helpers.host('mi300x-spx')
        ledger = helpers.roles(inv, 'n', Role.NOVA_VF, Role.NOVA_DEDICATED,
                               Role.IDLE, Role.K8S_DEDICATED,
                               Role.K8S_SHARED)
        plan = devices.plan('n', inv, ledger.for_host('n'))
        published = {str(d.gpu.address) for d in plan.devices}
        self.assertEqual({str(inv.gpus[3].address),
                          str(inv.gpus[4].address)}, published)
        # GPUs 5..7 have no ledger entry: not published either
        self.assertEqual(2, len(plan.devices))

    def test_gpus_not_driven_by_amdgpu_are_never_published(self):
        inv = helpers.host('mi300x-mixed')
        plan = devices.plan('n', inv)
        drivers = {inv.gpu(d.gpu.address).driver for d in plan.devices}
        self.assertEqual({model.Driver.AMDGPU}, drivers)
        self.assertNotIn(str(inv.gpus[0].address),
                         {str(d.gpu.address) for d in plan.devices})

    def test_role_change_withdraws_the_gpu(self):
        inv = helpers.host('mi300x-spx')
        before = helpers.roles(inv, 'n', *([Role.K8S_DEDICATED] * 8))
        after = before.replace(
            before.get('n', inv.gpus[2].address).__class__(
                'n', inv.gpus[2].address, Role.NOVA_VF, 'MI300X',
                vf_count=8))
        old = devices.plan('n', inv, before.for_host('n'))
        new = devices.plan('n', inv, after.for_host('n'))
        self.assertEqual(8, len(old.devices))
        self.assertNotIn(inv.gpus[2].address,
                         [d.gpu.address for d in new.devices])
        self.assertEqual(7, len(new.devices))

    def test_without_ledger_every_gpu_is_whole(self):
        plan = devices.plan('n', helpers.host('mi300x-spx'))
        self.assertEqual({devices.DeviceType.GPU},
                         {d.type for d in plan.devices})
        self.assertEqual((), plan.counter_sets)


class TestSliceLimits(testtools.TestCase):

    def check_pool(self, objs, versions=VERSIONS):
        generations = {s['spec']['pool']['generation'] for s in objs}
        counts = {s['spec']['pool']['resourceSliceCount'] for s in objs}
        self.assertEqual(1, len(generations))
        self.assertEqual({len(objs)}, counts)
        names = [s['metadata']['name'] for s in objs]
        self.assertEqual(sorted(names), names)
        for obj in objs:
            spec = obj['spec']
            self.assertFalse('devices' in spec and 'sharedCounters' in spec,
                             obj['metadata']['name'])
            devs = spec.get('devices', [])
            limit = 64 if any('consumesCounters' in d for d in devs) \
                else 128
            self.assertLessEqual(len(devs), limit)
            self.assertLessEqual(len(spec.get('sharedCounters', [])), 8)
            for dev in devs:
                self.assertLessEqual(
                    len(dev['attributes']) + len(dev['capacity']), 32)
                self.assertLessEqual(len(dev.get('consumesCounters', [])),
                                     2)
            validate(self, obj, versions)

    def test_cpx_host_needs_two_device_slices_and_a_counter_slice(self):
        plan = devices.plan('node-1', helpers.full_cpx_host())
        objs = slices.build(plan, helpers.DRIVER, generation=3)
        self.check_pool(objs)
        self.assertEqual([64, 8, 0], [len(s['spec'].get('devices', []))
                                      for s in objs])
        self.assertEqual(8, len(objs[2]['spec']['sharedCounters']))
        self.assertEqual({3}, {s['spec']['pool']['generation']
                               for s in objs})

    def test_sixteen_gpus_split_counter_sets(self):
        inv = helpers.host('mi300x-cpx')
        more = tuple(model.replace(g, address=model.PciAddress(
            1, g.address.bus, 0, 0)) for g in inv.gpus)
        inv = model.replace(inv, gpus=inv.gpus + more)
        objs = slices.build(devices.plan('big', inv), helpers.DRIVER)
        self.check_pool(objs, ('1.35.0',))
        self.assertEqual(2, sum(1 for s in objs
                                if 'sharedCounters' in s['spec']))

    def test_large_share_host_uses_128_per_slice(self):
        inv = helpers.host('mi300x-cpx')
        more = tuple(model.replace(g, address=model.PciAddress(
            d, g.address.bus, 0, 0)) for d in range(1, 3) for g in inv.gpus)
        inv = model.replace(inv, gpus=inv.gpus + more)
        ledger = helpers.roles(inv, 'n', *([Role.K8S_SHARED] * 24))
        objs = slices.build(devices.plan('n', inv, ledger.for_host('n')),
                            helpers.DRIVER)
        self.check_pool(objs, ('1.36.0',))
        self.assertEqual([128, 61], [len(s['spec']['devices'])
                                     for s in objs])

    def test_every_kind_of_host_validates(self):
        for kind in ('mi300x-spx', 'mi300x-dpx', 'mi300x-qpx-nps4',
                     'mi300x-mixed', 'mi355x-cpx-nps2', 'mi300a-tpx',
                     'mi210-spx'):
            inv = helpers.host(kind)
            n = len(inv.gpus)
            for role in (Role.K8S_DEDICATED, Role.K8S_SHARED):
                ledger = helpers.roles(inv, 'n', *([role] * n))
                objs = slices.build(devices.plan('n', inv,
                                                 ledger.for_host('n')),
                                    helpers.DRIVER)
                self.check_pool(objs, ('1.37.0',))

    def test_strict_validation_catches_a_bad_field(self):
        obj = slices.build(devices.plan('n', helpers.host('mi300x-spx')),
                           helpers.DRIVER)[0]
        obj['spec']['devices'][0]['capcity'] = {}
        self.assertRaises(kubernetes_validate.ValidationError,
                          kubernetes_validate.validate, obj, '1.36.0',
                          strict=True)


class TestDevices(testtools.TestCase):

    def test_partitions_consume_their_gpu_counters(self):
        plan = devices.plan('n', helpers.full_cpx_host())
        objs = slices.build(plan, helpers.DRIVER)
        counter_sets = {cs['name']: cs['counters']
                        for s in objs for cs in s['spec'].get(
                            'sharedCounters', [])}
        for dev in all_devices(objs):
            (consumed,) = dev['consumesCounters']
            total = counter_sets[consumed['counterSet']]
            kind = dev['attributes']['type']['string']
            if kind == 'gpu':
                self.assertEqual(total, consumed['counters'])
            else:
                self.assertEqual({'value': '1'},
                                 consumed['counters']['xcds'])
        self.assertEqual({'value': '8'}, next(iter(
            counter_sets.values()))['xcds'])

    def test_whole_gpu_has_attributes_and_capacity(self):
        objs = slices.build(devices.plan('n', helpers.host('mi300x-spx')),
                            helpers.DRIVER)
        dev = all_devices(objs)[-1]
        attrs = {k: next(iter(v.values()))
                 for k, v in dev['attributes'].items()}
        self.assertEqual('gpu', attrs['type'])
        self.assertEqual('MI300X', attrs['model'])
        self.assertEqual('gfx942', attrs['gfx'])
        self.assertEqual('0000:05:00.0', attrs['pciAddress'])
        self.assertEqual('0000:05:00.0',
                         attrs['resource.kubernetes.io/pciBusID'])
        self.assertEqual('0x74a1', attrs['productId'])
        self.assertEqual('SPX', attrs['computePartition'])
        self.assertEqual('NPS1', attrs['memoryPartition'])
        self.assertEqual(0, attrs['numaNode'])
        self.assertEqual({'computeUnits': {'value': '304'},
                          'memory': {'value': '192Gi'}},
                         dev['capacity'])
        self.assertNotIn('allowMultipleAllocations', dev)

    def test_gpus_without_partition_modes_do_not_say_them(self):
        objs = slices.build(devices.plan('n', helpers.host('mi210-spx')),
                            helpers.DRIVER)
        for dev in all_devices(objs):
            self.assertNotIn('computePartition', dev['attributes'])

    def test_share_request_policy_from_the_catalog(self):
        inv = helpers.host('mi300x-spx')
        ledger = helpers.roles(inv, 'n', Role.K8S_SHARED)
        objs = slices.build(devices.plan('n', inv, ledger.for_host('n')),
                            helpers.DRIVER, memory_step_mib=512)
        (dev,) = all_devices(objs)
        self.assertTrue(dev['allowMultipleAllocations'])
        self.assertEqual({'value': '304', 'requestPolicy': {
            'default': '304',
            'validRange': {'min': '1', 'max': '304', 'step': '1'}}},
            dev['capacity']['computeUnits'])
        self.assertEqual({'value': '192Gi', 'requestPolicy': {
            'default': '192Gi',
            'validRange': {'min': '512Mi', 'max': '192Gi',
                           'step': '512Mi'}}}, dev['capacity']['memory'])

    def test_share_cu_unit_of_two(self):
        inv = helpers.host('mi300x-spx')
        gpu = inv.gpus[0]
        wgp = model.replace(gpu.model, cu_alloc_unit=2)
        part = model.replace(gpu.partitions[0], compute_units=61)
        inv = model.replace(inv, gpus=(model.replace(
            gpu, model=wgp, partitions=(part,)),))
        ledger = helpers.roles(inv, 'n', Role.K8S_SHARED)
        (dev,) = all_devices(slices.build(
            devices.plan('n', inv, ledger.for_host('n')), helpers.DRIVER))
        self.assertEqual({'default': '60', 'validRange': {
            'min': '2', 'max': '60', 'step': '2'}},
            dev['capacity']['computeUnits']['requestPolicy'])
        self.assertEqual({'int': 2}, dev['attributes']['cuUnit'])
        validate(self, slices.build(
            devices.plan('n', inv, ledger.for_host('n')), helpers.DRIVER)[0])

    def test_publishing_order_is_the_packing_policy(self):
        inv = helpers.host('mi300x-mixed-nps4')
        n = len(inv.gpus)
        ledger = helpers.roles(inv, 'n', Role.K8S_DEDICATED,
                               Role.K8S_DEDICATED, Role.NOVA_VF,
                               Role.NOVA_VF, Role.IDLE, Role.K8S_SHARED,
                               Role.K8S_DEDICATED, Role.K8S_SHARED)
        self.assertEqual(8, n)
        plan = devices.plan('n', inv, ledger.for_host('n'))
        kinds = [d.type.value for d in plan.devices]
        # partitions, then whole GPUs, then shares
        self.assertEqual(sorted(kinds, key=['partition', 'gpu',
                                            'share'].index), kinds)
        parts = [d.gpu.address for d in plan.devices
                 if d.type is devices.DeviceType.PARTITION]
        wholes = [d.gpu.address for d in plan.devices
                  if d.type is devices.DeviceType.GPU]
        shares = [d.gpu.address for d in plan.devices
                  if d.type is devices.DeviceType.SHARE]
        self.assertEqual(sorted(parts), parts)
        self.assertEqual(sorted(wholes, reverse=True), wholes)
        self.assertEqual(sorted(shares), shares)

    def test_no_partition_devices_option(self):
        plan = devices.plan('n', helpers.host('mi300x-cpx'),
                            partition_devices=False)
        self.assertEqual({devices.DeviceType.GPU},
                         {d.type for d in plan.devices})
        self.assertEqual((), plan.counter_sets)
        objs = slices.build(plan, helpers.DRIVER)
        self.assertNotIn('consumesCounters', all_devices(objs)[0])

    def test_long_node_names_are_hashed(self):
        prefix = slices.slice_prefix('n' * 250, helpers.DRIVER)
        self.assertLessEqual(len(prefix) + 3, 253)
        self.assertEqual(prefix, slices.slice_prefix('n' * 250,
                                                     helpers.DRIVER))


class TestDeviceClasses(testtools.TestCase):

    def test_classes_validate(self):
        for obj in classes.device_classes(helpers.DRIVER, 'amd.com/gpu'):
            validate(self, obj)
        names = [c['metadata']['name'] for c in classes.device_classes(
            helpers.DRIVER)]
        self.assertEqual(['gpu.amd.com', 'partition.gpu.amd.com',
                          'share.gpu.amd.com'], names)

    def test_extended_resource_only_on_the_whole_gpu_class(self):
        objs = classes.device_classes(helpers.DRIVER, 'amd.com/gpu')
        self.assertEqual('amd.com/gpu',
                         objs[0]['spec']['extendedResourceName'])
        self.assertNotIn('extendedResourceName', objs[1]['spec'])
        self.assertNotIn('extendedResourceName',
                         classes.device_classes(helpers.DRIVER)[0]['spec'])

    def test_each_selector_picks_exactly_its_type_with_a_real_cel(self):
        inv = helpers.host('mi300x-mixed-nps4')
        ledger = helpers.roles(inv, 'n', Role.K8S_DEDICATED,
                               Role.K8S_SHARED, Role.NOVA_VF,
                               Role.NOVA_VF, Role.IDLE, Role.K8S_SHARED,
                               Role.K8S_DEDICATED, Role.K8S_DEDICATED)
        objs = slices.build(devices.plan('n', inv, ledger.for_host('n')),
                            helpers.DRIVER)
        candidates = [draallocator.Candidate(helpers.DRIVER, 'n', 's', d)
                      for d in all_devices(objs)]
        other = draallocator.Candidate('gpu.example.com', 'n', 's',
                                       all_devices(objs)[0])
        for obj in classes.device_classes(helpers.DRIVER):
            (sel,) = obj['spec']['selectors']
            expression = sel['cel']['expression']
            cel.compile(expression)
            kind = obj['metadata']['name'].split('.')[0]
            kind = 'gpu' if kind == 'gpu' else kind
            picked = {c.device['name'] for c in candidates
                      if draallocator.cel_matches(expression, c)}
            wanted = {c.device['name'] for c in candidates
                      if c.device['attributes']['type']['string'] == kind}
            self.assertTrue(wanted)
            self.assertEqual(wanted, picked)
            self.assertFalse(draallocator.cel_matches(expression, other))
