"""Read-only Placement access through openstacksdk, with a call counter.

Only GET requests are made here. Every request is counted
(:attr:`PlacementReader.calls`) so that the audit can report, and tests can
assert, how many API calls a run cost.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception

LOG = logging.getLogger(__name__)

#: Placement microversion used (in_tree for allocation candidates: 1.31,
#: all resources and traits in provider summaries: 1.27 and 1.17).
MICROVERSION = '1.39'
PCI_TRAIT = 'COMPUTE_MANAGED_PCI_DEVICE'


@dataclasses.dataclass(frozen=True)
class Provider:
    uuid: str
    name: str
    root_uuid: str
    parent_uuid: str | None = None
    generation: int = 0


@dataclasses.dataclass(frozen=True)
class ProviderState:
    """Inventories (total per resource class), usage and traits."""

    totals: Mapping[str, int]
    used: Mapping[str, int]
    traits: frozenset[str]


class PlacementReader:
    """GET-only client of the Placement API.

    :param adapter: ``connection.placement`` of an openstacksdk connection
        (any keystoneauth adapter with ``get``).
    """

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.calls = 0

    def _get(self, path: str, params: Mapping[str, Any] | None = None,
             ok_missing: bool = False, tolerate: str | None = None
             ) -> dict[str, Any] | None:
        self.calls += 1
        try:
            response = self.adapter.get(path, params=dict(params or {}),
                                        microversion=MICROVERSION,
                                        raise_exc=False)
        except Exception as err:  # keystoneauth connection errors
            raise exception.PlacementUnreachable(
                request='GET %s' % path, reason='%s: %s' % (
                    type(err).__name__, err)) from None
        if ok_missing and response.status_code == 404:
            return None
        if tolerate and response.status_code == 400 \
                and tolerate in response.text:
            return None
        if response.status_code != 200:
            raise exception.PlacementError(
                request='GET %s %s' % (path, dict(params or {})),
                reason='HTTP %s: %s' % (response.status_code,
                                        response.text[:500]))
        result: dict[str, Any] = response.json()
        return result

    @staticmethod
    def _provider(raw: Mapping[str, Any]) -> Provider:
        return Provider(uuid=raw['uuid'], name=raw['name'],
                        root_uuid=raw.get('root_provider_uuid') or raw['uuid'],
                        parent_uuid=raw.get('parent_provider_uuid'),
                        generation=int(raw.get('generation') or 0))

    def pci_providers(self) -> list[Provider]:
        """Every provider Nova made for a PCI device (one call)."""
        body = self._get('/resource_providers', {'required': PCI_TRAIT})
        assert body is not None
        return sorted((self._provider(p) for p in body['resource_providers']),
                      key=lambda p: p.name)

    def provider_by_name(self, name: str) -> Provider | None:
        body = self._get('/resource_providers', {'name': name})
        assert body is not None
        found = body['resource_providers']
        return self._provider(found[0]) if found else None

    def tree_states(self, root_uuid: str, resource_class: str
                    ) -> dict[str, ProviderState] | None:
        """States of every provider of a tree in one call, or None.

        Uses the provider summaries of an allocation-candidates query for
        one unit of ``resource_class`` in the tree; None when the tree has
        no free unit of it, or Placement does not know the class (then read
        providers one by one). Totals are the
        capacities Placement reports, ``(total - reserved) x ratio``.
        """
        body = self._get('/allocation_candidates', {
            'resources': '%s:1' % resource_class, 'in_tree': root_uuid,
            'limit': 1}, tolerate='No such resource class')
        if body is None or not body.get('allocation_requests'):
            return None
        states = {}
        for rp_uuid, summary in body['provider_summaries'].items():
            resources = summary.get('resources', {})
            states[rp_uuid] = ProviderState(
                totals={rc: int(v['capacity']) for rc, v in resources.items()},
                used={rc: int(v['used']) for rc, v in resources.items()},
                traits=frozenset(summary.get('traits', ())))
        return states

    def provider_state(self, rp_uuid: str) -> ProviderState:
        """Inventories, usages and traits of one provider (three calls)."""
        inv = self._get('/resource_providers/%s/inventories' % rp_uuid) or {}
        usages = self._get('/resource_providers/%s/usages' % rp_uuid) or {}
        traits = self._get('/resource_providers/%s/traits' % rp_uuid) or {}
        return ProviderState(
            totals={rc: int(v['total']) for rc, v in
                    inv.get('inventories', {}).items()},
            used={rc: int(v) for rc, v in usages.get('usages', {}).items()},
            traits=frozenset(traits.get('traits', ())))

    def provider_totals(self, rp_uuid: str) -> dict[str, int]:
        """Inventory total per resource class of one provider (one call)."""
        inv = self._get('/resource_providers/%s/inventories' % rp_uuid,
                        ok_missing=True) or {}
        return {rc: int(v['total']) for rc, v in
                inv.get('inventories', {}).items()}

    def provider_allocations(self, rp_uuid: str
                             ) -> dict[str, dict[str, int]]:
        """Consumer uuid -> resources it holds on the provider."""
        body = self._get('/resource_providers/%s/allocations' % rp_uuid,
                         ok_missing=True) or {}
        return {consumer: {rc: int(n) for rc, n in
                           alloc.get('resources', {}).items()}
                for consumer, alloc in body.get('allocations', {}).items()}
