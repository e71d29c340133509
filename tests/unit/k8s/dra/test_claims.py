"""Quantities in a claim's results: exact values, or one error naming the
field, bounded on their text before any arithmetic."""

from __future__ import annotations

import decimal
import time
from fractions import Fraction

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt.k8s.dra import claims


class QuantityTest(testtools.TestCase):

    def _value(self, text: object) -> Fraction:
        return claims.quantity('ns/c', 'results[0].x', text)

    def test_what_the_api_writes(self) -> None:
        for text, value in (('24Gi', 24 << 30), ('38', 38), (38, 38),
                            ('1.5e3', 1500), ('1500m', decimal.Decimal('1.5')),
                            ('.5Ki', 512), ('1E', 10 ** 18),
                            ('+2k', 2000), ('0', 0), ('1e-3', decimal.Decimal(
                                '0.001'))):
            self.assertEqual(value, self._value(text), text)

    def test_a_number_left_out_is_zero(self) -> None:
        # as kube-apiserver reads them ('.' and 'Gi' parse as 0): a share
        # check then refuses the zero
        for text in ('.', 'Gi'):
            self.assertEqual(0, self._value(text), text)

    def test_anything_else_is_one_named_error(self) -> None:
        for text in ('1e999999', '9e99999999', '1e-999999', '7' * 30,
                     '1' * 41, '', '12 Gi', '1.5.5', 'NaN',
                     'Infinity', '0x10', 1.5, True, None, ['1'], {'a': 1}):
            err = self.assertRaises(exception.DraClaimError, self._value,
                                    text)
            self.assertIn('ResourceClaim ns/c: results[0].x', str(err))

    @settings(max_examples=500, deadline=None)
    @given(st.one_of(
        st.text(st.sampled_from('0123456789.eE+-kKMGTPEimnu '),
                max_size=60),
        st.integers(-10 ** 40, 10 ** 40)))
    def test_any_text_in_bounded_time(self, text: object) -> None:
        # CPU time of this thread: a busy machine's scheduling is not
        # counted (1e999999 took over a minute of it)
        began = time.thread_time()
        try:
            value = self._value(text)
        except exception.DraClaimError:
            pass
        else:
            self.assertLess(abs(value), decimal.Decimal(10) ** 60)
        self.assertLess(time.thread_time() - began, 0.2)
