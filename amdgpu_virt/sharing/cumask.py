"""CU mask codecs: ``HSA_CU_MASK``, ``ROC_GLOBAL_CU_MASK`` and ID lists.

A CU set is a Python int used as a bitmap: bit i set = CU i enabled
(the same convention as :mod:`amdgpu_virt.sharing.allocator`).

``HSA_CU_MASK`` is read once by the ROCm runtime (ROCr) when it starts::

    ID       = [0-9]+
    ID_list  = (ID | ID-ID) [, (ID | ID-ID)]*     e.g. 0,2-4,7
    GPU_list = ID_list
    CU_list  = 0x[0-9a-f]+ | ID_list              e.g. 0x337F (LSB = CU 0)
    CU_Set   = GPU_list : CU_list
    value    = CU_Set [; CU_Set]*        e.g. 0,2:0-15,32-47; 3-9:0x337F

ROCr ignores all whitespace (even inside numbers), is case-insensitive,
and treats a repeated GPU or CU id, an inverted range and a mask that
enables no CU (``0x0``) as syntax errors; it stops at the first bad set,
ignoring that set and all that follow, without failing. A mask that is
silently cut short would hand a consumer every CU of a GPU, so the parser
here raises :class:`~amdgpu_virt.exception.MaskSyntaxError` instead, and
the encoders never produce a value ROCr would reject.

What this parser accepts is ROCr's grammar above, with ROCr's tolerance of
whitespace anywhere, of upper or lower case and of one trailing ``;`` or
``,``. It rejects what ROCr accepts only by accident of its implementation
(a sign or an empty id such as ``-3`` meaning ``0-3``, a third ``:``
part), and ids beyond the GPU when the caller gives the CU or GPU count
(ROCr would drop them silently).

``ROC_GLOBAL_CU_MASK`` (read by the HIP runtime of CLR) is one hex bitmap
for every device, with no GPU selector, ``0x`` optional; it also lowers the
CU count HIP reports. CLR reads it in chunks of 8 hex digits from the right,
ignores digits beyond the GPU's CUs, and drops the whole mask (no
restriction) when a chunk is not hex or the mask enables every CU: the
parser here rejects what CLR would drop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import NoReturn

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator

HSA_CU_MASK = 'HSA_CU_MASK'
ROC_GLOBAL_CU_MASK = 'ROC_GLOBAL_CU_MASK'

#: Highest id accepted when the caller gives no bound (a guard against
#: values such as ``0-999999999`` that would build huge bitmaps).
MAX_ID = 65535

#: Whitespace as ROCr strips it (C ``isspace`` in the classic locale).
_SPACE = frozenset(' \t\n\v\f\r')
_DIGITS = frozenset('0123456789')
_HEX = frozenset('0123456789abcdefABCDEF')


@dataclasses.dataclass(frozen=True)
class CuSet:
    """One ``GPU_list:CU_list`` of ``HSA_CU_MASK``.

    :ivar gpus: GPU indices (after ``ROCR_VISIBLE_DEVICES`` reordering),
        sorted, not empty.
    :ivar cus: bitmap of enabled CUs, not zero.
    :ivar hex: the CU list is written as ``0x<hex>`` rather than as ids.
    """

    gpus: tuple[int, ...]
    cus: int
    hex: bool = False


@dataclasses.dataclass(frozen=True)
class HsaCuMask:
    """A decoded ``HSA_CU_MASK`` value: its CU sets in written order."""

    sets: tuple[CuSet, ...]

    def mask_for(self, gpu: int) -> int | None:
        """CU bitmap for GPU index ``gpu``; None when it is unrestricted."""
        for cu_set in self.sets:
            if gpu in cu_set.gpus:
                return cu_set.cus
        return None

    def as_dict(self) -> dict[int, int]:
        """GPU index -> CU bitmap."""
        return {gpu: cu_set.cus for cu_set in self.sets
                for gpu in cu_set.gpus}

    def encode(self) -> str:
        return encode_hsa_cu_mask(self)


# --- ID lists ----------------------------------------------------------------

def format_id_list(cus: int | Iterable[int]) -> str:
    """Write CU (or GPU) ids as a canonical ID list, e.g. ``0-3,8,10-12``.

    Ids are sorted and adjacent ids merged into ranges.

    :param cus: a bitmap or an iterable of ids.
    :raises SharingError: no id (ROCr rejects an empty list) or a
        negative id.
    """
    if isinstance(cus, int):
        mask = cus
    else:
        mask = 0
        for cu in cus:
            if cu < 0:
                raise exception.SharingError(
                    reason='negative id %d in an ID list' % cu)
            mask |= 1 << cu
    if mask < 0:
        raise exception.SharingError(
            reason='negative bitmap %d for an ID list' % mask)
    if not mask:
        raise exception.SharingError(
            reason='an ID list needs at least one id (ROCr rejects an '
                   'empty list)')
    parts = []
    for start, length in allocator.runs(mask):
        if length == 1:
            parts.append(str(start))
        else:
            parts.append('%d-%d' % (start, start + length - 1))
    return ','.join(parts)


class _Text:
    """A value with whitespace removed that still knows the original
    position of each remaining character (for error messages)."""

    def __init__(self, variable: str, value: str) -> None:
        self.variable = variable
        self.value = value
        self.where = [i for i, c in enumerate(value) if c not in _SPACE]
        self.compact = ''.join(value[i] for i in self.where)

    def position(self, at: int) -> int:
        if at < len(self.where):
            return self.where[at]
        return len(self.value)

    def fail(self, at: int, reason: str) -> NoReturn:
        raise exception.MaskSyntaxError(
            variable=self.variable, value=self.value,
            position=self.position(at), reason=reason)


def _parse_ids(text: _Text, start: int, end: int, what: str,
               limit: int, context: str) -> int:
    """Parse ``text.compact[start:end]`` as an ID list into a bitmap.

    :param what: ``'CU'`` or ``'GPU'`` (for messages).
    :param limit: ids must be below this.
    :param context: prefix of error reasons (names the bad set).
    """
    body = text.compact[start:end]
    if body.endswith(','):
        body = body[:-1]   # ROCr tolerates one trailing separator
    if not body:
        text.fail(start, '%sempty %s list' % (context, what))
    mask = 0
    offset = start
    for element in body.split(','):
        here = offset
        offset += len(element) + 1
        if not element:
            text.fail(here, '%sempty %s id' % (context, what))
        low_text, dash, high_text = element.partition('-')
        numbers = [(low_text, here)]
        if dash:
            numbers.append((high_text, here + len(low_text) + 1))
        for number, at in numbers:
            if not number or not set(number) <= _DIGITS:
                text.fail(at, '%s%r is not a %s id or range of ids '
                          '(decimal digits, ID or ID-ID)'
                          % (context, element, what))
            if len(number) > len(str(limit)):
                text.fail(at, '%s%s id %s is beyond %d'
                          % (context, what, number, limit - 1))
        low = int(low_text)
        high = int(high_text) if dash else low
        if high < low:
            text.fail(here, '%sinverted range %s' % (context, element))
        if high >= limit:
            text.fail(here, '%s%s id %d is beyond %d'
                      % (context, what, high, limit - 1))
        bits = ((1 << (high - low + 1)) - 1) << low
        repeated = mask & bits
        if repeated:
            text.fail(here, '%s%s id %d is repeated'
                      % (context, what, (repeated & -repeated).bit_length()
                         - 1))
        mask |= bits
    return mask


def parse_id_list(value: str, variable: str = 'CU list',
                  limit: int | None = None) -> int:
    """Parse an ID list such as ``0-3,8,10-12`` into a bitmap.

    :param variable: what the value is (named in errors), e.g. an
        annotation key or an environment variable.
    :param limit: number of CUs of the GPU; ids must be below it.
    :raises MaskSyntaxError: empty list, bad id or range, inverted range,
        repeated id, or an id at or beyond ``limit``.
    """
    text = _Text(variable, value)
    return _parse_ids(text, 0, len(text.compact), 'CU',
                      _bound(limit), '')


def _bound(limit: int | None) -> int:
    return MAX_ID + 1 if limit is None else min(limit, MAX_ID + 1)


# --- HSA_CU_MASK -------------------------------------------------------------

def _parse_hex(text: _Text, start: int, end: int, limit: int,
               context: str) -> int:
    """``text.compact[start:end]`` is ``0x<hex>``."""
    if text.compact[start] != '0':
        text.fail(start, '%sa hex CU list starts with 0x' % context)
    return _hex_bits(text, start + 2, end, limit, context, start)


def _hex_bits(text: _Text, start: int, end: int, limit: int, context: str,
              mask_at: int) -> int:
    """Hex digits ``text.compact[start:end]`` as a non-zero bitmap below
    ``1 << limit``; faults of the whole mask are reported at ``mask_at``."""
    digits = text.compact[start:end]
    if not digits:
        text.fail(start, '%sno hex digits' % context)
    for i, c in enumerate(digits):
        if c not in _HEX:
            text.fail(start + i, '%s%r is not a hex digit' % (context, c))
    if len(digits.lstrip('0')) > (limit + 3) // 4:
        text.fail(mask_at, '%shex mask enables CUs beyond %d'
                  % (context, limit - 1))
    mask = int(digits, 16)
    if not mask:
        text.fail(mask_at, '%sthe mask enables no CU (0x0)' % context)
    if mask >> limit:
        text.fail(mask_at, '%shex mask enables CU %d, beyond %d'
                  % (context, mask.bit_length() - 1, limit - 1))
    return mask


def parse_hsa_cu_mask(value: str, cu_count: int | None = None,
                      gpu_count: int | None = None,
                      variable: str = HSA_CU_MASK) -> HsaCuMask:
    """Parse an ``HSA_CU_MASK`` value.

    :param cu_count: CUs per GPU; CU ids must be below it when given.
    :param gpu_count: visible GPUs; GPU indices must be below it when given.
    :param variable: name used in error messages.
    :returns: the CU sets in written order.
    :raises MaskSyntaxError: naming the variable, the value, the first bad
        set and the position of the fault in the value.
    """
    text = _Text(variable, value)
    compact = text.compact
    if not compact:
        text.fail(0, 'no CU set (an empty mask restricts nothing)')
    end = len(compact)
    if compact.endswith(';'):
        end -= 1   # ROCr tolerates one trailing separator
    cu_limit = _bound(cu_count)
    gpu_limit = _bound(gpu_count)
    seen_gpus = 0
    sets = []
    start = 0
    for number, raw in enumerate(compact[:end].split(';'), 1):
        set_end = start + len(raw)
        shown = text.value[text.position(start):
                           text.position(max(set_end - 1, start)) + 1]
        context = 'CU set %d %r: ' % (number, shown.strip())
        if not raw:
            text.fail(start, context + 'empty CU set')
        colon = raw.find(':')
        if colon < 0:
            text.fail(start, context + 'expected GPU_list:CU_list')
        if ':' in raw[colon + 1:]:
            text.fail(start + colon + 1 + raw[colon + 1:].index(':'),
                      context + 'more than one ":"')
        cu_start = start + colon + 1
        if raw[colon + 2:colon + 3].upper() == 'X':
            cus = _parse_hex(text, cu_start, set_end, cu_limit, context)
            is_hex = True
        else:
            cus = _parse_ids(text, cu_start, set_end, 'CU', cu_limit,
                             context)
            is_hex = False
        gpus = _parse_ids(text, start, start + colon, 'GPU', gpu_limit,
                          context)
        repeated = gpus & seen_gpus
        if repeated:
            text.fail(start, context + 'GPU %d already has a CU set'
                      % ((repeated & -repeated).bit_length() - 1))
        seen_gpus |= gpus
        sets.append(CuSet(gpus=tuple(allocator.bits(gpus)), cus=cus,
                          hex=is_hex))
        start = set_end + 1
    return HsaCuMask(sets=tuple(sets))


def _check_set(cu_set: CuSet) -> None:
    if not cu_set.gpus:
        raise exception.SharingError(
            reason='HSA_CU_MASK set with no GPU (ROCr rejects it)')
    if len(set(cu_set.gpus)) != len(cu_set.gpus) or \
            any(g < 0 for g in cu_set.gpus):
        raise exception.SharingError(
            reason='HSA_CU_MASK set with repeated or negative GPU index %s'
            % (cu_set.gpus,))
    if cu_set.cus <= 0:
        raise exception.SharingError(
            reason='HSA_CU_MASK set for GPU %s enables no CU (ROCr rejects '
                   'it)' % format_id_list(cu_set.gpus))


def encode_hsa_cu_mask(mask: HsaCuMask | Mapping[int, int]) -> str:
    """Write an ``HSA_CU_MASK`` value.

    :param mask: a decoded mask, or GPU index -> CU bitmap (written one set
        per GPU in index order, CU ids as an ID list: ``0:0-75;1:0-75``).
    :raises SharingError: no set, a set with no GPU or no CU, or a GPU in
        two sets: values ROCr would reject or cut short.
    """
    if isinstance(mask, HsaCuMask):
        sets = mask.sets
    else:
        sets = tuple(CuSet(gpus=(gpu, ), cus=cus)
                     for gpu, cus in sorted(mask.items()))
    if not sets:
        raise exception.SharingError(
            reason='HSA_CU_MASK needs at least one CU set (an empty value '
                   'restricts nothing)')
    seen: set[int] = set()
    parts = []
    for cu_set in sets:
        _check_set(cu_set)
        again = seen.intersection(cu_set.gpus)
        if again:
            raise exception.SharingError(
                reason='HSA_CU_MASK lists GPU %d in two sets (ROCr rejects '
                       'it)' % min(again))
        seen.update(cu_set.gpus)
        if cu_set.hex:
            cus = '0x%x' % cu_set.cus
        else:
            cus = format_id_list(cu_set.cus)
        parts.append('%s:%s' % (format_id_list(cu_set.gpus), cus))
    return ';'.join(parts)


def container_hsa_cu_mask(masks: Iterable[int]) -> str:
    """``HSA_CU_MASK`` of a container, from the CU bitmaps of its GPUs in
    container-local order (``0:0-75;1:0-75``).

    :raises SharingError: a GPU with no CU.
    """
    return encode_hsa_cu_mask(dict(enumerate(masks)))


def canonical_hsa_cu_mask(value: str, cu_count: int | None = None,
                          gpu_count: int | None = None) -> str:
    """The canonical spelling of an ``HSA_CU_MASK`` value."""
    return encode_hsa_cu_mask(parse_hsa_cu_mask(value, cu_count, gpu_count))


# --- ROC_GLOBAL_CU_MASK ------------------------------------------------------

def encode_global_cu_mask(cus: int) -> str:
    """Write a ``ROC_GLOBAL_CU_MASK`` value (``0x<hex>``, LSB = CU 0).

    :raises SharingError: the bitmap enables no CU.
    """
    if cus <= 0:
        raise exception.SharingError(
            reason='ROC_GLOBAL_CU_MASK must enable at least one CU')
    return '0x%x' % cus


def parse_global_cu_mask(value: str, cu_count: int | None = None,
                         variable: str = ROC_GLOBAL_CU_MASK) -> int:
    """Parse a ``ROC_GLOBAL_CU_MASK`` value into a CU bitmap.

    Whitespace around and inside the value is ignored; the ``0x`` prefix
    is optional.

    :raises MaskSyntaxError: not hex, no CU enabled, or CUs beyond
        ``cu_count``.
    """
    text = _Text(variable, value)
    start = 2 if text.compact[:2].upper() == '0X' else 0
    return _hex_bits(text, start, len(text.compact), _bound(cu_count), '',
                     0)
