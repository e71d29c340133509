"""One GPU pool, two clouds: ``amdgpu-virt apply``, ``audit`` and ``move``.

* ``apply``: render what each side needs, per host, from the role ledger;
* ``audit``: compare the ledger with Placement and the Kubernetes API and
  report double booking (exit status 1 on a conflict);
* ``move``: change the role of one GPU safely (resumable), in
  :mod:`amdgpu_virt.cmd.move`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from cliff import command
from cliff import lister

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.cmd import exitcodes
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.cmd import nova as cmd_nova
from amdgpu_virt.cmd import sources as cmd_sources
from amdgpu_virt.inventory import sources
from amdgpu_virt.model import HostInventory
from amdgpu_virt.pool import apply as pool_apply
from amdgpu_virt.pool import crossaudit

#: exit statuses of ``audit`` and ``move`` (the one table is
#: :mod:`amdgpu_virt.cmd.exitcodes`; their help and the hybrid guide
#: list them)
EXIT_OK = exitcodes.OK
#: ``move``: refused, the GPU is in use; ``audit``: a conflict (double
#: booking)
EXIT_REFUSED = exitcodes.REFUSED
#: ``audit``: drift between the ledger and a side, no conflict
EXIT_DRIFT = exitcodes.DRIFT
#: a side's API (Placement, Nova, Kubernetes) cannot be reached; nothing
#: was changed (EX_UNAVAILABLE of sysexits.h)
EXIT_UNREACHABLE = exitcodes.UNREACHABLE
#: ``move`` exit status while it waits for a side or the host
#: (EX_TEMPFAIL)
EXIT_WAITING = exitcodes.WAITING


def load_ledger(path: str, inventories: sources.Inventories
                 ) -> tuple[av_ledger.Ledger, dict[str, HostInventory]]:
    ledger = av_ledger.load(path)
    found = inventories.all(ledger.hosts)
    av_ledger.check_hardware(ledger, found.values(), path)
    return ledger, found


# --- adapters (loaded only when a side is used) ------------------------------

def _dra_renderer(conf: Any) -> pool_apply.DraRenderer:
    """The DRA ResourceSlices of a host, as the plugin would publish."""
    from amdgpu_virt.k8s.dra import slices as dra_slices

    def render(inventory: Any, ledger: Any, host: str) -> str:
        return dra_slices.render_yaml(
            inventory, ledger, host, conf.dra.driver_name,
            conf.dra.partition_devices, conf.dra.memory_step_mib)

    return render


def _nova_renderer(app: Any) -> pool_apply.NovaRenderer:
    from amdgpu_virt.nova import pool as nova_pool
    return nova_pool.NovaRenderer(cmd_nova.load_backend(app))


def core_api(app: Any) -> Any:
    from amdgpu_virt.k8s.api import client as k8s_client
    return k8s_client.core_api(av_main.app_conf(app))


def location(app: Any) -> Any:
    from amdgpu_virt.k8s.record import ledgermap
    return ledgermap.Location.from_conf(av_main.app_conf(app))


def add_side_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--no-nova', action='store_true',
                        help='the deployment has no Nova side: do not ask '
                             'Placement')
    parser.add_argument('--no-k8s', action='store_true',
                        help='the deployment has no Kubernetes side: do not '
                             'ask the Kubernetes API')


# --- apply -------------------------------------------------------------------

class Apply(command.Command):
    """Render, per host, what Nova and Kubernetes need from the ledger.

    Files go to OUTPUT_DIR/<host>/ and are written only when their content
    changes; a second run writes nothing and says so. Temporary files a
    run killed while writing left there are removed by the next run.
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument('--ledger', metavar='FILE', required=True,
                            help='the role ledger (YAML)')
        parser.add_argument('--host', metavar='NAME', action='append',
                            help='only this host (repeatable)')
        parser.add_argument('--output-dir', metavar='DIR',
                            help='where the per-host files go (default: '
                                 '[pool] output_dir, itself '
                                 '"amdgpu-virt-out" by default)')
        parser.add_argument('--dry-run', action='store_true',
                            help='print the changes as a diff, and the '
                                 'temporary files an interrupted run left '
                                 'that a run would remove; write nothing')
        parser.add_argument('--push-flavors', action='store_true',
                            help='also create or update the flavors of '
                                 '[nova] flavors_file (their aliases are '
                                 'checked against the ledger)')
        parser.add_argument('--progress-every', type=int, metavar='N',
                            help='a progress line on stderr every N hosts '
                                 '(0: none); instead of [pool] '
                                 'progress_every')
        parser.add_argument('--push-configmap', action='store_true',
                            help='also write the ledger ConfigMap ([pool] '
                                 'configmap_namespace/configmap_name) '
                                 'through the Kubernetes API')
        cmd_sources.add_arguments(parser)
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        conf = av_main.app_conf(self.app)
        out, err = self.app.stdout, self.app.stderr
        ledger, inventories = load_ledger(
            parsed_args.ledger, cmd_sources.inventories(self.app,
                                                        parsed_args))
        hosts = list(ledger.hosts)
        if parsed_args.host:
            unknown = sorted(set(parsed_args.host) - set(hosts))
            if unknown:
                raise exception.PlanError(
                    source=parsed_args.ledger, reason='no host %s in the '
                    'ledger' % ', '.join(unknown))
            hosts = sorted(set(parsed_args.host))
        needs_nova = any(a.role.side == 'nova' for h in hosts
                         for a in ledger.for_host(h))
        nova = _nova_renderer(self.app) if needs_nova else None
        configmap_text = None
        if pool_apply.has_k8s_roles(ledger) and not parsed_args.host:
            from amdgpu_virt.k8s.record import ledgermap
            configmap_text = ledgermap.manifest_text(ledger,
                                                     location(self.app))
        every = (conf.pool.progress_every if parsed_args.progress_every
                 is None else max(parsed_args.progress_every, 0))

        def progress(count: int) -> None:
            if every and (count % every == 0 or count == len(hosts)):
                err.write('rendered %d/%d hosts\n' % (count, len(hosts)))
                err.flush()

        rendered = pool_apply.render_all(ledger, hosts, inventories, nova,
                                         configmap_text, progress,
                                         dra=_dra_renderer(conf))
        output_dir = parsed_args.output_dir or conf.pool.output_dir
        selected = set(hosts)
        report = pool_apply.apply_files(
            output_dir, rendered,
            scope=lambda p: p.split('/', 1)[0] in selected or (
                not parsed_args.host and p == pool_apply.CONFIGMAP_FILE),
            dry_run=parsed_args.dry_run)
        if parsed_args.dry_run:
            for diff in report.diffs:
                out.write(diff)
        for path in report.stale:
            out.write('%s %s (left by an interrupted run)\n' % (
                'would remove' if parsed_args.dry_run else 'removed',
                os.path.join(output_dir, path)))
        for label, paths in (('wrote', report.written),
                             ('removed', report.removed)):
            for path in paths:
                out.write('%s %s\n' % (
                    'would write' if parsed_args.dry_run and label == 'wrote'
                    else 'would remove' if parsed_args.dry_run else label,
                    os.path.join(output_dir, path)))
        out.write('%d host(s): %d file(s) %s, %d unchanged, %d %s%s\n' % (
            len(hosts), len(report.written),
            'to write' if parsed_args.dry_run else 'written',
            len(report.unchanged), len(report.removed),
            'to remove' if parsed_args.dry_run else 'removed',
            '' if report.changed else ' (nothing to do)'))
        if parsed_args.push_configmap and not parsed_args.dry_run:
            from amdgpu_virt.k8s.record import ledgermap
            changed = ledgermap.write(core_api(self.app), ledger,
                                      location(self.app))
            out.write('%s %s\n' % ('updated' if changed else 'unchanged',
                                   location(self.app)))
        if parsed_args.push_flavors and not parsed_args.dry_run:
            self._push_flavors(ledger)
        return 0

    def _push_flavors(self, ledger: av_ledger.Ledger) -> None:
        from amdgpu_virt.nova import flavors
        conf = av_main.app_conf(self.app)
        if not conf.nova.flavors_file:
            raise exception.ConfigError(
                option='[nova] flavors_file',
                reason='--push-flavors needs the flavor definitions')
        backend = cmd_nova.load_backend(self.app)
        known = [a['name'] for a in backend.alias_entries(ledger)]
        specs = flavors.load(conf.nova.flavors_file, conf.nova.numa_policy,
                             known)
        for change in backend.sync_flavors(specs):
            self.app.stdout.write('flavor %s: %s%s\n' % (
                change.name, change.action, ''.join(
                    '; %s' % d for d in change.details)))


# --- audit -------------------------------------------------------------------

def collect(app: Any, ledger: av_ledger.Ledger,
            inventories: Mapping[str, HostInventory], nova: bool, k8s: bool
            ) -> tuple[list[Any], list[str]]:
    """Observations of the sides asked about the pool's hosts, and warnings.

    The pool is the hosts of the ledger and of the inventories. On a host
    whose inventory is known, Nova providers of other PCI devices (NICs)
    are not GPUs of the pool and are left out.
    """
    hosts = set(ledger.hosts) | set(inventories)
    observations: list[Any] = []
    warnings: list[str] = []
    if nova:
        from amdgpu_virt.nova import pool as nova_pool
        nova_side = nova_pool.NovaPool(cmd_nova.load_backend(app))
        found, notes = nova_side.observations(hosts)
        for obs in found:
            inventory = inventories.get(obs.host)
            if inventory is not None and ledger.get(
                    obs.host, obs.address) is None and obs.address not in {
                    g.address for g in inventory.gpus}:
                continue
            observations.append(obs)
        warnings += notes
    if k8s:
        from amdgpu_virt.k8s.pool import side as k8s_pool
        from amdgpu_virt.k8s.record import ledgermap
        api = core_api(app)
        found, notes = k8s_pool.KubernetesPool(
            api, location(app), ledger,
            dra_driver=av_main.app_conf(app).dra.driver_name
        ).observations(hosts)
        observations += found
        warnings += notes
        stored = ledgermap.read(api, location(app))
        if stored is not None and stored != ledger:
            warnings.append('%s holds another ledger than the one audited '
                            '(a move under way, or run "amdgpu-virt apply '
                            '--push-configmap")' % location(app))
    return observations, warnings


def write_document(out: Any, formatter: str, document: Mapping[str, Any],
                   sort_keys: bool = False) -> None:
    """``document`` as indented JSON (``formatter`` json) or YAML."""
    out.write(json.dumps(document, indent=2, sort_keys=sort_keys) + '\n'
              if formatter == 'json' else yamlutil.dump(document))


class AuditOutcome:
    """The exit status of a command that reports the audit's findings
    (``audit``, ``status``): 1 on a conflict, 3 on drift alone, else 0;
    set :attr:`conflicts` and :attr:`drift` in ``take_action``."""

    conflicts = False
    drift = False

    def run(self, parsed_args: argparse.Namespace) -> int:
        result = int(super().run(parsed_args))  # type: ignore[misc]
        if result:
            return result
        if self.conflicts:
            return EXIT_REFUSED
        return EXIT_DRIFT if self.drift else EXIT_OK


AUDIT_COLUMNS = ('Host', 'GPU', 'Severity', 'Finding', 'Detail')
SEVERITIES = ('info', 'drift', 'conflict')


def audit_summary(report: crossaudit.AuditReport,
                  sides: Sequence[str]) -> str:
    """One line: GPUs, offered and used per side, findings by severity."""
    counts = {s: sum(1 for f in report.findings if f.severity == s)
              for s in SEVERITIES}
    return ('%d GPUs; offered: %s; in use: %s; %d stranded; '
            '%d conflict(s), %d drift, %d info\n' % (
                report.gpus, ', '.join(
                    '%s %d' % (s, report.offered[s]) for s in sides),
                ', '.join('%s %d' % (s, report.in_use[s]) for s in sides),
                report.stranded, counts['conflict'], counts['drift'],
                counts['info']))


class Audit(AuditOutcome, lister.Lister):
    """Check that no GPU is offered or used by both clouds.

    Compares the ledger, the hosts' inventories, Placement (Nova) and the
    Kubernetes API. Lists the findings (columns Host, GPU, Severity,
    Finding, Detail) in any -f format, with -c to choose columns; -f json
    or -f yaml without -c prints the whole report (counts, findings,
    warnings). A GPU with more uncorrectable RAS errors in its host
    inventory than [health] max_uncorrectable, or registered unhealthy by
    its node, is "unhealthy" (drift), or "unhealthy-in-use" (a conflict)
    while a VM or pod uses it. Exit status: 0 consistent; 1 a conflict (a
    GPU offered or used by both clouds, or used while unhealthy); 3 drift
    only (a side differs from the ledger, no conflict); 69 Placement,
    Nova or the Kubernetes API unreachable (nothing audited); other
    errors as in amdgpu-virt --help (64 usage, 65 bad input, 66 missing
    input, 70 internal, 76 API error, 78 configuration).
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument('--ledger', metavar='FILE', required=True,
                            help='the role ledger (YAML)')
        cmd_sources.add_arguments(parser)
        add_side_args(parser)
        parser.add_argument('--min-severity', default='info',
                            choices=SEVERITIES,
                            help='list only findings at least this severe '
                                 '(not in the whole-report json/yaml)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace
                    ) -> tuple[Sequence[str], list[tuple[Any, ...]]]:
        if parsed_args.no_nova and parsed_args.no_k8s:
            raise exception.UsageError(
                option='--no-nova/--no-k8s',
                reason='at least one side must be audited')
        ledger, inventories = load_ledger(
            parsed_args.ledger, cmd_sources.inventories(self.app,
                                                        parsed_args))
        sides = tuple(s for s, off in (('nova', parsed_args.no_nova),
                                       ('k8s', parsed_args.no_k8s))
                      if not off)
        observations, warnings = collect(self.app, ledger, inventories,
                                         'nova' in sides, 'k8s' in sides)
        report = crossaudit.audit(
            ledger, inventories.values(), observations, sides,
            av_main.app_conf(self.app).health.max_uncorrectable)
        for warning in warnings:
            self.app.stderr.write('warning: %s\n' % warning)
        self.report, self.sides, self.warnings = report, sides, warnings
        self.conflicts = bool(report.conflicts)
        self.drift = any(f.severity == 'drift' for f in report.findings)
        floor = SEVERITIES.index(parsed_args.min_severity)
        return AUDIT_COLUMNS, [
            (f.host, str(f.address), f.severity, f.kind.value, f.message)
            for f in report.findings
            if SEVERITIES.index(f.severity) >= floor]

    def produce_output(self, parsed_args: argparse.Namespace,
                       column_names: Sequence[str], data: Any) -> int:
        out = self.app.stdout
        if parsed_args.formatter in ('json', 'yaml') \
                and not parsed_args.columns:
            document = self.report.to_dict()
            document['sides'] = list(self.sides)
            document['warnings'] = self.warnings
            write_document(out, parsed_args.formatter, document,
                           sort_keys=True)
            return 0
        rows = list(data)
        if rows or parsed_args.formatter != 'table':
            super().produce_output(parsed_args, column_names, rows)
        # the counts: under the table, on stderr for machine formats
        summary = audit_summary(self.report, self.sides)
        (out if parsed_args.formatter == 'table'
         else self.app.stderr).write(summary)
        return 0
