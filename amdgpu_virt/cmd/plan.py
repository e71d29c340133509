"""``amdgpu-virt plan`` and ``amdgpu-virt explain``.

With no arguments, ``plan`` plans the embedded sample fleet against the
embedded sample workload mix, so the policy can be seen without any setup.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from cliff import command
from cliff import lister

from amdgpu_virt import data
from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import yamlutil
from amdgpu_virt.cmd import progress as cmd_progress
from amdgpu_virt.cmd import running as cmd_running
from amdgpu_virt.cmd import sources as cmd_sources
from amdgpu_virt.inventory import sources
from amdgpu_virt.policy import chart as av_chart
from amdgpu_virt.policy import planner as av_planner
from amdgpu_virt.policy import result as av_result
from amdgpu_virt.policy import statefile as av_statefile
from amdgpu_virt.policy import workload as av_workload
from amdgpu_virt.policy.decision import Decision

LOG = logging.getLogger(__name__)
SAMPLE_WORKLOADS = 'sample_workloads.yaml'
#: What ``plan --part`` prints: everything (the default), or one part
#: through cliff's formatters (``-f``, ``-c``, ``--sort-column``).
PARTS = ('all', 'gpus', 'workloads', 'summary')
GPU_COLUMNS = ('Host', 'Address', 'Model', 'Role', 'Mode', 'CUs',
               'VRAM MiB', 'Used by', 'Unverified')
WORKLOAD_COLUMNS = ('Name', 'Kind', 'Host', 'GPUs', 'VF/CU', 'Code', 'Kept',
                    'Reason')
SUMMARY_COLUMNS = ('Field', 'Value')


def _add_inputs(parser: argparse.ArgumentParser) -> None:
    cmd_sources.add_arguments(parser)
    cmd_progress.add_arguments(parser)
    parser.add_argument(
        '--workloads', metavar='FILE',
        help='workload file: YAML with a "workloads" list (see the '
             'policy guide); default: the embedded sample mix')
    parser.add_argument(
        '--ledger', metavar='FILE',
        help='state file of an earlier plan (GPU roles and running '
             'placements, as written by --output-ledger): plan only the '
             'new workloads, moving nothing that runs (with '
             '--running-from: only its GPU roles)')
    cmd_running.add_arguments(parser)


def make_plan(conf: Any, args: argparse.Namespace,
              app: Any = None,
              warnings: list[str] | None = None,
              progress: av_planner.Progress | None = None
              ) -> av_result.Plan:
    """Load the inputs named in ``args`` and plan.

    :param app: the running application (for ``--sysfs-root`` and
        ``--running-from``).
    :param warnings: gets what was odd in the inputs (snapshot files
        skipped, inventory warnings of snapshots and live hosts, live
        state), one sentence each.
    :param progress: told each step (reading the inputs, then the
        planner's steps).
    :raises AmdgpuVirtError: an input is invalid (naming it).
    """
    notes: list[str] = [] if warnings is None else warnings
    step = progress or (lambda *_args: None)
    step('reading hosts', 0, 0)
    if app is not None:
        inventories = cmd_sources.inventories(app, args)
    else:
        inventories = sources.Inventories(cmd_sources.source_of(args))
    hosts = inventories.every()
    notes.extend(inventories.warnings(hosts))
    path = args.workloads or data.path(SAMPLE_WORKLOADS)
    step('reading workloads', 0, 0)
    invalid: list[Any] = []
    if getattr(args, 'skip_invalid', False):
        workloads, invalid = av_workload.load_workloads_lenient(path)
        for name, err in invalid:
            LOG.warning('skipping invalid workload %s: %s', name, err)
    else:
        workloads = av_workload.load_workloads(path)
    ledger = None
    existing: list[Decision] = []
    if args.ledger:
        ledger, existing = av_statefile.load_state(
            yamlutil.load_file(args.ledger, 'ledger'), args.ledger)
    if cmd_running.sources_of(args):
        if app is None:
            raise exception.AmdgpuVirtError(
                '--running-from needs the application\'s configuration')
        if existing:
            notes.append('the %d placements of --ledger %s are not used: '
                         'the running placements come from --running-from'
                         % (len(existing), args.ledger))
        step('reading what runs', 0, 0)
        live = cmd_running.read(app, args, hosts, ledger)
        notes.extend(live.messages)
        ledger, existing = live.running.ledger, list(
            live.running.placements)
    if existing:
        running = {d.workload for d in existing}
        workloads = [w for w in workloads if w.name not in running]
    return av_planner.plan(conf, hosts, workloads, ledger, existing,
                           invalid, progress)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table with left-aligned columns."""
    cells = [[str(c) for c in headers]] + [
        ['' if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        padded = (c.ljust(w) for c, w in zip(row, widths, strict=True))
        lines.append('  '.join(padded).rstrip())
        if n == 0:
            lines.append('  '.join('-' * w for w in widths))
    return '\n'.join(lines)


def _grants(decision: Decision) -> str:
    parts = [g.describe() for g in decision.grants]
    if not parts:
        return '-'
    if all(g.vf_index is not None for g in decision.grants):
        return 'VF ' + ','.join(str(g.vf_index) for g in decision.grants)
    if len(set(parts)) == 1:
        return parts[0] if len(parts) == 1 else '%s x%d' % (parts[0],
                                                           len(parts))
    return '; '.join(parts)


def _addresses(decision: Decision) -> str:
    gpus = decision.gpus
    if not gpus:
        return '-'
    if len(gpus) == 1:
        return gpus[0]
    return '%s +%d' % (gpus[0], len(gpus) - 1)


REASON_WIDTH = 60


def _short(text: str, width: int = REASON_WIDTH) -> str:
    return text if len(text) <= width else text[:width - 3] + '...'


def render_table(plan: av_result.Plan, warnings: Sequence[str] = ()) -> str:
    gpu_rows = [(g.host, g.address, g.model, g.role.value
                 + (' *' if g.unverified else ''), g.mode,
                 ', '.join(g.used_by) or '-') for g in plan.gpus]
    work_rows = [(d.workload, d.kind.value if d.kind else '-',
                  d.host or '-', _addresses(d), _grants(d),
                  d.code.value + (' (kept)' if d.existing else ''),
                  _short(d.reason)) for d in plan.decisions]
    s = plan.summary()
    kinds = ', '.join('%s %d' % i for i in s['placed_by_kind'].items())
    codes = s['by_code']
    bound = s['bound']
    lines = [
        'GPUs', table(('HOST', 'ADDRESS', 'MODEL', 'ROLE', 'MODE',
                       'USED BY'), gpu_rows), '',
        'Workloads', table(('NAME', 'KIND', 'HOST', 'GPUS', 'VF/CU',
                            'CODE', 'REASON'), work_rows), '',
        'Summary',
        '  placed: %d of %d workloads (%s); %d unschedulable now, %d never '
        'fit, %d invalid' % (s['placed'], s['workloads'], kinds,
                             codes['unschedulable-now'],
                             codes['never-fits'], codes['invalid']),
        '  GPUs: %d, %d with a role (%s), %d idle' % (
            s['gpus'], s['gpus_with_role'], ', '.join(
                '%s %d' % (r, n) for r, n in s['roles'].items()
                if n and r != 'idle'), s['roles']['idle']),
        '  utilisation: %.0f%% of the fleet, %.0f%% of the GPUs with a '
        'role' % (100 * s['utilisation'], 100 * s['utilisation_of_used']),
        '  stranded: %.2f GPU-equivalents in GPUs with a role that no '
        'workload asked for' % s['stranded_gpus'],
        '  capacity bound (by capacity alone): %d workloads, priority %d; '
        'the plan reaches %.0f%% of it (%d short), priority %.0f%%' % (
            bound['placed'], bound['priority'], 100 * s['placed_of_bound'],
            s['distance_to_bound'], 100 * s['priority_of_bound']),
        '  bound per kind alone: dedicated %d, vf %d, cu %d' % (
            bound['by_kind']['dedicated'], bound['by_kind']['vf'],
            bound['by_kind']['cu']),
    ]
    if s['existing']:
        lines.append('  kept: %d running placements' % s['existing'])
    if any(len(d.reason) > REASON_WIDTH for d in plan.decisions):
        lines.append('  reasons above are cut at %d characters: "explain '
                     'NAME" or "--part workloads" prints them in full'
                     % REASON_WIDTH)
    if s['unverified'] or any(g.unverified for g in plan.gpus):
        lines.append('  * unverified on real hardware: GIM and amdgpu GPUs '
                     'mixed on one host ([policy] allow_mixed_host_drivers)')
    if warnings:
        lines += ['', 'Warnings (%d)' % len(warnings)]
        lines += ['  %s' % w for w in warnings]
    return '\n'.join(lines) + '\n'


def plan_dict(plan: av_result.Plan, warnings: Sequence[str] = ()
              ) -> dict[str, Any]:
    data = {'gpus': [g.to_dict() for g in plan.gpus],
            'workloads': [d.to_dict(trail=False) for d in plan.decisions],
            'summary': plan.summary(),
            'ledger': plan.ledger.to_dict()}
    if warnings:
        data['warnings'] = list(warnings)
    return data


def gpu_rows(plan: av_result.Plan) -> list[tuple[Any, ...]]:
    """One row per GPU (:data:`GPU_COLUMNS`)."""
    return [(g.host, g.address, g.model, g.role.value, g.mode, g.cus,
             g.vram_mib, ', '.join(g.used_by), g.unverified)
            for g in plan.gpus]


def workload_rows(plan: av_result.Plan) -> list[tuple[Any, ...]]:
    """One row per decision (:data:`WORKLOAD_COLUMNS`), reasons in full."""
    return [(d.workload, d.kind.value if d.kind else '', d.host or '',
             ' '.join(d.gpus), _grants(d) if d.grants else '', d.code.value,
             d.existing, d.reason) for d in plan.decisions]


def _flatten(data: Any, prefix: str = '') -> list[tuple[str, Any]]:
    if not isinstance(data, dict):
        return [(prefix, data)]
    rows: list[tuple[str, Any]] = []
    for key, value in data.items():
        rows += _flatten(value, '%s.%s' % (prefix, key) if prefix else key)
    return rows


def summary_rows(plan: av_result.Plan) -> list[tuple[str, Any]]:
    """The summary as (field, value) pairs, nested fields dotted."""
    return _flatten(plan.summary())


def check_chart_name(path: str) -> str:
    """The chart format (``.svg`` or ``.png``) of the file name ``path``.

    :raises AmdgpuVirtError: another extension, naming ``--chart``.
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in ('.svg', '.png'):
        raise exception.UsageError(
            '--chart %s: the file name must end in .svg or .png' % path)
    return ext


def write_chart(plan: av_result.Plan, path: str) -> None:
    """SVG or PNG, by the file name's extension.

    :raises AmdgpuVirtError: another extension, or PNG without matplotlib.
    """
    if check_chart_name(path) == '.svg':
        fileutil.write_if_changed(path, av_chart.svg(
            plan.gpus, decisions=plan.decisions))
    else:
        av_chart.png(plan.gpus, path, decisions=plan.decisions)


class Plan(lister.Lister):
    """Plan GPU roles and workload placements for a fleet.

    Without arguments, plans the embedded sample fleet against the
    embedded sample workloads and prints three parts: GPUs, workloads and
    a summary. "-f json" or "-f yaml" prints them all (with the ledger) as
    one document; "--part gpus|workloads|summary" prints one part through
    the usual formatters ("-f table|json|yaml|value|csv", "-c COLUMN",
    "--sort-column"), with every reason in full. Exits 0 when a plan was
    made, even if some workloads do not fit (they are reported with the
    reason).
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _add_inputs(parser)
        parser.add_argument('--skip-invalid', action='store_true',
                            help='report invalid workload entries with code '
                                 '"invalid" and plan the others; by default '
                                 'an invalid entry stops the command, naming '
                                 'the entry and each of its problems')
        parser.add_argument(
            '--part', choices=PARTS, default='all',
            help='what to print: "all" (default) the three parts, as tables '
                 'or, with -f json|yaml, as one document with the ledger; '
                 'gpus (columns %s), workloads (%s) or summary (%s) alone, '
                 'in any -f format, with -c to choose columns' % (
                     ', '.join(GPU_COLUMNS), ', '.join(WORKLOAD_COLUMNS),
                     ', '.join(SUMMARY_COLUMNS)))
        parser.add_argument('--output-ledger', metavar='FILE',
                            help='write the GPU roles and placements (YAML) '
                                 'to FILE, only when its content changes; '
                                 'the input of --ledger, "apply", "audit", '
                                 '"move" and "nova ... --ledger"')
        parser.add_argument('--chart', metavar='FILE',
                            help='also draw every GPU by owner into FILE '
                                 '(.svg; .png needs matplotlib)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace
                    ) -> tuple[Sequence[str], list[tuple[Any, ...]]]:
        part = parsed_args.part
        if part == 'all' and (parsed_args.formatter not in (
                'table', 'json', 'yaml') or parsed_args.columns
                or parsed_args.sort_columns):
            raise exception.UsageError(
                '-f %s%s prints one table: choose it with --part gpus, '
                'workloads or summary' % (
                    parsed_args.formatter,
                    ' with -c/--sort-column' if parsed_args.columns
                    or parsed_args.sort_columns else ''))
        if parsed_args.chart:
            # Refuse a bad name before planning and printing, not after.
            check_chart_name(parsed_args.chart)
        self._warnings: list[str] = []
        report = cmd_progress.reporter(self.app, parsed_args, 'plan')
        try:
            plan = make_plan(
                self.app.get_conf(),  # type: ignore[attr-defined]
                parsed_args, self.app, self._warnings, report)
            if parsed_args.output_ledger or parsed_args.chart:
                (report or (lambda *_a: None))('writing', 0, 0)
            if parsed_args.output_ledger:
                fileutil.write_if_changed(parsed_args.output_ledger,
                                          yamlutil.dump(plan.state_dict()))
            if parsed_args.chart:
                write_chart(plan, parsed_args.chart)
        finally:
            if report is not None:
                report.close()
        self._plan = plan
        if part == 'workloads':
            return WORKLOAD_COLUMNS, workload_rows(plan)
        if part == 'summary':
            return SUMMARY_COLUMNS, summary_rows(plan)
        return GPU_COLUMNS, gpu_rows(plan)

    def produce_output(self, parsed_args: argparse.Namespace,
                       column_names: Sequence[str], data: Any) -> int:
        out = self.app.stdout
        if parsed_args.part == 'all':
            if parsed_args.formatter == 'json':
                out.write(json.dumps(plan_dict(self._plan, self._warnings),
                                     indent=2) + '\n')
            elif parsed_args.formatter == 'yaml':
                out.write(yamlutil.dump(plan_dict(self._plan,
                                                  self._warnings)))
            else:
                out.write(render_table(self._plan, self._warnings))
            return 0
        for warning in self._warnings:
            # one part alone keeps stdout to the formatter's output
            self.app.stderr.write('warning: %s\n' % warning)
        if parsed_args.part == 'summary' and parsed_args.formatter in (
                'json', 'yaml', 'value'):
            # one object: {"placed": 40, "bound.placed": 41, ...}
            rows = list(data)
            fields = [r[0] for r in rows]
            columns, selector = self._generate_columns_and_selector(
                parsed_args, fields)
            values = [r[1] for r in rows]
            if selector is not None:
                values = [v for v, keep in zip(values, selector,
                                               strict=True) if keep]
            self.formatter.emit_one(  # type: ignore[attr-defined]
                columns, values, out, parsed_args)
            return 0
        return super().produce_output(parsed_args, column_names, data)


class Explain(command.Command):
    """Explain the decision about one workload: every rule's verdict.

    Plans the same inputs as "plan" and prints, for the named workload,
    the code, the grant, the reason and the trail: every filter's verdict
    with its numbers and the weighers' scores of each candidate. With
    --running-from k8s it also prints how each granted GPU's memory limit
    is enforced there (kernel, hook, kernel+hook or none), as its node
    registers it.
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument('workload',
                            help='name of the workload, as in the workload '
                                 'file (see "amdgpu-virt plan")')
        _add_inputs(parser)
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        warnings: list[str] = []
        report = cmd_progress.reporter(self.app, parsed_args, 'explain')
        try:
            plan = make_plan(
                self.app.get_conf(),  # type: ignore[attr-defined]
                parsed_args, self.app, warnings, report)
        finally:
            if report is not None:
                report.close()
        for warning in warnings:
            self.app.stderr.write('warning: %s\n' % warning)
        decision = plan.decision(parsed_args.workload)
        out = self.app.stdout
        out.write('%s: %s\n' % (decision.workload, decision.code.value))
        if decision.placed:
            out.write('  %s on %s: %s\n' % (
                decision.kind.value if decision.kind else '-',
                decision.host, ', '.join('%s %s' % (g.address, g.describe())
                                         for g in decision.grants)))
        levels = cmd_running.memory_enforcement(self.app, parsed_args).get(
            decision.host or '', {}) if decision.placed else {}
        for grant in decision.grants if levels else ():
            level = levels.get(str(grant.address))
            if level is not None:
                out.write('  memory enforcement of %s (live): %s\n' % (
                    grant.address, level))
        out.write('  reason: %s\n' % decision.reason)
        if decision.unverified:
            out.write('  note: unverified on real hardware (mixed host '
                      'drivers)\n')
        out.write('trail:\n')
        for verdict in decision.trail:
            out.write('  %s\n' % verdict)
        return 0
