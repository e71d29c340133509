"""The allocation-candidates query Nova's scheduler sends for a flavor.

Built by Nova 34's own code, the way the scheduler does it with
``[filter_scheduler] pci_in_placement = True``: the flavor's
``pci_passthrough:alias`` is translated with the configured ``[pci] alias``
entries (``nova.pci.request``), every requested device becomes its own
request group (``RequestSpec.generate_request_groups_from_pci_requests``)
and ``nova.scheduler.utils.resources_from_request_spec`` turns the request
spec into the ``GET /allocation_candidates`` query string. Used by the
wide-VM tests and ``bench/nova_wide.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
import contextlib
from typing import Any
from urllib import parse

from tests.functional.fixtures import nova_env

from amdgpu_virt.nova import flavors
from amdgpu_virt.nova import pci

if nova_env.AVAILABLE:
    import nova.conf
    from nova import context as nova_context
    from nova import objects
    from nova.pci import request as pci_request
    from nova.scheduler import utils as scheduler_utils

    objects.register_all()


@contextlib.contextmanager
def nova_aliases(aliases: Iterable[Mapping[str, Any]]) -> Iterator[None]:
    """Nova's ``[pci] alias`` and ``pci_in_placement`` set, then reset."""
    conf = nova.conf.CONF
    conf.set_override('alias', [pci.dumps(a) for a in aliases], group='pci')
    conf.set_override('pci_in_placement', True, group='filter_scheduler')
    pci_request.get_alias_from_config.cache_clear()
    try:
        yield
    finally:
        conf.clear_override('alias', group='pci')
        conf.clear_override('pci_in_placement', group='filter_scheduler')
        pci_request.get_alias_from_config.cache_clear()


def query(spec: flavors.FlavorSpec) -> list[tuple[str, str]]:
    """The query parameters Nova sends for ``spec`` (inside
    :func:`nova_aliases`)."""
    flavor = objects.Flavor(
        name=spec.name, flavorid=spec.name, id=1, vcpus=spec.vcpus,
        memory_mb=spec.ram_mib, root_gb=spec.disk_gb, ephemeral_gb=0,
        swap=0, extra_specs=spec.extra_specs())
    request_spec = scheduler_utils.request_spec_for_limits(flavor,
                                                           is_bfv=False)
    request_spec.image = objects.ImageMeta(
        properties=objects.ImageMetaProps())
    resources = scheduler_utils.resources_from_request_spec(
        nova_context.get_admin_context(), request_spec, None)
    return parse.parse_qsl(resources.to_querystring())


def request_groups(params: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Suffix -> ``resources`` of every numbered request group."""
    return {key[len('resources'):]: value for key, value in params
            if key.startswith('resources') and key != 'resources'}
