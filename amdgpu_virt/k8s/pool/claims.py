"""Which GPUs allocated ResourceClaims of the driver hold.

The pool side (cross-audit, move) counts a GPU as in use while a claim's
``status.allocation`` names one of its devices, whether or not the device
is still published: a withdrawn GPU keeps its claims until their pods
end. The GPU comes from the device name, which the driver derives from
the PCI address (``gpu-0000-05-00-0``, ``...-p3``, ``...-share``), and
the node from the pool name (pool = node). A result of the driver whose
device name does not parse maps to no GPU (``None``), so that callers
count it against every GPU of the node rather than guess.

:class:`ClaimConsumers` is the :class:`~amdgpu_virt.k8s.pool.consumers.
ClaimSource` of the consumer view.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.pool import consumers as k8s_consumers
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


class ClaimConsumers:
    """Allocated ResourceClaims of ``driver`` as consumers of their GPUs.

    :param core_api: a ``CoreV1Api`` (its API client is reused).
    """

    def __init__(self, core_api: Any, driver: str) -> None:
        self.api = core_api
        self.driver = driver

    def claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim; none on a cluster without DRA (404)."""
        from kubernetes import client

        resource = client.ResourceV1Api(self.api.api_client)
        try:
            response = k8s_client.call(
                'LIST resourceclaims',
                resource.list_resource_claim_for_all_namespaces,
                _preload_content=False)
        except exception.KubernetesNotFound:
            return []
        return list(json.loads(response.data).get('items') or [])

    def consumers(self, node: str | None
                  ) -> list[k8s_consumers.Consumer]:
        found: dict[tuple[str, str], set[PciAddress | None]] = {}
        for (pool, gpu), names in held_gpus(self.claims(),
                                            self.driver).items():
            if node is not None and pool != node:
                continue
            for name in names:
                found.setdefault((name, pool), set()).add(gpu)
        result = []
        for (name, pool), gpus in sorted(found.items()):
            known = frozenset(g for g in gpus if g is not None)
            result.append(k8s_consumers.Consumer(
                name=name.split(' ', 1)[-1], node=pool,
                state=k8s_consumers.State.CLAIM, addresses=known,
                problem=None if None not in gpus else
                'a device of driver %s that maps to no GPU' % self.driver))
        return result


def consumer_view(core_api: Any, driver: str
                  ) -> k8s_consumers.ConsumerView:
    """The one consumer view of the Kubernetes side: pods (bound, or chosen
    by the extender and not bound yet) and ``driver``'s allocated claims.
    """
    return k8s_consumers.ConsumerView(core_api,
                                      [ClaimConsumers(core_api, driver)])
