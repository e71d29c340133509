"""The structured-allocator stand-in, and the DRA acceptance on it.

The stand-in (:mod:`tests.functional.fixtures.draallocator`) is tested
with the examples of the allocator's rules first, then the driver's
ResourceSlices are allocated the way the kube-scheduler would.
"""

from __future__ import annotations

import copy
from decimal import Decimal

import testtools
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amdgpu_virt.k8s.dra import claims as dra_claims
from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import devices
from amdgpu_virt.k8s.dra import prepare as dra_prepare
from amdgpu_virt.k8s.dra import served
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.k8s.node import devices as unit_devices
from amdgpu_virt.model import Role
from tests.functional.fixtures import draallocator as da
from tests.unit.k8s.dra import helpers

DRIVER = helpers.DRIVER
CLASSES = classes.device_classes(DRIVER)
ANY = [{'apiVersion': 'resource.k8s.io/v1', 'kind': 'DeviceClass',
        'metadata': {'name': 'any'}, 'spec': {}}]


def pool(devices_, counters=(), generation=1, count=None, name='s',
         pool_name='n'):
    specs = []
    if devices_:
        specs.append({'devices': list(devices_)})
    if counters:
        specs.append({'sharedCounters': list(counters)})
    out = []
    for i, extra in enumerate(specs):
        spec = {'driver': DRIVER, 'nodeName': pool_name,
                'pool': {'name': pool_name, 'generation': generation,
                         'resourceSliceCount': count or len(specs)}}
        spec.update(extra)
        out.append({'metadata': {'name': '%s-%d' % (name, i)},
                    'spec': spec})
    return out


def dev(name, **kw):
    obj = {'name': name, 'attributes': kw.pop('attributes', {}),
           'capacity': kw.pop('capacity', {})}
    obj.update(kw)
    return obj


def any_request(name='r', **kw):
    return da.request(name, 'any', **kw)


class TestStandIn(testtools.TestCase):

    def test_first_fit_in_published_order(self):
        alloc = da.Allocator(pool([dev('b'), dev('a')]), ANY)
        result = alloc.allocate(da.claim('c', [any_request()]), 'n')
        self.assertEqual('b', result['devices']['results'][0]['device'])
        result = alloc.allocate(da.claim('c2', [any_request()]), 'n')
        self.assertEqual('a', result['devices']['results'][0]['device'])
        self.assertIsNone(alloc.allocate(da.claim('c3', [any_request()]),
                                         'n'))

    def test_slices_sorted_by_name_and_highest_generation_only(self):
        old = pool([dev('old')], generation=1, name='z')
        new = pool([dev('new')], generation=2, name='y')
        alloc = da.Allocator(old + new, ANY)
        result = alloc.allocate(da.claim('c', [any_request()]), 'n')
        self.assertEqual('new', result['devices']['results'][0]['device'])
        self.assertIsNone(alloc.allocate(da.claim('d', [any_request()]),
                                         'n'))

    def test_incomplete_pool_is_skipped(self):
        alloc = da.Allocator(pool([dev('a')], count=2), ANY)
        self.assertIsNone(alloc.allocate(da.claim('c', [any_request()]),
                                         'n'))

    def test_counters_in_another_slice(self):
        counters = [{'name': 'g', 'counters': {'xcds': {'value': '2'}}}]
        use = [{'counterSet': 'g', 'counters': {'xcds': {'value': '1'}}}]
        whole = [{'counterSet': 'g', 'counters': {'xcds': {'value': '2'}}}]
        objs = pool([dev('p0', consumesCounters=use),
                     dev('p1', consumesCounters=use),
                     dev('w', consumesCounters=whole)], counters)
        alloc = da.Allocator(objs, ANY)
        self.assertIsNotNone(alloc.allocate(da.claim(
            'c', [any_request(selectors=['device.attributes.size() == 0 '
                                         '&& true'])]), 'n'))
        # p0 taken: w no longer fits, p1 does
        result = alloc.allocate(da.claim('d', [any_request(count=1)]), 'n')
        self.assertEqual('p1', result['devices']['results'][0]['device'])
        self.assertIsNone(alloc.allocate(da.claim('e', [any_request()]),
                                         'n'))

    def test_backtracking_finds_the_combination(self):
        # two requests that must differ by attribute; first fit of request
        # one would block request two without backtracking
        objs = pool([dev('a', attributes={'k': {'string': 'x'}}),
                     dev('b', attributes={'k': {'string': 'x'}}),
                     dev('c', attributes={'k': {'string': 'y'}})])
        claim = da.claim('c', [any_request('one'), any_request('two')],
                         constraints=[{'requests': ['one', 'two'],
                                       'matchAttribute': DRIVER + '/k'}])
        result = da.Allocator(objs, ANY).allocate(claim, 'n')
        self.assertEqual(['a', 'b'], [r['device'] for r in
                                      result['devices']['results']])
        claim = da.claim('c', [any_request('one'), any_request('two')],
                         constraints=[{'distinctAttribute': DRIVER + '/k'}])
        result = da.Allocator(objs, ANY).allocate(claim, 'n')
        self.assertEqual(['a', 'c'], [r['device'] for r in
                                      result['devices']['results']])

    def shared(self, policy=True):
        cap = {'value': '100'}
        mem = {'value': '10Gi'}
        if policy:
            cap['requestPolicy'] = {'default': '10', 'validRange': {
                'min': '4', 'max': '100', 'step': '4'}}
            mem['requestPolicy'] = {'default': '1Gi',
                                    'validValues': ['1Gi', '4Gi', '10Gi']}
        return pool([dev('s', allowMultipleAllocations=True,
                         capacity={'cu': cap, 'memory': mem})])

    def test_consumable_capacity_rounds_up(self):
        alloc = da.Allocator(self.shared(), ANY)
        result = alloc.allocate(da.claim('c', [any_request(
            capacity={'cu': '5', 'memory': '2Gi'})]), 'n')
        (res,) = result['devices']['results']
        self.assertEqual({'cu': '8', 'memory': '4Gi'},
                         res['consumedCapacity'])
        self.assertTrue(res['shareID'])
        # omitted: policy default; below min: rounded to min
        result = alloc.allocate(da.claim('d', [any_request(
            capacity={'cu': '1'})]), 'n')
        self.assertEqual({'cu': '4', 'memory': '1Gi'},
                         result['devices']['results'][0]['consumedCapacity'])
        # beyond every valid value
        self.assertIsNone(alloc.allocate(da.claim('e', [any_request(
            capacity={'memory': '11Gi'})]), 'n'))
        # the sum would pass the value: 4Gi + 1Gi + 10Gi > 10Gi
        self.assertIsNone(alloc.allocate(da.claim('f', [any_request(
            capacity={'memory': '10Gi'})]), 'n'))

    def test_without_policy_omitted_capacity_takes_everything(self):
        alloc = da.Allocator(self.shared(policy=False), ANY)
        result = alloc.allocate(da.claim('c', [any_request(
            capacity={'cu': '30'})]), 'n')
        self.assertEqual({'cu': '30', 'memory': '10Gi'},
                         result['devices']['results'][0]['consumedCapacity'])
        self.assertIsNone(alloc.allocate(da.claim('d', [any_request(
            capacity={'cu': '1'})]), 'n'))

    def test_distinct_attribute_keeps_requests_off_one_shared_device(self):
        objs = self.shared()
        claim = da.claim('c', [any_request('a'), any_request('b')],
                         constraints=[{'distinctAttribute':
                                       DRIVER + '/pciAddress'}])
        alloc = da.Allocator(objs, ANY)
        # the device has no such attribute: no solution at all
        self.assertIsNone(alloc.allocate(claim, 'n'))
        objs[0]['spec']['devices'][0]['attributes'] = {
            'pciAddress': {'string': '0000:05:00.0'}}
        self.assertIsNone(da.Allocator(objs, ANY).allocate(claim, 'n'))
        two = copy.deepcopy(objs[0]['spec']['devices'][0])
        two['name'] = 't'
        two['attributes']['pciAddress'] = {'string': '0000:25:00.0'}
        objs[0]['spec']['devices'].append(two)
        result = da.Allocator(objs, ANY).allocate(claim, 'n')
        self.assertEqual(['s', 't'], [r['device'] for r in
                                      result['devices']['results']])

    def test_capacity_request_filters_exclusive_devices(self):
        objs = pool([dev('small', capacity={'memory': {'value': '24Gi'}}),
                     dev('big', capacity={'memory': {'value': '192Gi'}})])
        result = da.Allocator(objs, ANY).allocate(da.claim('c', [
            any_request(capacity={'memory': '48Gi'})]), 'n')
        self.assertEqual('big', result['devices']['results'][0]['device'])
        self.assertNotIn('consumedCapacity', result['devices']['results'][0])

    def test_first_available_and_cel_quantities(self):
        objs = pool([dev('small', capacity={'memory': {'value': '24Gi'}})])
        claim = da.claim('c', [{'name': 'g', 'firstAvailable': [
            {'name': 'big', 'deviceClassName': 'any', 'selectors': [
                {'cel': {'expression':
                         'device.capacity["%s"].memory.compareTo('
                         'quantity("48Gi")) >= 0' % DRIVER}}]},
            {'name': 'any', 'deviceClassName': 'any'}]}])
        result = da.Allocator(objs, ANY).allocate(claim, 'n')
        self.assertEqual('g/any', result['devices']['results'][0]['request'])

    def test_allocation_mode_all_and_release(self):
        alloc = da.Allocator(pool([dev('a'), dev('b')]), ANY)
        claim = da.claim('c', [{'name': 'r', 'exactly': {
            'deviceClassName': 'any', 'allocationMode': 'All'}}])
        result = alloc.allocate(claim, 'n')
        self.assertEqual(2, len(result['devices']['results']))
        self.assertIsNone(alloc.allocate(da.claim('d', [any_request()]),
                                         'n'))
        alloc.release(result)
        self.assertIsNotNone(alloc.allocate(da.claim('d', [any_request()]),
                                            'n'))

    def test_earlier_claims_count(self):
        objs = pool([dev('a')])
        first = da.claim('c', [any_request()])
        first['status'] = {'allocation': da.Allocator(objs, ANY).allocate(
            first, 'n')}
        self.assertIsNone(da.Allocator(objs, ANY, [first]).allocate(
            da.claim('d', [any_request()]), 'n'))

    def test_parse_quantity(self):
        self.assertEqual(Decimal(48 << 30), da.parse_quantity('48Gi'))
        self.assertEqual(Decimal('0.5'), da.parse_quantity('500m'))
        self.assertEqual('48Gi', da.format_quantity(Decimal(48 << 30),
                                                    binary=True))
        self.assertEqual('76', da.format_quantity(Decimal(76)))
        self.assertEqual('1500m', da.format_quantity(Decimal('1.5')))

    def test_at_most_32_devices_per_claim(self):
        many = pool([dev('d%02d' % n) for n in range(40)])
        alloc = da.Allocator(many, ANY)
        self.assertIsNone(alloc.allocate(da.claim('c', [any_request(
            count=33)]), 'n'))
        # over all requests of the claim
        self.assertIsNone(alloc.allocate(da.claim('c', [
            any_request('a', count=16), any_request('b', count=17)]), 'n'))
        all_of = {'name': 'r', 'exactly': {'deviceClassName': 'any',
                                           'allocationMode': 'All'}}
        self.assertIsNone(alloc.allocate(da.claim('c', [all_of]), 'n'))
        self.assertEqual(32, len(alloc.allocate(da.claim('c', [any_request(
            count=32)]), 'n')['devices']['results']))
        # All over 8 devices is fine
        alloc = da.Allocator(pool([dev('d%d' % n) for n in range(8)]), ANY)
        self.assertEqual(8, len(alloc.allocate(da.claim(
            'c', [all_of]), 'n')['devices']['results']))

    def test_the_schedulers_gates(self):
        counters = [{'name': 'g', 'counters': {'xcds': {'value': '2'}}}]
        use = [{'counterSet': 'g', 'counters': {'xcds': {'value': '1'}}}]
        objs = pool([dev('p', consumesCounters=use),
                     dev('s', allowMultipleAllocations=True),
                     dev('w')], counters)
        alloc = da.Allocator(objs, ANY, features=())
        # a device that uses a feature the scheduler has not is skipped
        self.assertEqual(['w'], [c.device['name'] for c in alloc.candidates])
        alloc = da.Allocator(objs, ANY, features={da.PARTITIONABLE})
        self.assertEqual(['p', 'w'], [c.device['name']
                                      for c in alloc.candidates])


def partition_claim(name):
    return da.claim(name, [da.request('p', 'partition.' + DRIVER)])


class TestAcceptance(testtools.TestCase):
    """The issue's floor, on the driver's own slices."""

    def allocator(self, inv, ledger=None):
        plan = devices.plan('node-1', inv,
                            ledger.for_host('node-1') if ledger else None)
        return da.Allocator(slices.build(plan, DRIVER), CLASSES)

    def test_all_partitions_of_a_full_cpx_node_is_beyond_the_limit(self):
        # 64 partitions: more than the 32 devices a claim may have
        alloc = self.allocator(helpers.full_cpx_host())
        self.assertIsNone(alloc.allocate(da.claim('c', [{
            'name': 'p', 'exactly': {'deviceClassName': 'partition.' +
                                     DRIVER, 'allocationMode': 'All'}}]),
            'node-1'))

    def fill(self, alloc, make):
        n = 0
        while alloc.allocate(make('c%d' % n), 'node-1') is not None:
            n += 1
        return n

    def test_64_partition_claims_fit_and_a_65th_does_not(self):
        alloc = self.allocator(helpers.full_cpx_host())
        self.assertEqual(64, self.fill(alloc, partition_claim))

    def test_simulated_cpx_host_shows_63_partitions(self):
        # the realistic simulated host loses one partition to the DRM
        # minor limit, so 63 fit there
        alloc = self.allocator(helpers.host('mi300x-cpx-nps4'))
        self.assertEqual(63, self.fill(alloc, partition_claim))

    def test_whole_gpu_excludes_its_partitions(self):
        inv = helpers.full_cpx_host()
        alloc = self.allocator(inv)
        whole = alloc.allocate(da.claim('w', [da.request('g', DRIVER)]),
                               'node-1')
        (res,) = whole['devices']['results']
        # whole GPUs come from the far end of the PCI order
        self.assertEqual(devices.gpu_label(inv.gpus[-1].address),
                         res['device'])
        self.assertEqual(56, self.fill(alloc, partition_claim))
        # and with one partition taken, its GPU is no longer whole
        alloc = self.allocator(inv)
        alloc.allocate(partition_claim('p'), 'node-1')
        got = 0
        while alloc.allocate(da.claim('w%d' % got, [da.request(
                'g', DRIVER)]), 'node-1'):
            got += 1
        self.assertEqual(7, got)

    def test_four_76_cu_48_gib_shares_fit_one_spx_gpu(self):
        inv = helpers.host('mi300x-spx')
        ledger = helpers.roles(inv, 'node-1', Role.K8S_SHARED)
        alloc = self.allocator(inv, ledger)

        def share(name):
            return da.claim(name, [da.request(
                's', 'share.' + DRIVER,
                capacity={'computeUnits': '76', 'memory': '48Gi'})])

        self.assertEqual(4, self.fill(alloc, share))

    def test_shares_pack_onto_the_first_gpu(self):
        inv = helpers.host('mi300x-spx')
        ledger = helpers.roles(inv, 'node-1', Role.K8S_SHARED,
                               Role.K8S_SHARED)
        alloc = self.allocator(inv, ledger)
        used = []
        for i in range(5):
            result = alloc.allocate(da.claim('s%d' % i, [da.request(
                's', 'share.' + DRIVER, capacity={
                    'computeUnits': '100', 'memory': '8Gi'})]), 'node-1')
            used.append(result['devices']['results'][0]['device'])
        first = devices.gpu_label(inv.gpus[0].address) + '-share'
        self.assertEqual([first] * 3, used[:3])
        self.assertNotEqual(first, used[3])


#: (label, release, partitions_without_counters)
LAYOUTS = (('1.34', (1, 34), devices.WHOLE),
           ('1.34-partitions', (1, 34), devices.PARTITIONS),
           ('1.35', (1, 35), devices.WHOLE),
           ('1.35-partitions', (1, 35), devices.PARTITIONS),
           ('1.36', (1, 36), devices.WHOLE))
_SLICES: dict[str, tuple] = {}


def features(release):
    """The scheduler's DRA gates that are on by default in ``release``."""
    return {gate for gate, on in served.gate_defaults(release).items()
            if on}


def _host_slices(label='1.36'):
    if label not in _SLICES:
        _name, release, without = next(x for x in LAYOUTS
                                       if x[0] == label)
        inv = helpers.host('mi300x-mixed-nps4')
        ledger = helpers.roles(inv, 'n', Role.K8S_DEDICATED,
                               Role.K8S_DEDICATED, Role.NOVA_VF,
                               Role.NOVA_VF, Role.IDLE, Role.K8S_SHARED,
                               Role.K8S_SHARED, Role.K8S_SHARED)
        kept = served.for_release(release)
        plan = devices.plan('n', inv, ledger.for_host('n'), served=kept,
                            without_counters=without)
        _SLICES[label] = (inv, slices.build(plan, DRIVER,
                                            layout=kept.layout), plan,
                          features(release))
    return _SLICES[label]


_CLAIM = st.one_of(
    st.tuples(st.just('gpu'), st.just(0), st.just(0)),
    st.tuples(st.just('partition'), st.just(0), st.just(0)),
    st.tuples(st.just('share'), st.integers(1, 80),
              st.integers(1, 60 * 1024)))


class TestNeverOvercommits(testtools.TestCase):

    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(_CLAIM, st.booleans()), min_size=1,
                    max_size=40), st.sampled_from([x[0] for x in LAYOUTS]))
    def test_random_claim_sequences(self, steps, layout):
        inv, objs, plan, gates = _host_slices(layout)
        units = unit_devices.units_from_inventory(inv)
        alloc = da.Allocator(objs, CLASSES, features=gates)
        live = []
        prepared = {}
        for n, ((kind, cus, mib), release) in enumerate(steps):
            name = DRIVER if kind == 'gpu' else '%s.%s' % (kind, DRIVER)
            capacity = None
            if kind == 'share':
                capacity = {'computeUnits': str(cus),
                            'memory': '%dMi' % mib}
            result = alloc.allocate(da.claim('c%d' % n, [da.request(
                'r', name, capacity=capacity)]), 'n')
            if result is not None:
                live.append(result)
                uid = 'uid-%d' % n
                obj = {'metadata': {'namespace': 'default',
                                    'name': 'c%d' % n, 'uid': uid},
                       'status': {'allocation': result}}
                # what the scheduler granted, the plugin can prepare
                prepared[uid] = dra_prepare.prepare(
                    uid, 'default', 'c%d' % n,
                    dra_claims.results(obj, uid, DRIVER, plan), units,
                    prepared)
                result['uid'] = uid
            if release and live:
                gone = live.pop(0)
                alloc.release(gone)
                del prepared[gone['uid']]
            self.check(objs, live)
            self.check_masks(prepared)

    def check_masks(self, prepared):
        held = {}
        for claim in prepared.values():
            for device in claim.devices:
                for part in device.partitions:
                    key = (device.gpu, part)
                    mask = dict(device.masks).get(part, -1)
                    other = held.get(key, 0)
                    self.assertFalse(other == -1 or (mask == -1 and other)
                                     or (other & mask), key)
                    held[key] = -1 if mask == -1 else other | mask

    def check(self, objs, live):
        by_name = {d['name']: d for s in objs
                   for d in s['spec'].get('devices', [])}
        totals = {cs['name']: {k: da.parse_quantity(v['value'])
                               for k, v in cs['counters'].items()}
                  for s in objs for cs in s['spec'].get('sharedCounters',
                                                        [])}
        used_counters = {}
        exclusive = set()
        shares = {}
        for allocation in live:
            for res in allocation['devices']['results']:
                device = by_name[res['device']]
                if device.get('allowMultipleAllocations'):
                    shares.setdefault(res['device'], []).append(
                        res['consumedCapacity'])
                    continue
                self.assertNotIn(res['device'], exclusive)
                exclusive.add(res['device'])
                for consumed in device.get('consumesCounters', []):
                    used = used_counters.setdefault(consumed['counterSet'],
                                                    {})
                    for k, v in consumed['counters'].items():
                        used[k] = used.get(k, 0) + da.parse_quantity(
                            v['value'])
        for name, used in used_counters.items():
            for k, v in used.items():
                self.assertLessEqual(v, totals[name][k], (name, k))
        for name, taken in shares.items():
            device = by_name[name]
            for cap, spec in device['capacity'].items():
                total = sum(da.parse_quantity(t[cap]) for t in taken)
                self.assertLessEqual(total, da.parse_quantity(spec['value']))
        # a GPU is never given whole and as partitions at once
        kinds = {}
        for name in exclusive:
            attrs = by_name[name]['attributes']
            kinds.setdefault(attrs['pciAddress']['string'], set()).add(
                attrs['type']['string'])
        for gpu, held in kinds.items():
            self.assertNotEqual({'gpu', 'partition'}, held, gpu)


class TestPerRelease(testtools.TestCase):
    """Each release's layout (its default gates), allocated by a
    scheduler with those gates, and prepared: whole GPUs everywhere,
    partitions and shares where the release keeps what they need."""

    def allocate_and_prepare(self, label, device_class, capacity=None,
                             count=1, constraints=()):
        inv, objs, plan, gates = _host_slices(label)
        alloc = da.Allocator(objs, CLASSES, features=gates)
        result = alloc.allocate(da.claim('c', [da.request(
            'r', device_class, count=count, capacity=capacity)],
            constraints=constraints), 'n')
        if result is None:
            return None
        obj = {'metadata': {'namespace': 'default', 'name': 'c',
                            'uid': 'uid-1'},
               'status': {'allocation': result}}
        return dra_prepare.prepare(
            'uid-1', 'default', 'c',
            dra_claims.results(obj, 'uid-1', DRIVER, plan),
            unit_devices.units_from_inventory(inv), {})

    def test_whole_gpus_on_every_release(self):
        for label, _release, without in LAYOUTS:
            got = self.allocate_and_prepare(label, DRIVER)
            if without == devices.PARTITIONS:
                # every partitioned GPU is offered as its partitions
                self.assertIsNone(got, label)
                continue
            (device,) = got.devices
            # the whole of a partitioned GPU: every partition of it
            inv = _host_slices(label)[0]
            gpu = next(g for g in inv.gpus if str(g.address) == device.gpu)
            self.assertEqual(len(gpu.partitions), len(device.partitions),
                             label)
            self.assertGreater(len(device.partitions), 1)

    def test_a_whole_gpu_as_all_its_partitions(self):
        for label in ('1.34-partitions', '1.35-partitions'):
            got = self.allocate_and_prepare(
                label, 'partition.' + DRIVER, count=8, constraints=[{
                    'matchAttribute': DRIVER + '/pciAddress'}])
            self.assertEqual(1, len({d.gpu for d in got.devices}), label)
            self.assertEqual(list(range(8)), sorted(
                d.partitions[0] for d in got.devices))

    def test_partitions(self):
        for label, release, without in LAYOUTS:
            got = self.allocate_and_prepare(label, 'partition.' + DRIVER)
            if release < (1, 36) and without == devices.WHOLE:
                self.assertIsNone(got, label)
            else:
                self.assertEqual(1, len(got.devices[0].partitions), label)

    def test_no_gpu_is_given_whole_and_in_parts(self):
        for label, _release, _without in LAYOUTS:
            _inv, objs, _plan, gates = _host_slices(label)
            alloc = da.Allocator(objs, CLASSES, features=gates)
            given = []
            for device_class in (DRIVER, 'partition.' + DRIVER):
                while True:
                    result = alloc.allocate(da.claim('c%d' % len(given), [
                        da.request('r', device_class)]), 'n')
                    if result is None:
                        break
                    given.extend(result['devices']['results'])
            by_name = {d['name']: d for o in objs
                       for d in o['spec'].get('devices', [])}
            kinds = {}
            for res in given:
                attrs = by_name[res['device']]['attributes']
                kinds.setdefault(attrs['pciAddress']['string'], set()).add(
                    attrs['type']['string'])
            self.assertTrue(kinds, label)
            for gpu, held in kinds.items():
                self.assertEqual(1, len(held), (label, gpu, held))

    def test_shares(self):
        for label, release, _without in LAYOUTS:
            got = self.allocate_and_prepare(
                label, 'share.' + DRIVER,
                capacity={'computeUnits': '8', 'memory': '1Gi'})
            if release < (1, 36):
                self.assertIsNone(got, label)
            else:
                self.assertEqual(8, got.devices[0].compute_units)
