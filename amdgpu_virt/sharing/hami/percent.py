"""``amd.com/gpucores``: whole percentages of a GPU's CUs and the CU
counts they stand for."""

from __future__ import annotations

from typing import Any

from amdgpu_virt.sharing.hami.common import _fail
from amdgpu_virt.sharing.hami.names import RESOURCE_GPUCORES


def parse_percent(value: Any, field: str = RESOURCE_GPUCORES) -> int:
    """A whole percentage of a GPU's CUs, 1..100: the one validation of
    ``amd.com/gpucores``, of ``compute: 25%`` in a workload spec and of a
    pod's stated intent.

    :param value: an int, or a string of decimal digits (a Kubernetes
        quantity such as ``"25"``; ``"25%"`` is accepted too).
    :param field: names the field in the error.
    :raises HamiProtocolError: not a whole number in 1..100 (HAMi's
        webhook rejects such pods; fractions such as ``12.5`` are refused,
        not rounded).
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith('%'):
            text = text[:-1].strip()
        if text.isascii() and text.lstrip('+').isdigit() and len(text) < 5:
            number = int(text)
    if number is None or not 1 <= number <= 100:
        _fail(field, str(value),
              'must be an integer percentage between 1 and 100')
    return number


def percent_to_cus(percent: int, devcore: int, unit: int = 1) -> int:
    """CUs for ``amd.com/gpucores: <percent>`` on a GPU of ``devcore`` CUs.

    ``floor(percent * devcore / 100)`` clamped to ``[1, devcore]``, then
    rounded up to whole ``unit`` s (RDNA WGPs, ``custominfo.cuPerWGP``),
    as HAMi's AMD scheduler counts them (its device plugin hands out whole
    WGPs, so booking fewer would let the node look freer than it is).
    On a 304-CU MI300X: 1 -> 3, 25 -> 76, 33 -> 100, 50 -> 152, 100 -> 304.
    The one conversion: the extender, the webhook and workload specs all
    call it.

    :raises HamiProtocolError: percent outside 1..100 (HAMi's webhook
        rejects such pods) or a GPU without CUs.
    """
    if isinstance(percent, bool) or not isinstance(percent, int) or \
            not 1 <= percent <= 100:
        _fail(RESOURCE_GPUCORES, str(percent),
              'must be an integer percentage between 1 and 100')
    if devcore <= 0 or unit <= 0:
        _fail(RESOURCE_GPUCORES, str(percent),
              'the GPU reports %d CUs in units of %d' % (devcore, unit))
    cus = min(max(devcore * percent // 100, 1), devcore)
    if unit > 1:
        cus = min(-(-cus // unit) * unit, devcore)
    return cus


def cus_to_percent(cus: int, devcore: int, unit: int = 1) -> int:
    """The smallest whole percentage whose :func:`percent_to_cus` gives at
    least ``cus`` CUs on a GPU of ``devcore`` CUs.

    :raises HamiProtocolError: ``cus`` outside 1..devcore.
    """
    if not 1 <= cus <= devcore:
        _fail(RESOURCE_GPUCORES, str(cus),
              '%d CUs do not fit a GPU of %d CUs' % (cus, devcore))
    percent = max(1, -(-cus * 100 // devcore))
    while percent_to_cus(percent, devcore, unit) < cus:   # at most once
        percent += 1
    return percent
