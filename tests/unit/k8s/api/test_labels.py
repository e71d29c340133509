"""Kubernetes label values (pure)."""

import re

import testtools
from hypothesis import given
from hypothesis import strategies as st

from amdgpu_virt.k8s.api import labels

# Kubernetes label value syntax (empty allowed), at most 63 characters.
VALUE_RE = re.compile(r'^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')


class LabelValueTest(testtools.TestCase):

    @given(st.text(max_size=200))
    def test_label_value_is_always_valid(self, text):
        value = labels.label_value(text)
        self.assertLessEqual(len(value), 63)
        self.assertRegex(value, VALUE_RE)


class IsLabelValueTest(testtools.TestCase):

    def test_node_names_that_may_be_label_values(self) -> None:
        for value in ('', 'r07', 'gpu-node.example_1', 'a' * 63):
            self.assertTrue(labels.is_label_value(value), value)
        for value in ('a' * 64, '-r07', 'r07.', 'node/1', 'n 1', 'ñ'):
            self.assertFalse(labels.is_label_value(value), value)
