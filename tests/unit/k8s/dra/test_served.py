"""What each release's API server keeps, and the layout published there.

For every release (with its default feature gates, and with the gates
turned on) and every kind of host, the slices the driver publishes are
validated strictly against that release's schema (kubernetes-validate),
checked against its ResourceSlice rules, hold no field the release would
drop, write every quantity canonically, and never offer a GPU whole and
as partitions without the counters that keep the two apart.
"""

from __future__ import annotations

import json

import kubernetes_validate
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.k8s.dra import devices
from amdgpu_virt.k8s.dra import served
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.k8s.dra.served import Layout
from amdgpu_virt.model import Role
from tests.unit.k8s.dra import helpers
from tests.unit.k8s.dra import test_layout

DRIVER = helpers.DRIVER
ALL_ON = {served.PARTITIONABLE: True, served.CONSUMABLE: True}
#: (release, gates) -> schema version
CASES = (((1, 34), {}), ((1, 34), ALL_ON), ((1, 35), {}), ((1, 35), ALL_ON),
         ((1, 36), {}), ((1, 37), {}))
KINDS = ('mi300x-spx', 'mi300x-cpx-nps4', 'mi300x-mixed-nps4',
         'mi355x-cpx-nps2', 'mi300a-tpx', 'mi210-spx')
GATED = {'sharedCounters', 'consumesCounters', 'allowMultipleAllocations',
         'requestPolicy'}


class TestReleases(testtools.TestCase):

    def test_defaults_of_each_release(self):
        for version, counters, layout in (
                ((1, 34), False, Layout.MIXED),
                ((1, 35), False, Layout.SEPARATE),
                ((1, 36), True, Layout.SEPARATE),
                ((1, 40), True, Layout.SEPARATE)):
            kept = served.for_release(version)
            self.assertEqual(served.Served(counters, counters, layout), kept)
        self.assertEqual(served.Served(True, False, Layout.MIXED),
                         served.for_release((1, 34), {
                             served.PARTITIONABLE: True}))
        self.assertEqual(served.Served(False, True, Layout.MIXED),
                         served.for_release((1, 36), {
                             served.PARTITIONABLE: False},
                             layout=Layout.MIXED))

    def test_parse_release_and_gates(self):
        for text in ('1.34', 'v1.34', '1.34.2', ' 1.34 '):
            self.assertEqual((1, 34), served.parse_release(text))
        for bad in ('1', 'x.y', '1.34.2.1', ''):
            err = self.assertRaises(exception.UsageError,
                                    served.parse_release, bad)
            self.assertIn('--release', str(err))
        self.assertEqual({served.PARTITIONABLE: True,
                          served.CONSUMABLE: False}, served.parse_gates(
            'DRAPartitionableDevices=true, DRAConsumableCapacity=False'))
        self.assertEqual({}, served.parse_gates(''))
        for bad in ('DRAPartitionableDevices', 'Other=true',
                    'DRAConsumableCapacity=yes'):
            err = self.assertRaises(exception.UsageError,
                                    served.parse_gates, bad)
            self.assertIn('--feature-gates', str(err))

    def test_describe(self):
        self.assertEqual('shared counters, consumable capacity (separate '
                         'layout)', served.FULL.describe())
        self.assertEqual('no gated field',
                         served.for_release((1, 35)).describe())


class TestProbe(testtools.TestCase):

    def test_the_probe_is_valid_for_each_release(self):
        for version, gates in CASES:
            kept = served.for_release(version, gates)
            body = served.probe_slice('n', DRIVER, kept.layout, 'n-gpu')
            body['metadata']['name'] = 'n-gpu-probe-x'
            kubernetes_validate.validate(body, '1.%d.0' % version[1],
                                         strict=True)
            spec = body['spec']
            if kept.layout is Layout.SEPARATE:
                self.assertNotIn('sharedCounters', spec)
            else:
                test_layout.check_1_34_limits(self, body)

    def test_what_an_answer_says(self):
        for layout in Layout:
            sent = served.probe_slice('n', DRIVER, layout, 'p')
            self.assertEqual(served.Served(True, True, layout),
                             served.kept(sent, layout))
            lost = json.loads(json.dumps(sent))
            device = lost['spec']['devices'][0]
            del device['consumesCounters']
            self.assertEqual(served.Served(False, True, layout),
                             served.kept(lost, layout))
            self.assertEqual({served.PARTITIONABLE},
                             served.dropped(sent, lost))
            del device['capacity']['memory']['requestPolicy']
            self.assertEqual(served.Served(False, False, layout),
                             served.kept(lost, layout))
            self.assertEqual({served.PARTITIONABLE, served.CONSUMABLE},
                             served.dropped(sent, lost))
        # counters without their counter set mean nothing in 1.34
        sent = served.probe_slice('n', DRIVER, Layout.MIXED, 'p')
        del sent['spec']['sharedCounters']
        self.assertFalse(served.kept(sent, Layout.MIXED).counters)
        for garbage in ({}, {'spec': []}, {'spec': {'devices': 'x'}},
                        {'spec': {'devices': [5]}}):
            self.assertEqual(served.Served(False, False, Layout.SEPARATE),
                             served.kept(garbage, Layout.SEPARATE))

    def test_without(self):
        self.assertEqual(served.Served(False, True),
                         served.without(served.FULL,
                                        {served.PARTITIONABLE}))


def _keys(obj, found=None):
    found = set() if found is None else found
    if isinstance(obj, dict):
        found.update(obj)
        for value in obj.values():
            _keys(value, found)
    elif isinstance(obj, list):
        for value in obj:
            _keys(value, found)
    return found


def _quantities(obj):
    found = []
    quantity.map_fields(obj, quantity.SLICE_PATHS,
                        lambda text: found.append(text) or text)
    return found


class TestLayoutPerRelease(testtools.TestCase):

    def plans(self, kept):
        for kind in KINDS:
            inv = helpers.host(kind)
            n = len(inv.gpus)
            ledgers = [[Role.K8S_DEDICATED] * n, [Role.K8S_SHARED] * n,
                       [Role.K8S_DEDICATED, Role.K8S_SHARED] * (n // 2) +
                       [Role.K8S_DEDICATED] * (n % 2)]
            for roles in ledgers:
                ledger = helpers.roles(inv, 'n', *roles)
                for without in devices.WITHOUT_COUNTERS:
                    yield kind, inv, devices.plan(
                        'n', inv, ledger.for_host('n'), served=kept,
                        without_counters=without)

    def test_every_release_and_host(self):
        for version, gates in CASES:
            kept = served.for_release(version, gates)
            schema = '1.%d.0' % version[1]
            for kind, inv, plan in self.plans(kept):
                where = (version, gates, kind)
                objs = slices.build(plan, DRIVER, layout=kept.layout)
                for obj in objs:
                    kubernetes_validate.validate(obj, schema, strict=True)
                    spec = obj['spec']
                    if kept.layout is Layout.MIXED:
                        test_layout.check_1_34_limits(self, obj)
                    else:
                        self.assertFalse(spec.get('devices') and
                                         spec.get('sharedCounters'), where)
                        limit = 64 if any(d.get('consumesCounters') for d
                                          in spec.get('devices', [])) \
                            else 128
                        self.assertLessEqual(len(spec.get('devices', [])),
                                             limit)
                    for text in _quantities(obj):
                        self.assertEqual(text, quantity.canonical(text))
                        self.assertEqual(text, quantity.served(text))
                keys = _keys(objs)
                if not kept.counters:
                    self.assertFalse(keys & {'sharedCounters',
                                             'consumesCounters'}, where)
                if not kept.consumable:
                    self.assertFalse(keys & {'allowMultipleAllocations',
                                             'requestPolicy'}, where)
                self.check_offer(plan, kept, inv, where)

    def check_offer(self, plan, kept, inv, where):
        by_gpu = {}
        for device in plan.devices:
            by_gpu.setdefault(str(device.gpu.address), set()).add(
                device.type.value)
        for gpu, kinds in by_gpu.items():
            if not kept.counters:
                # a GPU is offered whole or as partitions, never both
                self.assertNotEqual({'gpu', 'partition'}, kinds & {
                    'gpu', 'partition'}, (where, gpu))
            if not kept.consumable:
                self.assertNotIn('share', kinds, (where, gpu))
        # whole GPUs of k8s-dedicated GPUs that cannot be partitioned are
        # always offered
        for gpu in inv.gpus:
            kinds = by_gpu.get(str(gpu.address), {'share'})
            if len(gpu.partitions) == 1 and 'share' not in kinds:
                self.assertEqual({'gpu'}, kinds, where)


class TestWithheld(testtools.TestCase):

    def test_what_each_gpu_holds_back(self):
        inv = helpers.host('mi300x-mixed-nps4')
        ledger = helpers.roles(inv, 'n', Role.K8S_DEDICATED,
                               Role.K8S_SHARED).for_host('n')
        cpx, qpx = (str(g.address) for g in inv.gpus[:2])
        plan = devices.plan('n', inv, ledger,
                            served=served.for_release((1, 34)))
        self.assertEqual([(cpx, 'partitions', served.PARTITIONABLE),
                          (qpx, 'shares', served.CONSUMABLE)],
                         [(w.gpu, w.what, w.gate) for w in plan.withheld])
        self.assertEqual([devices.gpu_label(inv.gpus[0].address)],
                         [d.name for d in plan.devices])
        self.assertIn('does not keep the fields of DRAPartitionableDevices',
                      str(plan.withheld[0]))
        plan = devices.plan('n', inv, ledger,
                            served=served.for_release((1, 34)),
                            without_counters=devices.PARTITIONS)
        self.assertEqual('whole GPU', plan.withheld[0].what)
        self.assertEqual(8, len(plan.devices))
        self.assertEqual((), plan.counter_sets)
        self.assertEqual((), devices.plan('n', inv, ledger).withheld)
