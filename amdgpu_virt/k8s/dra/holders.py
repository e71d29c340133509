"""Which GPUs allocated ResourceClaims of the driver hold.

The pool side (cross-audit, move) counts a GPU as in use while a claim's
``status.allocation`` names one of its devices, whether or not the device
is still published: a withdrawn GPU keeps its claims until their pods
end. The GPU comes from the device name, which the driver derives from
the PCI address (``gpu-0000-05-00-0``, ``...-p3``, ``...-share``), and
the node from the pool name (pool = node). A result of the driver whose
device name does not parse maps to no GPU (``None``), so that callers
count it against every GPU of the node rather than guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from amdgpu_virt.model import PciAddress

_NAME = re.compile(r'^gpu-([0-9a-f]{4})-([0-9a-f]{2})-([0-9a-f]{2})-([0-7])'
                   r'(?:-p\d+)?(?:-share)?$')


def device_gpu(name: str) -> PciAddress | None:
    """The GPU of a device name of the driver, or None."""
    match = _NAME.match(name) if isinstance(name, str) else None
    if match is None:
        return None
    domain, bus, device, function = (int(g, 16) for g in match.groups())
    try:
        return PciAddress(domain, bus, device, function)
    except Exception:  # out of range: not one of ours
        return None


def claim_name(claim: Mapping[str, Any]) -> str:
    meta = claim.get('metadata') or {}
    return 'ResourceClaim %s/%s' % (meta.get('namespace', ''),
                                    meta.get('name', ''))


def held_gpus(claims: Iterable[Mapping[str, Any]], driver: str
              ) -> dict[tuple[str, PciAddress | None], set[str]]:
    """(node, GPU or None) -> names of the allocated claims holding it."""
    held: dict[tuple[str, PciAddress | None], set[str]] = {}
    for claim in claims:
        allocation = (claim.get('status') or {}).get('allocation')
        if not isinstance(allocation, Mapping):
            continue
        results = (allocation.get('devices') or {}).get('results') or []
        if not isinstance(results, list):
            continue
        for result in results:
            if not isinstance(result, Mapping) or \
                    result.get('driver') != driver:
                continue
            node = str(result.get('pool') or '')
            held.setdefault((node, device_gpu(result.get('device', ''))),
                            set()).add(claim_name(claim))
    return held
