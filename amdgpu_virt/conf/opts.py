"""Entry point for ``oslo-config-generator`` (namespace ``amdgpu_virt``).

Importing this module must not need any optional dependency: option
modules import only oslo.config.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from oslo_config import cfg

#: Option modules, one per group, in the order the sample file lists them.
_MODULES = (
    'inventory',
    'sharing',
    'policy',
    'nova',
    'kubernetes',
    'pool',
    'scheduler',
    'dra',
    'health',
    'telemetry',
)


def modules() -> list[ModuleType]:
    return [importlib.import_module('amdgpu_virt.conf.%s' % name)
            for name in _MODULES]


def list_opts() -> list[tuple[str | cfg.OptGroup, list[cfg.Opt]]]:
    result: list[tuple[str | cfg.OptGroup, list[cfg.Opt]]] = []
    for module in modules():
        result.extend(module.list_opts())
    return result
