"""What the HAMi codecs share: Go's integer ranges and number syntax, its
JSON encoder's escapes, and the one error every decoder raises."""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

from amdgpu_virt import exception

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_UINT_MAX = (1 << 64) - 1
_INT_RE = re.compile(r'[+-]?[0-9]+\Z')
_GO_BOOLS = {'1': True, 't': True, 'T': True, 'TRUE': True, 'true': True,
             'True': True, '0': False, 'f': False, 'F': False,
             'FALSE': False, 'false': False, 'False': False}


def _fail(key: str, value: str, reason: str) -> NoReturn:
    raise exception.HamiProtocolError(key=key, value=value, reason=reason)


def _json_constant(name: str) -> Any:
    raise ValueError('%s is not JSON' % name)


def _go_json(data: Any) -> str:
    """Compact JSON with the escapes Go's encoder adds (``<>&``, line and
    paragraph separators)."""
    text = json.dumps(data, separators=(',', ':'), ensure_ascii=False)
    for char, escape in (('&', '\\u0026'), ('<', '\\u003c'),
                         ('>', '\\u003e'), ('\u2028', '\\u2028'),
                         ('\u2029', '\\u2029')):
        text = text.replace(char, escape)
    return text


def _go_int(key: str, value: str, where: str, name: str, text: str,
            low: int, high: int) -> int:
    if not _INT_RE.match(text):
        _fail(key, value, '%s field %s: %r is not an integer'
              % (where, name, text))
    if len(text.lstrip('+-').lstrip('0')) > 20:
        _fail(key, value, '%s field %s: %s is out of range'
              % (where, name, text))
    number = int(text)
    if not low <= number <= high:
        _fail(key, value, '%s field %s: %d is outside %d..%d'
              % (where, name, number, low, high))
    return number


def _check_text(key: str, what: str, text: str, forbidden: str) -> None:
    bad = [c for c in forbidden if c in text]
    if bad:
        _fail(key, text, '%s cannot contain %r' % (what, bad[0]))
