"""Fleets of simulated hosts, described in YAML.

A fleet file lists :class:`~amdgpu_virt.inventory.simulate.HostSpec`
fields per host::

    hosts:
      - {hostname: gim-0, model: MI300X, gpus: 8, mode: gim-cpx}
      - {hostname: mixed-0, model: MI300X, gpus: 4,
         gpu_modes: [gim-cpx, gim-cpx, spx, vfio]}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import data
from amdgpu_virt import exception
from amdgpu_virt import yamlutil
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import HostInventory

SAMPLE_FLEET = 'sample_fleet.yaml'
_FIELDS = {f.name for f in dataclasses.fields(simulate.HostSpec)}


def specs_from_dict(raw: Any, source: str) -> list[simulate.HostSpec]:
    """Host specs from parsed YAML; errors name the host entry and field."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get('hosts'),
                                                      list):
        raise exception.SimulationError(
            reason='%s: expected a mapping with a "hosts" list' % source)
    specs = []
    names: set[str] = set()
    for i, entry in enumerate(raw['hosts']):
        where = '%s: hosts[%d]' % (source, i)
        if not isinstance(entry, Mapping):
            raise exception.SimulationError(reason='%s: expected a mapping'
                                            % where)
        unknown = set(entry) - _FIELDS
        if unknown:
            raise exception.SimulationError(
                reason='%s: unknown key(s) %s; allowed: %s' % (
                    where, ', '.join(sorted(map(str, unknown))),
                    ', '.join(sorted(_FIELDS))))
        if 'hostname' not in entry:
            raise exception.SimulationError(reason='%s: hostname is required'
                                            % where)
        values = dict(entry)
        if 'gpu_modes' in values:
            values['gpu_modes'] = tuple(values['gpu_modes'])
            values.setdefault('gpus', len(values['gpu_modes']))
        spec = simulate.HostSpec(**values)
        if spec.hostname in names:
            raise exception.SimulationError(
                reason='%s: host %s is listed twice' % (where, spec.hostname))
        names.add(spec.hostname)
        specs.append(spec)
    return specs


def load_specs(path: str | None = None) -> list[simulate.HostSpec]:
    """Specs of the fleet file ``path`` (the embedded sample by default)."""
    path = path or data.path(SAMPLE_FLEET)
    return specs_from_dict(yamlutil.load_file(path, 'fleet file'), path)


def load_fleet(path: str | None = None) -> list[HostInventory]:
    """Inventories of every host of a fleet file (sample by default).

    :raises AmdgpuVirtError: naming the file and the host whose
        specification is impossible (unknown model, mode, GPU count...).
    """
    path = path or data.path(SAMPLE_FLEET)
    hosts = []
    for spec in load_specs(path):
        try:
            hosts.append(simulate.design_host(spec))
        except exception.SimulationError as err:
            raise exception.SimulationError(reason='%s: host %s: %s' % (
                path, spec.hostname, err.kwargs.get('reason', err))) from None
        except exception.AmdgpuVirtError as err:
            raise exception.SimulationError(reason='%s: host %s: %s' % (
                path, spec.hostname, err)) from None
    return hosts
