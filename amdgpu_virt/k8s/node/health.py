"""Is a GPU unit usable on this node? Health checks of the node side.

A :data:`HealthCheck` answers for one unit; the device plugin lists a
unit whose check fails as ``Unhealthy``, and the agent and the DRA plugin
use the same checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from amdgpu_virt.k8s.node import devices

#: unit -> healthy?
HealthCheck = Callable[[devices.GpuUnit], bool]


def device_node_health(device_root: str) -> HealthCheck:
    """A health check: the unit's device nodes exist under ``device_root``.

    A GPU that fell off the bus or whose driver was unbound loses its DRM
    nodes; without ``/dev/kfd`` no GPU is usable.
    """

    def check(unit: devices.GpuUnit) -> bool:
        paths = (devices.KFD_PATH, unit.card_path, unit.render_path)
        return all(os.path.exists(os.path.join(device_root, p.lstrip('/')))
                   for p in paths)

    return check
