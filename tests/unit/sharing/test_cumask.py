"""HSA_CU_MASK, ROC_GLOBAL_CU_MASK and ID list codecs."""

from __future__ import annotations

import testtools

from amdgpu_virt import exception
from amdgpu_virt.sharing import cumask


def mask(*ranges):
    result = 0
    for item in ranges:
        low, high = item if isinstance(item, tuple) else (item, item)
        for cu in range(low, high + 1):
            result |= 1 << cu
    return result


class IdListTest(testtools.TestCase):

    def test_format(self):
        self.assertEqual('0-3,8,10-12',
                         cumask.format_id_list(mask((0, 3), 8, (10, 12))))
        self.assertEqual('4-5', cumask.format_id_list([5, 4]))
        self.assertEqual('7', cumask.format_id_list(1 << 7))

    def test_format_refuses_empty(self):
        self.assertRaises(exception.SharingError, cumask.format_id_list, 0)
        self.assertRaises(exception.SharingError, cumask.format_id_list, [])
        self.assertRaises(exception.SharingError, cumask.format_id_list,
                          [-1])

    def test_parse(self):
        self.assertEqual(mask((0, 3), 8, (10, 12)),
                         cumask.parse_id_list('0-3,8,10-12'))
        self.assertEqual(mask((0, 4)), cumask.parse_id_list(' 4 ,0-3 '))
        self.assertEqual(mask(1, 2), cumask.parse_id_list('1,2,'))

    def test_parse_errors_name_variable_and_position(self):
        for value, position, fragment in (
                ('', 0, 'empty CU list'),
                ('1,,2', 2, 'empty CU id'),
                ('1-', 2, 'not a CU id'),
                ('-3', 0, 'not a CU id'),
                ('+3', 0, 'not a CU id'),
                ('5-3', 0, 'inverted range'),
                ('0-3,2', 4, 'CU id 2 is repeated'),
                ('1-2-3', 2, 'not a CU id'),
                ('0,304', 2, 'beyond 303')):
            err = self.assertRaises(exception.MaskSyntaxError,
                                    cumask.parse_id_list, value,
                                    'hami.io/amd-cu-allocated', 304)
            self.assertIn('hami.io/amd-cu-allocated', str(err))
            self.assertIn(repr(value), str(err))
            self.assertIn(fragment, str(err))
            self.assertEqual(position, err.kwargs['position'], value)

    def test_huge_ids_refused_quickly(self):
        self.assertRaises(exception.MaskSyntaxError, cumask.parse_id_list,
                          '0-99999999999')
        self.assertRaises(exception.MaskSyntaxError, cumask.parse_id_list,
                          '9' * 5000)


class HsaCuMaskTest(testtools.TestCase):

    def test_hami_form(self):
        value = '0:0-75;1:0-75'
        parsed = cumask.parse_hsa_cu_mask(value)
        self.assertEqual({0: mask((0, 75)), 1: mask((0, 75))},
                         parsed.as_dict())
        self.assertEqual(value, parsed.encode())
        self.assertEqual(value, cumask.encode_hsa_cu_mask(
            {1: mask((0, 75)), 0: mask((0, 75))}))

    def test_container_mask(self):
        self.assertEqual('0:0-75;1:76-151', cumask.container_hsa_cu_mask(
            [mask((0, 75)), mask((76, 151))]))
        self.assertRaises(exception.SharingError,
                          cumask.container_hsa_cu_mask, [])

    def test_rocr_grammar(self):
        parsed = cumask.parse_hsa_cu_mask('0,2,4,7:0-15,32-47; 3,8-9:0x337F')
        self.assertEqual(2, len(parsed.sets))
        self.assertEqual((0, 2, 4, 7), parsed.sets[0].gpus)
        self.assertEqual(mask((0, 15), (32, 47)), parsed.mask_for(7))
        self.assertEqual(0x337f, parsed.mask_for(9))
        self.assertTrue(parsed.sets[1].hex)
        self.assertIsNone(parsed.mask_for(1))
        self.assertEqual('0,2,4,7:0-15,32-47;3,8-9:0x337f', parsed.encode())

    def test_rocr_comment_example_repeats_gpu_3(self):
        # ROCr's own example lists GPU 3 in both sets ("2-4" and "3-9");
        # its parser stops at the second set. So do we, loudly.
        err = self.assertRaises(exception.MaskSyntaxError,
                                cumask.parse_hsa_cu_mask,
                                '0,2-4,7:0-15,32-47; 3-9:0x337F')
        self.assertIn("CU set 2 '3-9:0x337F'", str(err))
        self.assertIn('GPU 3 already has a CU set', str(err))
        self.assertEqual(20, err.kwargs['position'])

    def test_whitespace_case_and_trailing_separators(self):
        self.assertEqual(
            '0:1-2;1:0xff',
            cumask.canonical_hsa_cu_mask(' 0 : 2 , 1 ;\t1:0XfF ; '))
        self.assertEqual('0:0-3', cumask.canonical_hsa_cu_mask('0:0-3,'))
        self.assertEqual('0:0x1', cumask.canonical_hsa_cu_mask('0:0x0001'))

    def test_errors_name_the_first_bad_set(self):
        for value, position, fragment in (
                ('', 0, 'no CU set'),
                ('   ', 3, 'no CU set'),
                ('0', 0, "CU set 1 '0': expected GPU_list:CU_list"),
                ('0:', 2, 'empty CU list'),
                ('0:1;2', 4, "CU set 2 '2'"),
                ('0:1;;1:2', 4, 'empty CU set'),
                (';0:1', 0, 'empty CU set'),
                ('0:1:2', 3, 'more than one ":"'),
                ('0:0x0', 2, 'enables no CU (0x0)'),
                ('0:0x', 4, 'no hex digits'),
                ('0:0xfg', 5, "'g' is not a hex digit"),
                ('0:1x3', 2, 'starts with 0x'),
                ('0:1,1', 4, 'CU id 1 is repeated'),
                ('0,0:1', 2, 'GPU id 0 is repeated'),
                ('0:4-2', 2, 'inverted range 4-2'),
                ('0:1;1:2;0:3', 8, 'GPU 0 already has a CU set'),
                ('a:1', 0, "'a' is not a GPU id"),
                ('0:304', 2, 'CU id 304 is beyond 303'),
                ('0:0x1' + '0' * 76, 2, 'beyond 303'),
                ('8:1', 0, 'GPU id 8 is beyond 7')):
            err = self.assertRaises(exception.MaskSyntaxError,
                                    cumask.parse_hsa_cu_mask, value, 304, 8)
            self.assertIn('HSA_CU_MASK', str(err))
            self.assertIn(repr(value), str(err))
            self.assertIn(fragment, str(err))
            self.assertEqual(position, err.kwargs['position'], value)

    def test_positions_count_original_whitespace(self):
        err = self.assertRaises(exception.MaskSyntaxError,
                                cumask.parse_hsa_cu_mask, '0 : 1 , 1')
        self.assertEqual(8, err.kwargs['position'])

    def test_encoder_never_emits_what_rocr_rejects(self):
        for bad in ({}, {0: 0}, {0: -1},
                    cumask.HsaCuMask(sets=()),
                    cumask.HsaCuMask(sets=(cumask.CuSet((), 1), )),
                    cumask.HsaCuMask(sets=(cumask.CuSet((0, 0), 1), )),
                    cumask.HsaCuMask(sets=(cumask.CuSet((0, ), 1),
                                           cumask.CuSet((0, ), 2)))):
            self.assertRaises(exception.SharingError,
                              cumask.encode_hsa_cu_mask, bad)


class GlobalCuMaskTest(testtools.TestCase):

    def test_round_trip(self):
        self.assertEqual('0xf', cumask.encode_global_cu_mask(0xf))
        self.assertEqual(0x337f, cumask.parse_global_cu_mask('0x337F'))
        self.assertEqual(0xff, cumask.parse_global_cu_mask(' ff\n'))
        self.assertEqual((1 << 304) - 1, cumask.parse_global_cu_mask(
            cumask.encode_global_cu_mask((1 << 304) - 1), 304))

    def test_errors(self):
        self.assertRaises(exception.SharingError,
                          cumask.encode_global_cu_mask, 0)
        for value, position in (('', 0), ('0x', 2), ('0x0', 0), ('zz', 0),
                                ('0xfz', 3), ('fz', 1), ('0x1ff', 0)):
            err = self.assertRaises(exception.MaskSyntaxError,
                                    cumask.parse_global_cu_mask, value, 8)
            self.assertIn('ROC_GLOBAL_CU_MASK', str(err))
            self.assertEqual(position, err.kwargs['position'], value)
