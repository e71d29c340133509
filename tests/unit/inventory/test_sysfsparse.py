"""The pure sysfs value parsers: a value or SysfsValueError, nothing else."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st
import testtools

from amdgpu_virt import exception
from amdgpu_virt.inventory import sysfsparse as parse

PATH = '/sys/bus/pci/devices/0000:05:00.0/x'
RAW = st.one_of(st.binary(max_size=300), st.text(max_size=300))
#: Values shaped like the real ones, with noise around them.
_SPACE = st.sampled_from(['', ' ', '\n', ' \n', '\t'])
_NUMBER = st.tuples(
    _SPACE, st.sampled_from(['', '0x', '0X', '-']),
    st.text(alphabet='0123456789abcdefABCDEF-x', max_size=24),
    _SPACE).map(''.join)
_MODES = st.tuples(
    _SPACE, st.lists(st.sampled_from(
        ['SPX', 'DPX', 'TPX', 'QPX', 'CPX', 'NPS1', 'NPS2', 'NPS4',
         'NPS3', 'UNKNOWN', 'spx', 'FOO', '']), max_size=6),
    st.sampled_from([', ', ',', ' ', ';']), _SPACE).map(
        lambda t: t[0] + t[2].join(t[1]) + t[3])
NEAR = st.one_of(_NUMBER, _MODES, st.integers().map(str),
                 st.integers().map(hex))


def _only_value_error(test, func, raw, *args):
    try:
        return func(raw, PATH, *args)
    except exception.SysfsValueError as err:
        test.assertIn(PATH, str(err))
        return None


class TestPropertiesOfEveryParser(testtools.TestCase):

    @hypothesis.given(RAW | NEAR)
    def test_parse_hex(self, raw):
        value = _only_value_error(self, parse.parse_hex, raw)
        if value is not None:
            self.assertTrue(0 <= value <= 0xffff)

    @hypothesis.given(RAW | NEAR)
    def test_parse_int(self, raw):
        value = _only_value_error(self, parse.parse_int, raw)
        if value is not None:
            self.assertTrue(0 <= value < 2 ** 64)

    @hypothesis.given(RAW | NEAR)
    def test_parse_numa_node(self, raw):
        value = _only_value_error(self, parse.parse_numa_node, raw)
        self.assertTrue(value is None or 0 <= value <= 1023)

    @hypothesis.given(RAW | NEAR)
    def test_parse_mode(self, raw):
        value = _only_value_error(self, parse.parse_mode, raw,
                                  parse.COMPUTE_MODES)
        self.assertTrue(value is None or value in parse.COMPUTE_MODES)

    @hypothesis.given(RAW | NEAR)
    def test_parse_mode_list(self, raw):
        value = _only_value_error(self, parse.parse_mode_list, raw,
                                  parse.MEMORY_MODES)
        if value is not None:
            self.assertTrue(set(value) <= set(parse.MEMORY_MODES))
            self.assertEqual(len(set(value)), len(value))

    @hypothesis.given(RAW | NEAR)
    def test_parse_unique_id(self, raw):
        value = _only_value_error(self, parse.parse_unique_id, raw)
        if value is not None:
            self.assertRegex(value, '^[0-9a-f]{16}$')

    @hypothesis.given(RAW)
    def test_parse_name(self, raw):
        value = _only_value_error(self, parse.parse_name, raw)
        if value is not None:
            self.assertEqual(value.strip(), value)
            self.assertNotIn('\n', value)

    @hypothesis.given(RAW)
    def test_parse_token(self, raw):
        value = _only_value_error(self, parse.parse_token, raw)
        if value is not None:
            self.assertNotIn(' ', value)

    @hypothesis.given(st.text(max_size=80), st.sampled_from(['', 'renderD']))
    def test_parse_link_number(self, target, prefix):
        try:
            value = parse.parse_link_number(target, PATH, prefix)
        except exception.SysfsValueError:
            return
        self.assertGreaterEqual(value, 0)

    @hypothesis.given(RAW)
    def test_parse_properties(self, raw):
        try:
            values, problems = parse.parse_properties(raw, PATH)
        except exception.SysfsValueError:
            return
        for key, value in values.items():
            self.assertRegex(key, '^[a-z_][a-z0-9_]*$')
            self.assertIsInstance(value, int)
        self.assertIsInstance(problems, list)

    @hypothesis.given(st.integers())
    def test_decode_location_id(self, loc):
        try:
            bus, device, part = parse.decode_location_id(loc, PATH)
        except exception.SysfsValueError:
            self.assertFalse(0 <= loc <= 0xffff)
            return
        self.assertEqual(loc, (bus << 8) | (device << 3) | part)

    @hypothesis.given(st.integers())
    def test_kfd_unique_id(self, value):
        text = parse.kfd_unique_id(value)
        if text is None:
            self.assertFalse(0 < value < 2 ** 64)
        else:
            self.assertEqual(value, int(text, 16))


class TestExamples(testtools.TestCase):

    def test_hex(self):
        self.assertEqual(0x1002, parse.parse_hex(b'0x1002\n', PATH))
        self.assertEqual(0x74b5, parse.parse_hex('74b5\n', PATH))
        self.assertEqual(0x74b5, parse.parse_hex('0x74b5', PATH))
        self.assertEqual(0x120000, parse.parse_hex('0x120000', PATH,
                                                   0xffffff))
        for bad in ('', 'abc g', '0x', '0x10000', '-1', b'\xff'):
            err = self.assertRaises(exception.SysfsValueError,
                                    parse.parse_hex, bad, PATH)
            self.assertIn(PATH, str(err))

    def test_int(self):
        self.assertEqual(206141652992,
                         parse.parse_int(b'206141652992\n', PATH))
        for bad in ('abc', '', '-5', '1' * 30, '1.5'):
            self.assertRaises(exception.SysfsValueError, parse.parse_int,
                              bad, PATH)

    def test_numa(self):
        self.assertIsNone(parse.parse_numa_node('-1\n', PATH))
        self.assertEqual(1, parse.parse_numa_node('1\n', PATH))
        self.assertRaises(exception.SysfsValueError, parse.parse_numa_node,
                          '-2', PATH)

    def test_modes(self):
        self.assertEqual('CPX', parse.parse_mode('CPX\n', PATH,
                                                 parse.COMPUTE_MODES))
        self.assertIsNone(parse.parse_mode('UNKNOWN\n', PATH,
                                           parse.MEMORY_MODES))
        self.assertEqual(('SPX', 'DPX', 'QPX', 'CPX'), parse.parse_mode_list(
            'SPX, DPX, QPX, CPX\n', PATH, parse.COMPUTE_MODES))
        self.assertEqual(('NPS1', 'NPS4'), parse.parse_mode_list(
            'NPS1,NPS4', PATH, parse.MEMORY_MODES))
        err = self.assertRaises(exception.SysfsValueError,
                                parse.parse_mode_list, 'SPX, XPX', PATH,
                                parse.COMPUTE_MODES)
        self.assertIn("'XPX'", str(err))

    def test_unique_id(self):
        self.assertEqual('00000000000000ab',
                         parse.parse_unique_id('ab\n', PATH))
        self.assertIsNone(parse.parse_unique_id('0', PATH))

    def test_properties(self):
        values, problems = parse.parse_properties(
            'simd_count 1216\nlocation_id 18176\nbad\nsimd_count 2\n'
            'x y\n\n', PATH)
        self.assertEqual({'simd_count': 1216, 'location_id': 18176}, values)
        self.assertEqual(3, len(problems))

    def test_location_id_of_a_real_mi300x(self):
        self.assertEqual((0x47, 0, 0), parse.decode_location_id(18176, PATH))
        self.assertEqual((0x47, 0, 3),
                         parse.decode_location_id(18176 | 3, PATH))
