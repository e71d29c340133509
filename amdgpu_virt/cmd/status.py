"""``amdgpu-virt status``: the live fleet of both clouds in one view.

Per host and GPU: the role the ledger gives it, who uses it (VMs from
Placement; pods, allocation records and DRA claims from Kubernetes), the
CUs, MiB and VFs left free, its health and memory enforcement as its node
registers them, and its drift from the ledger (the cross-audit's
findings, as ``audit`` reports them). Read-only: only GETs and LISTs are
sent.

The roles come from ``--ledger FILE``, else from the ledger ConfigMap
(``[pool] configmap_namespace``/``configmap_name``) when the Kubernetes
side is asked; the hosts' inventories from the usual sources (``--fleet``,
``--snapshot-dir``, ``--sysfs-root``).
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Sequence
from typing import Any

from cliff import lister

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.cmd import pool as cmd_pool
from amdgpu_virt.cmd import running as cmd_running
from amdgpu_virt.cmd import sources as cmd_sources
from amdgpu_virt.policy import planner as av_planner
from amdgpu_virt.pool import crossaudit
from amdgpu_virt.status import page
from amdgpu_virt.status import view


def _check_output(path: str) -> None:
    """Refuse an ``--html`` that cannot be written before reading the
    clouds (the write itself stays atomic, at the end)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise exception.OutputError(
            path=path, reason='no directory %s' % directory)
    if os.path.isdir(path):
        raise exception.OutputError(path=path, reason='it is a directory')
    if not os.access(directory, os.W_OK | os.X_OK):
        raise exception.OutputError(
            path=path, reason='the directory cannot be written')


class Status(cmd_pool.AuditOutcome, lister.Lister):
    """Show the live fleet: per GPU its role, users, free capacity, health,
    memory enforcement and drift from the ledger.

    Reads the ledger (--ledger FILE, else the ledger ConfigMap), the hosts'
    inventories, Placement (VMs holding VFs or whole GPUs) and the
    Kubernetes API (pods, allocation records, DRA claims, node
    registrations). Columns: Host, GPU, Model, Role, Mode, Used by, CUs,
    CUs free, MiB, MiB free, VFs, VFs free, Health, Enforcement, Drift, in
    any -f format with -c to choose; -f json or -f yaml without -c prints
    the whole document (summary, GPUs with their users and findings,
    warnings); --html FILE also writes one self-contained page with the
    occupancy chart. Health and enforcement are what each node registers
    ("unknown" where it registers nothing). Exit status as "audit": 0
    consistent; 1 a conflict (a GPU offered or used by both clouds, or by
    one its role does not give it); 3 drift only; 69 a cloud unreachable;
    other errors as in amdgpu-virt --help (64 usage, 65 bad input, 66
    missing input, 70 internal, 73 --html not writable, 76 API error, 78
    configuration).
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--ledger', metavar='FILE',
            help='the role ledger (YAML); default: the ledger ConfigMap '
                 '([pool] configmap_namespace/configmap_name), read '
                 'through the Kubernetes API')
        cmd_sources.add_arguments(parser)
        cmd_pool.add_side_args(parser)
        parser.add_argument(
            '--html', metavar='FILE',
            help='also write the status as one self-contained HTML page '
                 '(summary, occupancy chart, GPUs, findings, warnings; '
                 'nothing fetched, no script)')
        return parser

    def _ledger(self, args: argparse.Namespace, k8s: bool
                ) -> tuple[av_ledger.Ledger, str]:
        if args.ledger:
            return av_ledger.load(args.ledger), args.ledger
        if not k8s:
            raise exception.UsageError(
                option='--ledger', reason='without the Kubernetes side '
                '(--no-k8s) the ledger must be a file: give --ledger FILE')
        from amdgpu_virt.k8s.record import ledgermap
        where = cmd_pool.location(self.app)
        found = ledgermap.read(cmd_pool.core_api(self.app), where)
        if found is None:
            raise exception.FileInputError(
                what='ledger', path=str(where), reason='there is no such '
                'ConfigMap: give --ledger FILE, or write it with '
                '"amdgpu-virt apply --ledger FILE --push-configmap"')
        return found, str(where)

    def take_action(self, parsed_args: argparse.Namespace
                    ) -> tuple[Sequence[str], list[tuple[Any, ...]]]:
        if parsed_args.no_nova and parsed_args.no_k8s:
            raise exception.UsageError(
                option='--no-nova/--no-k8s',
                reason='at least one cloud must be asked')
        if parsed_args.html:
            _check_output(parsed_args.html)
        conf = av_main.app_conf(self.app)
        nova, k8s = not parsed_args.no_nova, not parsed_args.no_k8s
        sides = tuple(s for s, on in (('nova', nova), ('k8s', k8s)) if on)
        ledger, source = self._ledger(parsed_args, k8s)
        inventories = cmd_sources.inventories(self.app, parsed_args)
        found = inventories.all(ledger.hosts)
        hosts = [found[h] for h in sorted(found)]
        warnings = ['host %s of the ledger has no inventory in %s: what '
                    'the clouds report of it is shown, its sizes are not '
                    'known' % (h, inventories.source)
                    for h in ledger.hosts if h not in found]
        warnings += inventories.warnings(hosts)
        observations, notes = cmd_pool.collect(self.app, ledger, found,
                                               nova, k8s)
        warnings += notes
        audit = crossaudit.audit(ledger, hosts, observations, sides)
        chosen = tuple(s for s, on in ((cmd_running.K8S, k8s),
                                       (cmd_running.PLACEMENT, nova)) if on)
        live = cmd_running.read_sources(self.app, chosen, hosts, ledger)
        warnings += live.messages
        plan = av_planner.plan(conf, hosts, [], live.running.ledger,
                               live.running.placements)
        facts: dict[Any, Any] = {}
        if k8s:
            from amdgpu_virt.k8s.pool import nodefacts
            facts, notes = nodefacts.read(cmd_pool.core_api(self.app),
                                          ledger.hosts)
            warnings += notes
        status = view.build(plan, audit, facts,
                            list(dict.fromkeys(warnings)), sides, source,
                            view.inventory_facts(
                                hosts, conf.health.max_uncorrectable))
        if parsed_args.html:
            taken = datetime.datetime.now(datetime.UTC).strftime(
                '%Y-%m-%d %H:%M:%S UTC')
            fileutil.atomic_write(parsed_args.html, page.render(
                status, plan.gpus, plan.decisions, taken))
        self.status = status
        self.conflicts = bool(status.conflicts)
        self.drift = status.drifting
        return view.COLUMNS, [g.row() for g in status.gpus]

    def produce_output(self, parsed_args: argparse.Namespace,
                       column_names: Sequence[str], data: Any) -> int:
        out = self.app.stdout
        if parsed_args.formatter in ('json', 'yaml') \
                and not parsed_args.columns:
            cmd_pool.write_document(out, parsed_args.formatter,
                                    self.status.to_dict())
            return 0
        for warning in self.status.warnings:
            self.app.stderr.write('warning: %s\n' % warning)
        super().produce_output(parsed_args, column_names, list(data))
        if parsed_args.formatter == 'table':
            out.write(summary_line(self.status))
        return 0


def summary_line(status: view.FleetStatus) -> str:
    """The counts under the table."""
    s = status.summary()
    return ('%d GPUs, %d in use by %d users; free: %d of %d CUs, %d of %d '
            'MiB, %d of %d VFs; %d unhealthy, %d of unknown health; %d '
            'conflict(s), %d drift\n' % (
                s['gpus'], s['in_use'], s['users'], s['cus_free'], s['cus'],
                s['mib_free'], s['vram_mib'], s['vfs_free'], s['vfs'],
                s['unhealthy'], s['health_unknown'], s['conflicts'],
                s['drift']))
