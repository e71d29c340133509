"""HAMi protocol codecs; every example of the protocol notes is a vector."""

from __future__ import annotations

import datetime

import testtools

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing.hami import pods as hami_pods

MI300X_VF = (
    '{"id":"8eff74b5-0000-1000-801b-b56457addd1b","index":0,"count":10,'
    '"devmem":196288,"devcore":304,"type":"AMD Instinct MI300X VF",'
    '"numa":0,"health":true,"devicevendor":"amd",'
    '"custominfo":{"pciBDF":"0000:83:00.0"}}')
P4_SHORT = ('GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,10,7680,100,'
            'NVIDIA-Tesla P4,0,true:')
P4_LONG = P4_SHORT[:-1] + ',1,hami-core:'


class PercentTest(testtools.TestCase):

    def test_mi300x_table(self):
        for percent, cus in ((1, 3), (25, 76), (33, 100), (50, 152),
                             (67, 203), (100, 304)):
            self.assertEqual(cus, hami.percent_to_cus(percent, 304),
                             percent)

    def test_clamped_to_one(self):
        self.assertEqual(1, hami.percent_to_cus(1, 80))

    def test_rounded_to_units(self):
        self.assertEqual(4, hami.percent_to_cus(10, 30, unit=2))  # 3 -> 4
        self.assertEqual(30, hami.percent_to_cus(100, 30, unit=4))

    def test_out_of_range(self):
        for bad in (0, 101, -5, True, 50.5):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.percent_to_cus, bad, 304)
            self.assertIn('amd.com/gpucores', str(err))


class JsonRegistrationTest(testtools.TestCase):

    def test_hami_plugin_example(self):
        (device, ) = hami.decode_node_register('[%s]' % MI300X_VF)
        self.assertEqual(hami.DeviceInfo(
            id='8eff74b5-0000-1000-801b-b56457addd1b', index=0, count=10,
            devmem=196288, devcore=304, type='AMD Instinct MI300X VF',
            numa=0, health=True, devicevendor='amd',
            custominfo={'pciBDF': '0000:83:00.0'}), device)
        self.assertEqual(1, device.cu_unit)

    def test_encode_leaves_zero_fields_out(self):
        devices = hami.decode_node_register('[%s]' % MI300X_VF)
        encoded = hami.encode_node_register(devices)
        self.assertEqual(
            '[{"id":"8eff74b5-0000-1000-801b-b56457addd1b","count":10,'
            '"devmem":196288,"devcore":304,"type":"AMD Instinct MI300X VF",'
            '"health":true,"devicevendor":"amd",'
            '"custominfo":{"pciBDF":"0000:83:00.0"}}]', encoded)
        self.assertEqual(devices, hami.decode_node_register(encoded))

    def test_absent_fields_are_zero(self):
        (device, ) = hami.decode_node_register(
            '[{ "count": 10, "devmem": 196608, "devcore": 304, '
            '"type": "AMD_Instinct_MI300X_VF" }]')
        self.assertEqual(hami.DeviceInfo(count=10, devmem=196608,
                                         devcore=304,
                                         type='AMD_Instinct_MI300X_VF'),
                         device)

    def test_field_order_mode_and_escapes(self):
        device = hami.DeviceInfo(id='a<b', index=2, count=1, numa=1,
                                 mode='hami-core', type='AMD & co',
                                 custominfo={'z': 1, 'a': {'y': 2, 'b': 3}})
        self.assertEqual(
            '[{"id":"a\\u003cb","index":2,"count":1,"type":"AMD \\u0026 co",'
            '"numa":1,"mode":"hami-core",'
            '"custominfo":{"a":{"b":3,"y":2},"z":1}}]',
            hami.encode_node_register([device]))

    def test_go_decoding_rules(self):
        (device, ) = hami.decode_node_register(
            '[{"ID":"x","Health":true,"numa":null,"migtemplate":[[]],'
            '"custominfo":{"cuPerWGP":2}}]')
        self.assertEqual('x', device.id)
        self.assertTrue(device.health)
        self.assertEqual(2, device.cu_unit)
        for odd in ('1e400', '2.5', '"2"', 'true', '-2'):
            (device, ) = hami.decode_node_register(
                '[{"custominfo":{"cuPerWGP":%s}}]' % odd)
            self.assertEqual(1, device.cu_unit, odd)
        self.assertEqual((), hami.decode_node_register('null'))
        self.assertEqual((), hami.decode_node_register('[]'))

    def test_errors_name_key_and_field(self):
        for value, fragment in (
                ('[', 'not JSON'),
                ('{"id":"x"}', 'expected a JSON array'),
                ('[1]', 'device 0: expected an object'),
                ('[null]', 'device 0 is null'),
                ('[{"devmem":1.5}]', 'field devmem'),
                ('[{"devcore":"304"}]', 'field devcore'),
                ('[{"count":true}]', 'field count'),
                ('[{"index":-1}]', 'field index'),
                ('[{"devmem":4294967296}]', 'field devmem'),
                ('[{"health":"true"}]', 'field health'),
                ('[{"id":7}]', 'field id'),
                ('[{"custominfo":[1]}]', 'field custominfo'),
                ('[NaN]', 'not JSON')):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_node_register, value)
            self.assertIn(hami.NODE_REGISTER, str(err))
            self.assertIn(fragment, str(err))
            self.assertIn(repr(value), str(err))


class LegacyRegistrationTest(testtools.TestCase):

    def test_seven_fields(self):
        (device, ) = hami.decode_node_register(P4_SHORT)
        self.assertEqual(hami.DeviceInfo(
            id='GPU-ebe7c3f7-303d-558d-435e-99a160631fe4', count=10,
            devmem=7680, devcore=100, type='NVIDIA-Tesla P4', numa=0,
            health=True, index=0, mode='hami-core'), device)
        self.assertEqual(P4_SHORT,
                         hami.encode_node_devices_legacy([device],
                                                         short=True))
        self.assertEqual(P4_SHORT[:-1] + ',0,hami-core:',
                         hami.encode_node_devices_legacy([device]))

    def test_nine_fields(self):
        (device, ) = hami.decode_node_devices_legacy(P4_LONG)
        self.assertEqual((1, 'hami-core'), (device.index, device.mode))
        self.assertEqual(P4_LONG, hami.encode_node_devices_legacy([device]))
        self.assertRaises(exception.HamiProtocolError,
                          hami.encode_node_devices_legacy, [device],
                          short=True)

    def test_two_devices_and_empty(self):
        value = P4_LONG + P4_SHORT.replace('GPU-e', 'GPU-f')
        devices = hami.decode_node_devices_legacy(value)
        self.assertEqual(2, len(devices))
        self.assertEqual((), hami.decode_node_devices_legacy(':'))
        self.assertEqual((), hami.decode_node_devices_legacy('::'))
        self.assertEqual((), hami.decode_node_register(':'))

    def test_errors(self):
        for value, fragment in (('', 'missing the ":"'),
                                (',', 'missing the ":"'),
                                ('a', 'missing the ":"'),
                                (',:', '2 fields'),
                                ('a:', 'missing the ","'),
                                ('a,x,1,1,T,0,true:', 'field count'),
                                ('a,1,1,1,T,0,yes:', 'field health'),
                                ('a,1,1,1,T,0,true,-1,m:', 'field index'),
                                ('a,1,99999999999,1,T,0,true:',
                                 'field devmem')):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_node_devices_legacy, value)
            self.assertIn(hami.NODE_REGISTER, str(err))
            self.assertIn(fragment, str(err))

    def test_go_booleans_and_signs(self):
        (device, ) = hami.decode_node_devices_legacy('a,+1,2,3,T,-1,F:')
        self.assertEqual((1, -1, False),
                         (device.count, device.numa, device.health))

    def test_encode_rejects_separators(self):
        self.assertRaises(exception.HamiProtocolError,
                          hami.encode_node_devices_legacy,
                          [hami.DeviceInfo(id='a', type='x,y')])


class PodDevicesTest(testtools.TestCase):

    VECTORS = (
        'test1,AMD,100,3:test2,AMD,200,4:;',
        '8eff74b5-0000-1000-801b-b56457addd1b,AMD Instinct MI300X VF,'
        '49152,76:;',
        # dev1:;dev2:;;dev3:; with real devices
        'd1,AMD,1,1:;d2,AMD,2,2:;;d3,AMD,3,3:;',
        ';;',
    )

    def test_vectors_round_trip(self):
        for value in self.VECTORS:
            self.assertEqual(value, hami.encode_pod_devices(
                hami.decode_pod_devices(value)))

    def test_decoded(self):
        self.assertEqual(
            ((hami.ContainerDevice('test1', 'AMD', 100, 3),
              hami.ContainerDevice('test2', 'AMD', 200, 4)), ),
            hami.decode_pod_devices(self.VECTORS[0]))
        pod = hami.decode_pod_devices(self.VECTORS[2])
        self.assertEqual([1, 1, 0, 1], [len(c) for c in pod])
        self.assertEqual('d3', pod[3][0].uuid)

    def test_tolerated_forms(self):
        self.assertEqual((), hami.decode_pod_devices(''))
        self.assertEqual(hami.decode_pod_devices('a,AMD,1,2:;'),
                         hami.decode_pod_devices('a,AMD,1,2'))
        self.assertEqual(hami.decode_pod_devices('a,AMD,1,2:;'),
                         hami.decode_pod_devices('a,AMD,1,2,extra::;'))

    def test_errors(self):
        for value, fragment in (('dev1:;', 'missing the ","'),
                                ('a,b,1:;', '3 fields'),
                                (',AMD,1,1:;', 'empty UUID'),
                                ('a,,1,1:;', 'empty type'),
                                ('a,AMD,x,1:;', 'field memory'),
                                ('a,AMD,1,-1:;', 'field cores')):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_pod_devices, value,
                                    hami.DEVICES_TO_ALLOCATE)
            self.assertIn(hami.DEVICES_TO_ALLOCATE, str(err))
            self.assertIn(fragment, str(err))

    def test_counts_short_way_and_strict_way_agree(self):
        # plain ASCII digits take a short way; everything else the strict
        # parser: Go's Atoi answers (sign, leading zeros) and its errors
        for text, want in (('7', 7), ('007', 7), ('+7', 7),
                           ('2147483647', 2147483647),
                           ('000000000002147483647', 2147483647)):
            pod = hami.decode_pod_devices('a,AMD,%s,1:;' % text)
            self.assertEqual(want, pod[0][0].usedmem, text)
        for text in ('2147483648', '9' * 30, '\u0663', '1\u0663', ' 1',
                     '1.0', ''):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_pod_devices,
                                    'a,AMD,1,%s:;' % text)
            self.assertIn('field cores', str(err))

    def test_memoised_errors_raise_every_time(self):
        # the memo keeps results only: a bad value fails on every call,
        # naming the key it was read from each time
        for key in (hami.DEVICES_ALLOCATED, hami.DEVICES_TO_ALLOCATE,
                    hami.DEVICES_ALLOCATED):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_pod_devices, 'a,AMD,x,1:;',
                                    key)
            self.assertIn(key, str(err))
        # long values are decoded each time, with the same answer
        long_value = 'gpu-0,AMD,1,2:' * 100 + ';'
        self.assertGreater(len(long_value), hami_pods._MEMO_CHARS)
        self.assertEqual(hami.decode_pod_devices(long_value),
                         hami.decode_pod_devices(long_value))
        self.assertEqual(100, len(hami.decode_pod_devices(long_value)[0]))

    def test_encode_errors(self):
        for device in (hami.ContainerDevice('', 'AMD', 1, 1),
                       hami.ContainerDevice('a;b', 'AMD', 1, 1),
                       hami.ContainerDevice('a', 'AMD', -1, 1)):
            self.assertRaises(exception.HamiProtocolError,
                              hami.encode_pod_devices, [[device]])


class NodeLockTest(testtools.TestCase):

    def test_round_trip(self):
        for value in ('2026-11-30T14:41:12Z,default,train-0',
                      '2026-11-30T15:41:12+01:00,ns,pod',
                      '2026-11-30T09:11:12-05:30,ns,pod',
                      '2026-11-30T14:41:12Z'):
            self.assertEqual(value, hami.decode_node_lock(value).encode())

    def test_decoded_and_expiry(self):
        lock = hami.decode_node_lock('2026-11-30T15:41:12+01:00,ns,pod')
        utc = datetime.UTC
        self.assertEqual(datetime.datetime(2026, 11, 30, 14, 41, 12,
                                           tzinfo=utc), lock.time)
        self.assertTrue(lock.held_by('ns', 'pod'))
        self.assertFalse(lock.held_by('ns', 'other'))
        at = datetime.datetime(2026, 11, 30, 14, 46, 12, tzinfo=utc)
        self.assertFalse(lock.expired(at))
        self.assertTrue(lock.expired(at + datetime.timedelta(seconds=1)))
        self.assertTrue(lock.expired(at, datetime.timedelta(minutes=1)))
        bare = hami.decode_node_lock('2026-11-30T14:41:12Z')
        self.assertIsNone(bare.namespace)

    def test_canonical_forms(self):
        self.assertEqual(
            '2026-11-30T14:41:12Z,a,b',
            hami.decode_node_lock('2026-11-30T14:41:12.25+00:00,a,b')
            .encode())

    def test_errors(self):
        for value in ('', 'now', '2026-11-30T14:41:12Z,a',
                      '2026-11-30T14:41:12Z,a,b,c', '2026-11-30 14:41:12Z',
                      '2026-13-30T14:41:12Z', '2026-11-30T14:41:12',
                      '2026-11-30T14:41:12Z,,b', '2026-11-30t14:41:12z'):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_node_lock, value)
            self.assertIn(hami.NODE_LOCK, str(err))
            self.assertIn(repr(value), str(err))

    def test_encode_needs_zone_and_both_names(self):
        self.assertRaises(exception.HamiProtocolError, hami.encode_node_lock,
                          hami.NodeLock(datetime.datetime(2026, 1, 1)))
        when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        self.assertRaises(exception.HamiProtocolError, hami.encode_node_lock,
                          hami.NodeLock(when, 'ns', None))
        self.assertRaises(exception.HamiProtocolError, hami.encode_node_lock,
                          hami.NodeLock(when, 'ns', 'a,b'))


class PhaseAndTimeTest(testtools.TestCase):

    def test_bind_phase(self):
        for phase in ('allocating', 'success', 'failed'):
            self.assertEqual(phase, hami.decode_bind_phase(phase).value)
        err = self.assertRaises(exception.HamiProtocolError,
                                hami.decode_bind_phase, 'Success')
        self.assertIn(hami.BIND_PHASE, str(err))

    def test_unix_time(self):
        self.assertEqual(1764513672, hami.decode_unix_time('1764513672'))
        self.assertEqual('1764513672', hami.encode_unix_time(1764513672.9))
        for bad in ('', '-1', '1.5', '１２'):
            self.assertRaises(exception.HamiProtocolError,
                              hami.decode_unix_time, bad, hami.VGPU_TIME)

    def test_handshake(self):
        value = 'Requesting_2026-11-30 14:41:12'
        shake = hami.decode_handshake(value)
        self.assertEqual(hami.HandshakeState.REQUESTING, shake.state)
        self.assertEqual(value, shake.encode())
        for bad in ('Requesting', 'Asking_2026-11-30 14:41:12',
                    'Deleted_2026-11-30T14:41:12', 'Reported_2026-02-30 '
                    '14:41:12'):
            self.assertRaises(exception.HamiProtocolError,
                              hami.decode_handshake, bad)


class CuAllocatedTest(testtools.TestCase):

    def test_doc_example_round_trip(self):
        value = '{"gpu-0":"0-3,8"}'
        self.assertEqual({'gpu-0': 0b100001111},
                         hami.decode_cu_allocated(value))
        self.assertEqual(value, hami.encode_cu_allocated(
            hami.decode_cu_allocated(value)))

    def test_encode_sorted_and_from_ids(self):
        self.assertEqual('{"a":"4-5","b":"0-75"}', hami.encode_cu_allocated(
            {'b': (1 << 76) - 1, 'a': [5, 4]}))
        self.assertEqual('{}', hami.encode_cu_allocated({}))
        self.assertRaises(exception.SharingError, hami.encode_cu_allocated,
                          {'a': 0})

    def test_errors(self):
        for value, fragment in (('', 'not JSON'),
                                ('[]', 'expected a JSON object'),
                                ('{"a":"1","a":"2"}', 'listed twice'),
                                ('{"a":1}', 'expected an ID list'),
                                ('{"a":""}', 'empty CU list'),
                                ('{"a":"3-1"}', 'inverted'),
                                ('{"a":"1,1"}', 'repeated'),
                                ('{"":"1"}', 'empty GPU uuid')):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.decode_cu_allocated, value)
            self.assertIn(hami.CU_ALLOCATED, str(err))
            self.assertIn(fragment, str(err))


class RebuildTest(testtools.TestCase):

    def test_shapes_from_registration(self):
        devices = hami.decode_node_register(
            '[%s,{"id":"rdna","devcore":32,"custominfo":{"cuPerWGP":2}}]'
            % MI300X_VF)
        shapes = hami.gpu_shapes(devices)
        self.assertEqual({'8eff74b5-0000-1000-801b-b56457addd1b': (304, 1),
                          'rdna': (32, 2)}, shapes)
        allocators = hami.rebuild_allocators(shapes, [('p', '{"rdna":"2-3"}')])
        self.assertEqual(2, allocators['rdna'].unit)
        for bad in ('[{"id":"a"}]', '[{"devcore":4}]',
                    '[{"id":"a","devcore":2147483647}]',
                    '[{"id":"a","devcore":4},{"id":"a","devcore":4}]',
                    '[{"id":"a","devcore":5,"custominfo":{"cuPerWGP":2}}]'):
            self.assertRaises(exception.HamiProtocolError, hami.gpu_shapes,
                              hami.decode_node_register(bad))

    GPUS = {'gpu-0': (304, 1), 'gpu-1': (304, 1)}

    def test_rebuild(self):
        allocators = hami.rebuild_allocators(self.GPUS, [
            ('ns/a', '{"gpu-0":"0-3,8"}'),
            ('ns/b', '{"gpu-0":"4-7","gpu-1":"0-75"}'),
        ], strategy=allocator.BestFitStrategy())
        self.assertEqual((0, 1, 2, 3, 8), allocators['gpu-0'].cus_of('ns/a'))
        self.assertEqual(76, allocators['gpu-1'].used_count)
        self.assertEqual(9, allocators['gpu-0'].used_count)
        self.assertEqual('best-fit', allocators['gpu-0'].strategy.name)

    def test_overlap_fails_closed(self):
        err = self.assertRaises(exception.AllocationConflict,
                                hami.rebuild_allocators, self.GPUS, [
                                    ('ns/a', '{"gpu-0":"0-3,8"}'),
                                    ('ns/b', '{"gpu-0":"8-9"}')])
        self.assertIn('CU 8', str(err))
        self.assertIn('ns/a', str(err))
        self.assertIn('ns/b', str(err))

    def test_unknown_gpu_and_out_of_range(self):
        err = self.assertRaises(exception.HamiProtocolError,
                                hami.rebuild_allocators, self.GPUS,
                                [('ns/a', '{"gpu-9":"0"}')])
        self.assertIn('gpu-9', str(err))
        self.assertRaises(exception.SharingError, hami.rebuild_allocators,
                          self.GPUS, [('ns/a', '{"gpu-0":"300-304"}')])


class WholePercentTest(testtools.TestCase):
    """Whole percentages and the one conversion, with HAMi's semantics."""

    def test_parse_percent(self) -> None:
        for good, number in ((1, 1), ('25', 25), ('+7', 7), (' 100 ', 100),
                             ('25%', 25)):
            self.assertEqual(number, hami.parse_percent(good))
        for bad in (0, 101, '12.5', '0', '1e2', True, None, 2.0, '٣',
                    '99999999999'):
            err = self.assertRaises(exception.HamiProtocolError,
                                    hami.parse_percent, bad, 'f')
            self.assertIn('f', str(err))

    def test_conversion_matches_hami(self) -> None:
        # HAMi: floor(devcore * pct / 100), at least 1, rounded up to the
        # registration's cuPerWGP, at most devcore
        for percent, devcore, unit, cus in (
                (1, 304, 1, 3), (25, 304, 1, 76), (33, 304, 1, 100),
                (67, 304, 1, 203), (100, 304, 1, 304), (1, 80, 1, 1),
                (1, 40, 1, 1), (10, 40, 2, 4), (13, 40, 2, 6),
                (99, 40, 2, 40)):
            self.assertEqual(cus, hami.percent_to_cus(percent, devcore,
                                                      unit))

    def test_cus_to_percent_is_the_smallest_whole_percent(self) -> None:
        for cus in range(1, 305):
            percent = hami.cus_to_percent(cus, 304)
            self.assertGreaterEqual(hami.percent_to_cus(percent, 304), cus)
            if percent > 1:
                self.assertLess(hami.percent_to_cus(percent - 1, 304), cus)
        self.assertRaises(exception.HamiProtocolError, hami.cus_to_percent,
                          305, 304)

    def test_plugin_env(self) -> None:
        for name in ('HSA_CU_MASK', 'ROC_GLOBAL_CU_MASK', 'LD_AUDIT',
                     'ROCR_VISIBLE_DEVICES', 'HIP_DEVICE_MEMORY_LIMIT',
                     'HIP_DEVICE_MEMORY_LIMIT_3'):
            self.assertTrue(hami.is_plugin_env(name), name)
        self.assertFalse(hami.is_plugin_env('HIP_VISIBLE_DEVICES'))
        for prefix, clash in (('', 'HSA_CU_MASK'), ('HSA_', 'HSA_CU_MASK'),
                              ('LD_', 'LD_AUDIT'),
                              ('HIP_DEVICE_MEMORY_LIMIT_9',
                               'HIP_DEVICE_MEMORY_LIMIT*'),
                              ('APP_', None), ('HSA_X', None)):
            self.assertEqual(clash, hami.plugin_env_clash(prefix), prefix)


class TestParts(testtools.TestCase):
    """The package re-exports every public name of its parts, and no part
    declares a name another one declares (one vocabulary)."""

    def test_every_public_name_is_declared_once_and_exported(self):
        import ast
        import importlib
        import inspect

        seen: dict[str, str] = {}
        for part in ('names', 'percent', 'register', 'pods', 'lock'):
            module = importlib.import_module(
                'amdgpu_virt.sharing.hami.%s' % part)
            for node in ast.parse(inspect.getsource(module)).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    declared = [node.name]
                elif isinstance(node, ast.Assign):
                    declared = [t.id for t in node.targets
                                if isinstance(t, ast.Name)]
                elif isinstance(node, ast.AnnAssign) and \
                        isinstance(node.target, ast.Name):
                    declared = [node.target.id]
                else:
                    continue
                for name in declared:
                    self.assertNotIn(name, seen, '%s declared in %s and %s'
                                     % (name, seen.get(name), part))
                    seen[name] = part
                    if not name.startswith('_'):
                        self.assertIs(getattr(module, name),
                                      getattr(hami, name), name)
                        self.assertIn(name, hami.__all__)
        self.assertEqual(sorted(hami.__all__),
                         sorted(n for n in seen if not n.startswith('_')))
