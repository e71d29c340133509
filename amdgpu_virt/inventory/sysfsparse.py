"""Pure parsers for the values of sysfs files.

Each parser takes the raw content of one file (bytes or text) and the path
it came from, and returns a value or raises
:class:`~amdgpu_virt.exception.SysfsValueError` naming the path and the
value. They never raise anything else, whatever the input: the sysfs reader
turns the error into an :class:`~amdgpu_virt.model.InventoryWarning` and
goes on with what it could read.
"""

from __future__ import annotations

import re

from amdgpu_virt import exception

#: Longest value any parser accepts; real values are far shorter.
MAX_LENGTH = 256
_HEX_RE = re.compile(r'^(?:0[xX])?([0-9a-fA-F]{1,16})$')
_INT_RE = re.compile(r'^-?[0-9]{1,20}$')
_KEY_RE = re.compile(r'^[a-z_][a-z0-9_]{0,63}$')
_PRINTABLE_RE = re.compile(r'^[\x20-\x7e]*$')

COMPUTE_MODES = ('SPX', 'DPX', 'TPX', 'QPX', 'CPX')
MEMORY_MODES = ('NPS1', 'NPS2', 'NPS4')


def _decode(raw: bytes | str, path: str) -> str:
    """``raw`` as text (sysfs values are ASCII).

    :raises SysfsValueError: it is not ASCII, naming ``path``.
    """
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode('ascii')
    except UnicodeDecodeError:
        raise exception.SysfsValueError(
            value=raw[:MAX_LENGTH], path=path,
            reason='not ASCII text') from None


def _text(raw: bytes | str, path: str) -> str:
    """``raw`` decoded (ASCII) and stripped of surrounding whitespace."""
    text = _decode(raw, path)
    if len(text) > MAX_LENGTH:
        raise exception.SysfsValueError(
            value=text[:MAX_LENGTH] + '...', path=path,
            reason='longer than %d characters' % MAX_LENGTH)
    return text.strip()


def parse_hex(raw: bytes | str, path: str, maximum: int = 0xffff) -> int:
    """A hex number such as ``0x1002`` or ``74b5`` (``0x`` optional)."""
    text = _text(raw, path)
    match = _HEX_RE.match(text)
    if match is None:
        raise exception.SysfsValueError(value=text, path=path,
                                        reason='not a hex number')
    value = int(match.group(1), 16)
    if value > maximum:
        raise exception.SysfsValueError(
            value=text, path=path, reason='larger than 0x%x' % maximum)
    return value


def parse_int(raw: bytes | str, path: str, minimum: int = 0,
              maximum: int = 2 ** 64 - 1) -> int:
    """A decimal integer within ``minimum..maximum``."""
    text = _text(raw, path)
    if _INT_RE.match(text) is None:
        raise exception.SysfsValueError(value=text, path=path,
                                        reason='not a decimal integer')
    value = int(text)
    if not minimum <= value <= maximum:
        raise exception.SysfsValueError(
            value=text, path=path,
            reason='outside %d..%d' % (minimum, maximum))
    return value


def parse_numa_node(raw: bytes | str, path: str) -> int | None:
    """A NUMA node number; ``-1`` (unknown) gives None."""
    value = parse_int(raw, path, minimum=-1, maximum=1023)
    return None if value == -1 else value


def parse_mode(raw: bytes | str, path: str,
               allowed: tuple[str, ...]) -> str | None:
    """One partition mode (``CPX``, ``NPS4``); ``UNKNOWN`` gives None."""
    text = _text(raw, path).upper()
    if text == 'UNKNOWN':
        return None
    if text not in allowed:
        raise exception.SysfsValueError(
            value=text, path=path,
            reason='not one of %s' % ', '.join(allowed))
    return text


def parse_mode_list(raw: bytes | str, path: str,
                    allowed: tuple[str, ...]) -> tuple[str, ...]:
    """``SPX, DPX, QPX, CPX`` (comma, comma+space or space separated)."""
    text = _text(raw, path)
    modes: list[str] = []
    for token in re.split(r'[,\s]+', text.upper()):
        if not token:
            continue
        if token not in allowed:
            raise exception.SysfsValueError(
                value=text, path=path,
                reason='%r is not one of %s' % (token, ', '.join(allowed)))
        if token not in modes:
            modes.append(token)
    return tuple(modes)


def parse_unique_id(raw: bytes | str, path: str) -> str | None:
    """amdgpu's ``unique_id`` (hex): 16 lowercase hex digits; 0 gives None."""
    value = parse_hex(raw, path, maximum=2 ** 64 - 1)
    return None if value == 0 else '%016x' % value


def kfd_unique_id(value: int) -> str | None:
    """KFD's decimal ``unique_id`` as amdgpu's 16 hex digits; 0 is None."""
    if not 0 < value < 2 ** 64:
        return None
    return '%016x' % value


def parse_name(raw: bytes | str, path: str) -> str | None:
    """A printable one-line name (``product_name``); empty gives None."""
    text = _text(raw, path)
    if _PRINTABLE_RE.match(text) is None:
        raise exception.SysfsValueError(value=text, path=path,
                                        reason='not printable one-line text')
    return text or None


def parse_link_number(target: str, path: str, prefix: str = '') -> int:
    """The number a link points to (``.../iommu_groups/42`` gives 42)."""
    name = target.rstrip('/').rsplit('/', 1)[-1]
    if prefix:
        if not name.startswith(prefix):
            raise exception.SysfsValueError(
                value=target, path=path,
                reason='does not point to %s<N>' % prefix)
        name = name[len(prefix):]
    return parse_int(name, path, maximum=2 ** 31 - 1)


def parse_properties(raw: bytes | str, path: str
                     ) -> tuple[dict[str, int], list[str]]:
    """A KFD ``properties`` file: ``key value`` lines, values decimal.

    :returns: the well-formed values and a description of every line that
        was not (so the caller can warn and keep the rest).
    :raises SysfsValueError: the content is not text at all.
    """
    text = _decode(raw, path)
    values: dict[str, int] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if (len(parts) != 2 or _KEY_RE.match(parts[0]) is None
                or _INT_RE.match(parts[1]) is None):
            problems.append('line %d %r' % (number, line[:80]))
            continue
        key, value = parts[0], int(parts[1])
        if key in values:
            problems.append('line %d repeats %s' % (number, key))
            continue
        values[key] = value
    return values, problems


def decode_location_id(location_id: int, path: str) -> tuple[int, int, int]:
    """(bus, device, partition) of a KFD ``location_id``.

    bus = (loc >> 8) & 0xff, device = (loc >> 3) & 0x1f, partition = loc & 7.
    """
    if not 0 <= location_id <= 0xffff:
        raise exception.SysfsValueError(value=location_id, path=path,
                                        reason='not a 16-bit location id')
    return (location_id >> 8) & 0xff, (location_id >> 3) & 0x1f, \
        location_id & 7


def parse_token(raw: bytes | str, path: str) -> str:
    """A version-like token (``8.1.0.K``): printable, no spaces."""
    text = _text(raw, path)
    if not text or _PRINTABLE_RE.match(text) is None or ' ' in text:
        raise exception.SysfsValueError(value=text, path=path,
                                        reason='not a version string')
    return text

