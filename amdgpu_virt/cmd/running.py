"""The live running-placement option of the commands that plan, defined
once.

``plan`` and ``explain`` take ``--running-from k8s,placement``: the
running placements are then what the clouds report, not the placements
of a ``--ledger`` state file (see :mod:`amdgpu_virt.policy.running`):

``k8s``
    the Kubernetes API of ``[kubernetes] kubeconfig``: pods holding GPUs
    (bound, or chosen by the extender), the allocation records of
    ``[kubernetes] namespace`` and the allocated ResourceClaims of
    ``[dra] driver_name``; without ``--ledger``, the GPU roles come from
    the ledger ConfigMap (``[pool] configmap_namespace`` /
    ``configmap_name``);
``placement``
    the Placement API of ``[nova]`` (``placement_endpoint`` and ``token``,
    or ``cloud``): the instances holding VFs or whole GPUs.

Unhealthy GPUs (the nodes' registrations with ``health: false``, host
inventories with uncorrectable RAS errors) are kept occupied: no new work
is planned onto them.

Nothing is written to either cloud.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.model import HostInventory
from amdgpu_virt.policy import running

K8S = 'k8s'
PLACEMENT = 'placement'
CHOICES = (K8S, PLACEMENT)

HELP = ('plan around what really runs: comma-separated sources of the '
        'running placements, %s (the Kubernetes API of [kubernetes] '
        'kubeconfig: pods, allocation records, DRA claims; without '
        '--ledger the GPU roles come from the ledger ConfigMap of [pool] '
        'configmap_namespace/configmap_name) and %s (the Placement API of '
        '[nova]: instances holding VFs or whole GPUs); replaces the '
        'placements of --ledger; odd live state is printed as warnings and '
        'its GPUs are kept occupied' % (K8S, PLACEMENT))


def parse_sources(value: str) -> tuple[str, ...]:
    """``k8s,placement`` -> ``('k8s', 'placement')``.

    :raises ArgumentTypeError: an unknown or empty source.
    """
    found: list[str] = []
    for item in value.split(','):
        item = item.strip().lower()
        if item not in CHOICES:
            raise argparse.ArgumentTypeError(
                '%r is not a source of running placements (choose from %s)'
                % (item, ', '.join(CHOICES)))
        if item not in found:
            found.append(item)
    return tuple(found)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--running-from`` to ``parser``."""
    parser.add_argument('--running-from', metavar='SOURCES',
                        type=parse_sources, default=(), help=HELP)


def sources_of(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(getattr(args, 'running_from', None) or ())


@dataclasses.dataclass(frozen=True)
class Live:
    """The running placements read live, and what to tell about them."""

    running: running.Running
    notes: tuple[str, ...] = ()

    @property
    def messages(self) -> tuple[str, ...]:
        return self.notes + tuple(str(w) for w in self.running.warnings)


def read(app: Any, args: argparse.Namespace, hosts: Sequence[HostInventory],
         ledger: av_ledger.Ledger | None) -> Live:
    """The running placements of the sources ``--running-from`` names.

    :param ledger: the roles of ``--ledger`` (None: read the ledger
        ConfigMap when ``k8s`` is a source).
    :raises KubernetesError, PlacementError: a cloud cannot be read.
    :raises PlanError: the ledger does not match the inventories.
    """
    return read_sources(app, sources_of(args), hosts, ledger)


def read_sources(app: Any, chosen: Sequence[str],
                 hosts: Sequence[HostInventory],
                 ledger: av_ledger.Ledger | None) -> Live:
    """The running placements of the sources ``chosen`` (:data:`K8S`,
    :data:`PLACEMENT`); see :func:`read`."""
    conf = av_main.app_conf(app)
    holdings: list[running.Holding] = []
    unhealthy: dict[tuple[str, str], str] = {}
    notes: list[str] = []
    if K8S in chosen:
        from amdgpu_virt.k8s.api import client as k8s_client
        from amdgpu_virt.k8s.pool import running as k8s_running
        from amdgpu_virt.k8s.record import ledgermap

        api = k8s_client.core_api(conf)
        if ledger is None:
            where = ledgermap.Location.from_conf(conf)
            ledger = ledgermap.read(api, where)
            if ledger is None:
                notes.append('no %s: the GPUs that run something take the '
                             'role of what runs there' % where)
        live_k8s = k8s_running.LiveKubernetes(
            api, conf.kubernetes.namespace, conf.dra.driver_name,
            conf.kubernetes.resource_name)
        holdings += live_k8s.holdings(hosts)
        unhealthy.update(live_k8s.unhealthy())
    if PLACEMENT in chosen:
        from amdgpu_virt.cmd import nova as cmd_nova
        from amdgpu_virt.nova import running as nova_running

        holdings += nova_running.holdings(
            cmd_nova.load_backend(app).reader(), hosts)
    return Live(running.placements(conf, hosts, ledger, holdings,
                                   unhealthy), tuple(notes))


def memory_enforcement(app: Any, args: argparse.Namespace
                       ) -> dict[str, dict[str, str]]:
    """node -> GPU address -> memory enforcement level, as the nodes
    register it, when ``k8s`` is a source of ``--running-from`` ({}
    otherwise).

    :raises KubernetesError: the nodes cannot be listed.
    """
    if K8S not in sources_of(args):
        return {}
    from amdgpu_virt.k8s.api import client as k8s_client
    from amdgpu_virt.k8s.pool import running as k8s_running

    conf = av_main.app_conf(app)
    return k8s_running.LiveKubernetes(
        k8s_client.core_api(conf), conf.kubernetes.namespace,
        conf.dra.driver_name,
        conf.kubernetes.resource_name).memory_enforcement()
