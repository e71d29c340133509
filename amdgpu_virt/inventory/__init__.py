"""GPU inventory: drivers that discover what a host has.

Drivers live in the ``amdgpu_virt.inventory`` stevedore namespace and are
chosen by ``[inventory] driver``.
"""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

from amdgpu_virt import plugins
from amdgpu_virt.inventory.base import InventoryDriver

NAMESPACE = 'amdgpu_virt.inventory'


def load_driver(conf: cfg.ConfigOpts, name: str | None = None,
                **kwargs: Any) -> InventoryDriver:
    """The inventory driver named by ``name`` or ``[inventory] driver``.

    :param kwargs: passed to the driver (e.g. ``root`` and ``hostname``
        of the sysfs driver).

    :raises DriverNotFound: the name is unknown or its plugin fails to load.
    """
    driver: InventoryDriver = plugins.load_driver(
        NAMESPACE, name or conf.inventory.driver, conf, **kwargs)
    return driver
