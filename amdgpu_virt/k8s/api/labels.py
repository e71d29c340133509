"""Kubernetes label values: which texts are valid, and how to make one.

A label value is at most 63 characters, empty or beginning and ending with
an alphanumeric character, with ``-``, ``_``, ``.`` and alphanumerics
between (the API server's ``IsValidLabelValue``).
"""

from __future__ import annotations

import re

MAX_VALUE = 63
_INVALID = re.compile(r'[^A-Za-z0-9_.-]+')
_VALID = re.compile(r'^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')


def is_label_value(text: str) -> bool:
    """``text`` may be a label value as it is (a node name used as the
    ``hami.io/vgpu-node`` label, for example)."""
    return len(text) <= MAX_VALUE and _VALID.match(text) is not None


def label_value(text: str) -> str:
    """``text`` as a valid label value (``AMD Instinct MI300X`` ->
    ``AMD_Instinct_MI300X``)."""
    value = _INVALID.sub('_', text.strip())[:MAX_VALUE]
    return value.strip('_.-')
