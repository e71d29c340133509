"""The Nova backend (stevedore ``amdgpu_virt.backends``, name ``nova``).

One object that turns inventories and the role ledger into what Nova needs
(``[pci]`` config, aliases, GIM/vfio host files, flavors) and reads back
what Nova reports in Placement (audit, drain check, consumers of a GPU).
Rendering is pure; only the Placement and compute API methods talk to a
cloud, through openstacksdk, and only :meth:`sync_flavors` writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt.ledger import Ledger
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.nova import audit as nova_audit
from amdgpu_virt.nova import client
from amdgpu_virt.nova import drain
from amdgpu_virt.nova import flavors
from amdgpu_virt.nova import gim
from amdgpu_virt.nova import naming
from amdgpu_virt.nova import pci
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.placement import PlacementReader


class NovaBackend:
    """Nova PCI passthrough and Placement for amdgpu_virt.

    :param conf: configuration with the ``[nova]`` options registered.
    :param connection: an openstacksdk connection; made from ``[nova]``
        options on first use when not given.
    :raises ConfigError: a naming template is invalid (naming the option).
    """

    name = 'nova'

    def __init__(self, conf: cfg.ConfigOpts, connection: Any = None) -> None:
        self.conf = conf
        self.naming = naming.Naming.from_conf(conf)
        self._connection = connection

    @property
    def connection(self) -> Any:
        if self._connection is None:
            self._connection = client.connect(self.conf)
        return self._connection

    def _service(self, name: str, title: str) -> Any:
        """``connection.<name>``, whose creation asks the service for its
        versions.

        :raises ServiceUnreachable: naming the service, the endpoint and
            the options that choose it.
        """
        try:
            return getattr(self.connection, name)
        except exception.AmdgpuVirtError:
            raise
        except Exception as err:  # keystoneauth/openstacksdk discovery
            group = self.conf.nova
            endpoint = getattr(group, '%s_endpoint' % name)
            if group.cloud:
                where = 'the endpoint of cloud %s' % group.cloud
                options = '[nova] cloud and its clouds.yaml entry'
            else:
                where = endpoint or 'no endpoint'
                options = '[nova] %s_endpoint and token' % name
            raise exception.ServiceUnreachable(
                service=title, where=where, options=options,
                reason='%s: %s' % (type(err).__name__,
                                   str(err).rstrip('.'))) from None

    def reader(self) -> PlacementReader:
        return PlacementReader(self._service('placement', 'Placement'))

    # -- pure rendering ---------------------------------------------------

    def plan(self, inventory: HostInventory, ledger: Ledger | None = None,
             host: str | None = None) -> nova_plan.HostPlan:
        """What Nova may use on the host (see :mod:`amdgpu_virt.nova.plan`).
        """
        return nova_plan.plan_host(inventory, self.naming, ledger, host,
                                   self.conf.nova.dedicated_device_type)

    def render_compute(self, inventory: HostInventory,
                       ledger: Ledger | None = None,
                       host: str | None = None) -> str:
        """The ``nova.conf.d`` snippet of a compute host.

        :raises NovaConfigError: naming the host and what is wrong.
        """
        group = self.conf.nova
        return pci.render_compute(
            self.plan(inventory, ledger, host), group.numa_policy,
            group.managed, group.extra_spec_tags,
            pci.host_functions(inventory))

    def alias_entries(self, ledger: Ledger | None = None,
                      inventories: Iterable[HostInventory] = ()
                      ) -> tuple[dict[str, Any], ...]:
        group = self.conf.nova
        specs = []
        if ledger is not None:
            specs += pci.ledger_alias_specs(ledger, self.naming,
                                            group.dedicated_device_type)
        for inventory in inventories:
            specs += [a for o in self.plan(inventory).offers
                      for a in pci.aliases_of(o)]
        return pci.aliases(specs, group.numa_policy)

    def render_aliases(self, ledger: Ledger | None = None,
                       inventories: Iterable[HostInventory] = ()) -> str:
        """``[pci] alias`` for API, scheduler and conductor hosts."""
        return pci.render_aliases(self.alias_entries(ledger, inventories))

    def render_host_config(self, inventory: HostInventory,
                           ledger: Ledger | None = None,
                           host: str | None = None) -> gim.HostConfig:
        """GIM and vfio-pci files for the host's next boot."""
        return gim.render_host(inventory, ledger, host)

    # -- cloud APIs ---------------------------------------------------------

    def audit(self, plans: Sequence[nova_plan.HostPlan],
              inventories: Iterable[HostInventory] = ()
              ) -> nova_audit.AuditReport:
        """Compare Placement with the plans (read-only), and whole-GPU
        alias types with the inventories given."""
        return nova_audit.audit(plans, self.reader(), inventories)

    def drain_check(self, host: str, gpu: PciAddress | str
                    ) -> drain.DrainPlan:
        """Refuse while an instance holds the GPU; else the steps."""
        return drain.drain_check(self.reader(), host, gpu)

    def sync_flavors(self, specs: Iterable[flavors.FlavorSpec],
                     replace: bool = False
                     ) -> tuple[flavors.FlavorChange, ...]:
        return flavors.sync(self._service('compute', 'Nova compute'), specs,
                            replace)

    # -- what a role change workflow asks of a side -----------------------

    def consumers(self, host: str, address: PciAddress) -> tuple[str, ...]:
        """Placement consumers holding the GPU (empty when none)."""
        reader = self.reader()
        provider = reader.provider_by_name(
            naming.provider_name(host, str(address)))
        if provider is None:
            return ()
        return tuple(sorted(reader.provider_allocations(provider.uuid)))

    def is_offered(self, host: str, address: PciAddress) -> bool:
        """Nova reports a provider for the GPU."""
        return self.reader().provider_by_name(
            naming.provider_name(host, str(address))) is not None

    def is_withdrawn(self, host: str, address: PciAddress) -> bool:
        return not self.is_offered(host, address)
