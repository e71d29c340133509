"""Kubernetes quantities: parsed and written as apimachinery does."""

from __future__ import annotations

from fractions import Fraction

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import quantity
from tests.unit.k8s.api import quantity_table


class TestServed(testtools.TestCase):
    """The text the API server returns, pair by pair."""

    def test_every_pair_of_the_table(self):
        wrong = [(sent, quantity.served(sent), want)
                 for sent, want in quantity_table.SERVED
                 if quantity.served(sent) != want]
        self.assertEqual([], wrong)
        self.assertGreater(len(quantity_table.SERVED), 100)

    def test_echoed_texts_are_canonical_when_computed_afresh(self):
        for sent, fresh in quantity_table.ECHOED:
            self.assertEqual(fresh, quantity.canonical(sent), sent)
            self.assertEqual(sent, quantity.parse(sent).kept, sent)

    def test_invalid_texts_name_themselves(self):
        for text in quantity_table.INVALID:
            err = self.assertRaises(exception.InvalidQuantity,
                                    quantity.parse, text)
            self.assertIn(repr(text), str(err))

    def test_json_integers(self):
        self.assertEqual('1', quantity.served(1))
        self.assertEqual('1k', quantity.served(1000))
        self.assertEqual('-1', quantity.served(-1))
        for bad in (1.5, None, True, [], {}):
            self.assertRaises(exception.InvalidQuantity, quantity.parse, bad)


class TestBounds(testtools.TestCase):
    """Crafted text is refused before any arithmetic."""

    def test_long_text(self):
        self.assertEqual('1' * 64, quantity.served('1' * 64))
        err = self.assertRaises(exception.InvalidQuantity, quantity.parse,
                                '1' * 65)
        self.assertIn('longer than 64', str(err))
        self.assertRaises(exception.InvalidQuantity, quantity.parse,
                          10 ** 70)

    def test_exponents(self):
        self.assertEqual('1e99', quantity.served('1e99'))
        self.assertEqual('10e99', quantity.served('1e100'))
        for text in ('1e101', '1e-101', '1e99999999999999999999'):
            err = self.assertRaises(exception.InvalidQuantity,
                                    quantity.parse, text)
            self.assertIn('exponent', str(err))

    def test_tiny_values_round_up_to_a_nano(self):
        self.assertEqual(Fraction(1, 10 ** 9),
                         quantity.value('1e-100'))
        self.assertEqual('-1n', quantity.served('-0.0000000001'))


class TestWriters(testtools.TestCase):

    def test_binary_and_decimal(self):
        self.assertEqual('24Gi', quantity.mebibytes(24576))
        self.assertEqual('1536Mi', quantity.mebibytes(1536))
        self.assertEqual('192Gi', quantity.mebibytes(196608))
        self.assertEqual('512', quantity.binary(512))
        self.assertEqual('304', quantity.decimal(304))
        self.assertEqual('1k', quantity.decimal(1000))
        self.assertEqual('0', quantity.decimal(0))
        self.assertEqual('500m', quantity.decimal(Fraction(1, 2)))

    def test_equal_compares_values(self):
        self.assertTrue(quantity.equal('24576Mi', '24Gi'))
        self.assertTrue(quantity.equal('1e3', '1k'))
        self.assertTrue(quantity.equal(1000, '1k'))
        self.assertFalse(quantity.equal('1Ki', '1k'))
        self.assertFalse(quantity.equal('1Ki', 'x'))


class TestMapFields(testtools.TestCase):

    def test_slice_quantities(self):
        obj = {'spec': {'devices': [{'name': 'd', 'capacity': {
            'memory': {'value': '24576Mi', 'requestPolicy': {
                'default': '1024Mi', 'validValues': ['2048Mi'],
                'validRange': {'min': '1024Mi', 'step': '1024Mi'}}}},
            'consumesCounters': [{'counterSet': 'g', 'counters': {
                'memory': {'value': '2048Mi'}}}]}],
            'sharedCounters': [{'name': 'g', 'counters': {
                'memory': {'value': '196608Mi'}}}]}}
        got = quantity.map_fields(obj, quantity.SLICE_PATHS,
                                  quantity.served)
        memory = got['spec']['devices'][0]['capacity']['memory']
        self.assertEqual('24Gi', memory['value'])
        self.assertEqual({'default': '1Gi', 'validValues': ['2Gi'],
                          'validRange': {'min': '1Gi', 'step': '1Gi'}},
                         memory['requestPolicy'])
        self.assertEqual('2Gi', got['spec']['devices'][0][
            'consumesCounters'][0]['counters']['memory']['value'])
        self.assertEqual('192Gi', got['spec']['sharedCounters'][0][
            'counters']['memory']['value'])
        # the original is left alone, names are not quantities
        self.assertEqual('24576Mi', obj['spec']['devices'][0]['capacity'][
            'memory']['value'])
        self.assertEqual('d', got['spec']['devices'][0]['name'])

    def test_claim_quantities_and_missing_fields(self):
        spec = {'devices': {'requests': [
            {'name': 'a', 'exactly': {'capacity': {'requests': {
                'memory': '2048Mi'}}}},
            {'name': 'b', 'firstAvailable': [{'capacity': {'requests': {
                'memory': '1000'}}}, {'name': 'c'}]},
            {'name': 'd', 'exactly': {}}]}}
        got = quantity.map_fields(spec, quantity.CLAIM_SPEC_PATHS,
                                  quantity.served)
        requests = got['devices']['requests']
        self.assertEqual('2Gi', requests[0]['exactly']['capacity'][
            'requests']['memory'])
        self.assertEqual('1k', requests[1]['firstAvailable'][0][
            'capacity']['requests']['memory'])
        self.assertEqual({'name': 'c'}, requests[1]['firstAvailable'][1])
        self.assertEqual({}, requests[2]['exactly'])


_SUFFIX = st.sampled_from(['', 'n', 'u', 'm', 'k', 'M', 'G', 'T', 'P', 'E',
                           'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei', 'e3', 'e-6',
                           'E2', 'e0', 'e12'])
_TEXT = st.builds(lambda sign, whole, frac, suffix: sign + whole + frac +
                  suffix, st.sampled_from(['', '-', '+']),
                  st.from_regex(r'\A[0-9]{0,12}\Z'),
                  st.sampled_from(['']) | st.from_regex(r'\A\.[0-9]{0,6}\Z'),
                  _SUFFIX)


class TestProperties(testtools.TestCase):

    @given(_TEXT)
    def test_canonical_text_is_kept_and_means_the_same(self, text):
        try:
            parsed = quantity.parse(text)
        except exception.InvalidQuantity:
            return
        text = quantity.canonical(parsed)
        # the server keeps canonical text as written, with its value
        self.assertEqual(text, quantity.served(text))
        self.assertEqual(parsed.value, quantity.value(text))
        self.assertEqual(text, quantity.canonical(text))
        # what the server returns means what was sent
        self.assertEqual(parsed.value, quantity.value(quantity.served(
            parsed.kept or text)))
