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
_FIELDS = {f.name for f in dataclasses.fields(simulate.HostSpec)} - {
    'off_catalog'}


def _checked(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The fields of one host entry, each of its type and within bounds
    (before anything is built from them).

    :raises SimulationError: naming the entry and the field.
    """
    values = dict(entry)
    for key, value in values.items():
        if key in ('gpus', 'gpu_modes'):
            continue
        if not isinstance(value, str):
            raise exception.SimulationError(
                reason='%s: %s must be a string, not %r' % (
                    where, key, value))
    modes = values.get('gpu_modes')
    if modes is not None:
        if not isinstance(modes, list) or not all(
                isinstance(m, str) for m in modes):
            raise exception.SimulationError(
                reason='%s: gpu_modes must be a list of modes' % where)
        if len(modes) > simulate.MAX_GPUS:
            raise exception.SimulationError(
                reason='%s: gpu_modes lists %d GPUs; at most %d per host'
                % (where, len(modes), simulate.MAX_GPUS))
        values['gpu_modes'] = tuple(modes)
        values.setdefault('gpus', len(modes))
    gpus = values.get('gpus', 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        raise exception.SimulationError(
            reason='%s: gpus must be an integer, not %s' % (
                where, str(gpus)[:40]))
    if not 1 <= gpus <= simulate.MAX_GPUS:
        raise exception.SimulationError(
            reason='%s: gpus %s is out of range; allowed: 1..%d' % (
                where, str(gpus)[:40], simulate.MAX_GPUS))
    return values


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
        values = _checked(entry, where)
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
    return [design(spec, path) for spec in load_specs(path)]


def design(spec: simulate.HostSpec, source: str) -> HostInventory:
    """The inventory of one host of the fleet file ``source``.

    :raises SimulationError: naming the file and the host.
    """
    try:
        return simulate.design_host(spec)
    except exception.SimulationError as err:
        raise exception.SimulationError(reason='%s: host %s: %s' % (
            source, spec.hostname, err.kwargs.get('reason', err))) from None
    except exception.AmdgpuVirtError as err:
        raise exception.SimulationError(reason='%s: host %s: %s' % (
            source, spec.hostname, err)) from None
