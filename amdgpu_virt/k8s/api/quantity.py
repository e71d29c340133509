"""Kubernetes resource quantities (``resource.Quantity``): parse and write.

The one place where the project reads quantity text (``24Gi``, ``1500m``,
``1e3``) and writes it, by the rules of ``k8s.io/apimachinery``'s
``pkg/api/resource``:

* :func:`parse` reads a quantity as ``ParseQuantity`` does: a sign,
  digits with an optional fraction, then a suffix that fixes the format
  (``Ki`` .. ``Ei``: binary SI; ``n u m "" k M G T P E``: decimal SI;
  ``e<exp>``/``E<exp>``: decimal exponent). Values are exact
  (:class:`fractions.Fraction`); a non-zero value is rounded up to a whole
  nano (``3.001n`` is ``4n``: "if you want some resources, you should get
  some"), a binary value is capped at 2^63-1, a binary value below 1
  becomes decimal SI. The text is bounded before any arithmetic
  (:data:`MAX_TEXT` characters, exponents within :data:`MAX_EXPONENT`).
* :func:`canonical` writes the canonical text of a value (what
  ``Quantity.String()`` computes): no fraction, the largest suffix that
  loses nothing: ``24576Mi`` is ``24Gi``, ``1.5Gi`` is ``1536Mi``,
  ``1000`` is ``1k``, ``0.5`` is ``500m``, ``1e14`` is ``100e12``. Binary
  values below 1024 or with a fraction are written as decimal SI; decimal
  values are never written in binary (``1024`` stays ``1024``).
* :func:`served` is the text kube-apiserver stores and returns for a text
  it was sent: the canonical text, except where ``ParseQuantity`` keeps
  the original string (a mantissa it cannot shorten): ``1.500``,
  ``100.035k``, ``+1Gi``, ``01``, ``1E3`` and ``1.`` come back as sent.
  So never compare quantities as text (:func:`equal` compares values);
  write them with :func:`binary`, :func:`mebibytes` or :func:`decimal`,
  which give canonical text the server keeps as written.

:data:`SLICE_PATHS`, :data:`CLAIM_SPEC_PATHS` and :data:`CLAIM_STATUS_PATHS`
name the quantity fields of ``resource.k8s.io/v1`` objects, for
:func:`map_fields`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from amdgpu_virt import exception

#: the longest quantity text read (the longest real one, 2^63-1 with a
#: binary suffix, has 21 characters)
MAX_TEXT = 64
#: the largest exponent magnitude of the ``e`` form (``1e30`` is fine)
MAX_EXPONENT = 100
#: a binary SI value is capped here (``9Ei`` is 9223372036854775807)
MAX_BINARY = (1 << 63) - 1
_NANO = 10 ** 9
_MAX_INT64 = (1 << 63) - 1
_DIGITS = frozenset('0123456789')
_SUFFIX_CHARS = frozenset('eEinumkKMGTP')
_EXPONENT = re.compile(r'^[+-]?[0-9]+$')


class Format(str, enum.Enum):  # noqa: UP042 (str() stays Enum-style)
    """How a quantity is written: fixed by the suffix it was read with."""

    BINARY_SI = 'BinarySI'
    DECIMAL_SI = 'DecimalSI'
    DECIMAL_EXPONENT = 'DecimalExponent'


#: suffix -> power of ten (decimal SI)
_DECIMAL = {'n': -9, 'u': -6, 'm': -3, '': 0, 'k': 3, 'M': 6, 'G': 9,
            'T': 12, 'P': 15, 'E': 18}
#: suffix -> power of two (binary SI)
_BINARY = {'Ki': 10, 'Mi': 20, 'Gi': 30, 'Ti': 40, 'Pi': 50, 'Ei': 60}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_SUFFIX = {exp // 10: suffix for suffix, exp in _BINARY.items()}


@dataclasses.dataclass(frozen=True)
class Quantity:
    """A parsed quantity.

    :ivar value: the exact value.
    :ivar format: the format its suffix gave.
    :ivar kept: the text as read, when kube-apiserver keeps it verbatim
        (see :func:`served`); ``''`` when it writes the canonical text.
    """

    value: Fraction
    format: Format
    kept: str = ''

    def __str__(self) -> str:
        return canonical(self)


def _invalid(text: Any, reason: str) -> exception.InvalidQuantity:
    return exception.InvalidQuantity(value=str(text)[:MAX_TEXT + 8],
                                     reason=reason)


def _scan(text: str) -> tuple[bool, str, str, str]:
    """(positive, integer digits, fraction digits, suffix), as
    apimachinery's ``parseQuantityString`` splits a quantity.

    Leading zeros are dropped from the integer digits, which are ``'0'``
    when none are left.
    """
    end = len(text)
    pos = 0
    positive = True
    if text[0] in '+-':
        positive = text[0] == '+'
        pos = 1
    while pos < end and text[pos] == '0':
        pos += 1
    if pos >= end:
        return positive, '0', '', ''
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    whole = text[start:pos] or '0'
    fraction = ''
    if pos < end and text[pos] == '.':
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        fraction = text[start:pos]
    start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in '+-':
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise _invalid(text, "it must match '^([+-]?[0-9.]+)"
                       "([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    return positive, whole, fraction, text[start:]


def _suffix(text: str, suffix: str) -> tuple[int, int, Format]:
    """(base, exponent, format) of a suffix."""
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix], Format.DECIMAL_SI
    if suffix in _BINARY:
        return 2, _BINARY[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in 'eE' and _EXPONENT.match(
            suffix[1:]):
        exponent = int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            raise _invalid(text, 'the exponent is beyond +-%d'
                           % MAX_EXPONENT)
        return 10, exponent, Format.DECIMAL_EXPONENT
    raise _invalid(text, 'unknown suffix %r (Ki..Ei, n u m k M G T P E, '
                   'or e<exponent>)' % suffix[:16])


def _fast(positive: bool, whole: str, fraction: str, base: int,
          exponent: int, text: str) -> tuple[Fraction, str] | None:
    """(value, text kept) when ``ParseQuantity``'s int64 fast path takes
    the quantity, else None. The fast path keeps the original text when
    its mantissa cannot be shortened (``''`` otherwise)."""
    if base == 10:
        precision = 18 - len(whole) - len(fraction)
        scale = exponent
    elif not fraction:
        precision = 15 - len(whole) - exponent * 3 // 10 - 1
        scale = 0
    else:
        return None
    scale -= len(fraction)
    if precision < 0 or scale < -9:
        return None
    shifted = whole + fraction
    mantissa = int(shifted)
    result = mantissa << exponent if base == 2 else mantissa
    if result > _MAX_INT64:
        return None
    if not positive:
        result = -result
    if base == 2:
        return Fraction(result), text if mantissa & 7 else ''
    kept = (scale % 3 == 0 and not shifted.endswith('000')
            and shifted[0] != '0')
    return Fraction(result) * Fraction(10) ** scale, text if kept else ''


def parse(text: Any) -> Quantity:
    """A quantity from its text (a JSON number is read as its text).

    :raises InvalidQuantity: naming the text and what is wrong with it.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise _invalid(repr(text), 'a quantity is a string or an integer')
    if isinstance(text, int):
        if abs(text) >= 10 ** (MAX_TEXT - 1):
            raise _invalid('(an integer)', 'more than %d digits'
                           % (MAX_TEXT - 1))
        text = str(text)
    if not text:
        raise _invalid(text, 'it is empty')
    if len(text) > MAX_TEXT:
        raise _invalid(text, 'longer than %d characters' % MAX_TEXT)
    if text == '0':
        return Quantity(Fraction(0), Format.DECIMAL_SI, '0')
    positive, whole, fraction, suffix = _scan(text)
    base, exponent, fmt = _suffix(text, suffix)
    fast = _fast(positive, whole, fraction, base, exponent, text)
    if fast is not None:
        return Quantity(fast[0], fmt, fast[1])
    amount = Fraction(int(whole + fraction), 10 ** len(fraction))
    amount *= Fraction(base) ** exponent
    if amount:
        amount = Fraction(math.ceil(amount * _NANO), _NANO)
    if fmt is Format.BINARY_SI:
        amount = min(amount, Fraction(MAX_BINARY))
        if amount < 1:
            fmt = Format.DECIMAL_SI
    return Quantity(amount if positive else -amount, fmt)


def _decimal_text(value: Fraction, fmt: Format) -> str:
    mantissa = value.numerator
    exponent = 0
    if value.denominator != 1:
        mantissa = math.ceil(value * _NANO)
        exponent = -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if fmt is Format.DECIMAL_SI and exponent in _DECIMAL_SUFFIX:
        return '%d%s' % (mantissa, _DECIMAL_SUFFIX[exponent])
    if exponent == 0:
        return str(mantissa)
    return '%de%d' % (mantissa, exponent)


def canonical(quantity: Quantity | str | int) -> str:
    """The canonical text of a quantity (``Quantity.String()`` computed
    afresh).

    :raises InvalidQuantity: ``quantity`` is text that is no quantity.
    """
    if not isinstance(quantity, Quantity):
        quantity = parse(quantity)
    value = quantity.value
    if value == 0:
        return '0'
    fmt = quantity.format
    if fmt is Format.BINARY_SI and (-1024 < value < 1024
                                    or value.denominator != 1):
        fmt = Format.DECIMAL_SI
    if fmt is not Format.BINARY_SI:
        return _decimal_text(value, fmt)
    number = value.numerator
    power = 0
    while number % 1024 == 0 and power < max(_BINARY_SUFFIX):
        number //= 1024
        power += 1
    return '%d%s' % (number, _BINARY_SUFFIX.get(power, ''))


def served(text: str | int) -> str:
    """The text kube-apiserver stores and returns for ``text``.

    :raises InvalidQuantity: the server would refuse it (400).
    """
    quantity = parse(text)
    return quantity.kept or canonical(quantity)


def value(text: Any) -> Fraction:
    """The exact value of a quantity text.

    :raises InvalidQuantity: naming the text.
    """
    return parse(text).value


def equal(a: Any, b: Any) -> bool:
    """Whether two quantity texts have the same value (False when either
    is no quantity)."""
    try:
        return value(a) == value(b)
    except exception.InvalidQuantity:
        return False


def binary(amount: int) -> str:
    """Canonical text of a whole number of bytes (or of any binary
    amount): ``binary(24 << 30)`` is ``24Gi``."""
    return canonical(Quantity(Fraction(amount), Format.BINARY_SI))


def mebibytes(mib: int) -> str:
    """Canonical text of ``mib`` MiB: ``mebibytes(24576)`` is ``24Gi``."""
    return binary(mib << 20)


def decimal(amount: int | Fraction) -> str:
    """Canonical decimal SI text: ``decimal(304)`` is ``304``,
    ``decimal(1000)`` is ``1k``."""
    return canonical(Quantity(Fraction(amount), Format.DECIMAL_SI))


# --- where resource.k8s.io/v1 objects hold quantities ------------------------

#: ``*`` is every entry of a list or every value of a map
Path = tuple[str, ...]

_CAPACITY: tuple[Path, ...] = (
    ('value',), ('requestPolicy', 'default'),
    ('requestPolicy', 'validValues', '*'),
    ('requestPolicy', 'validRange', 'min'),
    ('requestPolicy', 'validRange', 'max'),
    ('requestPolicy', 'validRange', 'step'))

#: the quantities of a ResourceSlice
SLICE_PATHS: tuple[Path, ...] = tuple(
    ('spec', 'devices', '*', 'capacity', '*') + p for p in _CAPACITY) + (
    ('spec', 'devices', '*', 'consumesCounters', '*', 'counters', '*',
     'value'),
    ('spec', 'sharedCounters', '*', 'counters', '*', 'value'))

#: the quantities of a ResourceClaim's ``spec`` (and of a template's
#: ``spec.spec``), relative to that spec
CLAIM_SPEC_PATHS: tuple[Path, ...] = (
    ('devices', 'requests', '*', 'exactly', 'capacity', 'requests', '*'),
    ('devices', 'requests', '*', 'firstAvailable', '*', 'capacity',
     'requests', '*'))

#: the quantities of a ResourceClaim's ``status``, relative to it
CLAIM_STATUS_PATHS: tuple[Path, ...] = (
    ('allocation', 'devices', 'results', '*', 'consumedCapacity', '*'),)


def _map(node: Any, path: Sequence[str], change: Callable[[Any], Any]
         ) -> Any:
    if not path:
        return change(node)
    head, rest = path[0], path[1:]
    if head == '*':
        if isinstance(node, list):
            return [_map(item, rest, change) for item in node]
        if isinstance(node, dict):
            return {k: _map(v, rest, change) for k, v in node.items()}
        return node
    if isinstance(node, dict) and head in node:
        node = dict(node)
        node[head] = _map(node[head], rest, change)
    return node


def map_fields(obj: Any, paths: Sequence[Path],
               change: Callable[[Any], Any]) -> Any:
    """A copy of ``obj`` with ``change`` applied to the value at each of
    ``paths`` that exists (``obj`` itself is left alone).

    :raises: whatever ``change`` raises.
    """
    for path in paths:
        obj = _map(obj, path, change)
    return obj


__all__ = ['CLAIM_SPEC_PATHS', 'CLAIM_STATUS_PATHS', 'Format', 'MAX_BINARY',
           'MAX_EXPONENT', 'MAX_TEXT', 'Quantity', 'SLICE_PATHS', 'binary',
           'canonical', 'decimal', 'equal', 'map_fields', 'mebibytes',
           'parse', 'served', 'value']
