"""The fleet's status as one self-contained HTML page.

One file, nothing fetched: the style is inline, the occupancy chart is the
plan chart's SVG (:func:`amdgpu_virt.policy.chart.svg`) inlined, there is
no script, and a Content-Security-Policy forbids loading anything, so the
page shows the same offline, from a mail attachment or a ticket.

Every text comes from input someone else controls (pod, claim and node
names, a node's health reason, host names of a ledger or a snapshot): all
of it is escaped (:func:`html.escape`, quotes included, in text and in
attributes alike), so a name like ``<img src=x onerror=...>`` shows as
those characters and does nothing.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from amdgpu_virt.policy import chart
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.result import GpuReport
from amdgpu_virt.pool.observed import UNHEALTHY
from amdgpu_virt.status.view import COLUMNS
from amdgpu_virt.status.view import FleetStatus
from amdgpu_virt.status.view import GpuStatus

#: nothing may be loaded, nothing may run: only the inline style
POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
          "base-uri 'none'; form-action 'none'")

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 1.6em; }
.meta { color: #555; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 0.6em; margin: 0; }
.card { border: 1px solid #ccc; border-radius: 4px; padding: 0.4em 0.8em;
        min-width: 7em; }
.card dt { font-size: 0.8em; color: #555; }
.card dd { margin: 0; font-size: 1.3em; font-weight: bold; }
.card.bad dd { color: #b00020; }
.card .of { font-size: 0.7em; font-weight: normal; color: #555; }
.chart { overflow-x: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: left;
         vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.unhealthy td.health { background: #fde2e4; color: #8a0015;
                         font-weight: bold; }
tr.conflict td.drift { background: #fde2e4; color: #8a0015;
                       font-weight: bold; }
tr.drift td.drift { background: #fff4d6; }
.conflict { color: #8a0015; }
.none { color: #777; }
"""

#: (summary key, label, a non-zero value is bad, the total it is of)
_CARDS = (
    ('gpus', 'GPUs', False, None), ('in_use', 'in use', False, 'gpus'),
    ('users', 'users', False, None), ('cus_free', 'CUs free', False, 'cus'),
    ('mib_free', 'MiB free', False, 'vram_mib'),
    ('vfs_free', 'VFs free', False, 'vfs'),
    ('unhealthy', 'unhealthy', True, None),
    ('health_unknown', 'health unknown', False, None),
    ('conflicts', 'conflicts', True, None), ('drift', 'drift', True, None),
)


def _e(value: Any) -> str:
    return html.escape('' if value is None else str(value), quote=True)


def _summary(status: FleetStatus) -> str:
    summary = status.summary()
    cards = []
    for key, label, alarming, total in _CARDS:
        value = summary[key]
        bad = ' bad' if alarming and value else ''
        of = ('<span class="of"> of %s</span>' % _e(summary[total])
              if total else '')
        cards.append('<div class="card%s" id="card-%s"><dt>%s</dt>'
                     '<dd>%s%s</dd></div>' % (
                         bad, _e(key.replace('_', '-')), _e(label),
                         _e(value), of))
    return '<dl class="cards">%s</dl>' % ''.join(cards)


def _row(gpu: GpuStatus) -> str:
    classes = []
    if gpu.health == UNHEALTHY:
        classes.append('unhealthy')
    severities = {f.severity for f in gpu.findings}
    if 'conflict' in severities:
        classes.append('conflict')
    elif 'drift' in severities:
        classes.append('drift')
    cells = []
    for column, value in zip(COLUMNS, gpu.row(), strict=True):
        kind = column.lower().replace(' ', '-')
        numeric = isinstance(value, int)
        css = [kind] + (['num'] if numeric else [])
        if value in (None, ''):
            value, css = '-', css + ['none']
        cells.append('<td class="%s">%s</td>' % (_e(' '.join(css)),
                                                  _e(value)))
    return '<tr class="%s" data-host="%s" data-gpu="%s">%s</tr>' % (
        _e(' '.join(classes)), _e(gpu.host), _e(gpu.address),
        ''.join(cells))


def _gpu_table(status: FleetStatus) -> str:
    head = ''.join('<th scope="col">%s</th>' % _e(c) for c in COLUMNS)
    body = ''.join(_row(g) for g in status.gpus)
    return ('<table id="gpu-table"><thead><tr>%s</tr></thead>'
            '<tbody>%s</tbody></table>' % (head, body))


def _findings(status: FleetStatus) -> str:
    if not status.findings:
        return '<p class="none" id="no-findings">No findings.</p>'
    rows = ''.join(
        '<tr class="%s"><td>%s</td><td>%s</td><td>%s</td><td>%s</td>'
        '<td>%s</td></tr>' % (_e(f.severity), _e(f.host), _e(f.address),
                              _e(f.severity), _e(f.kind.value),
                              _e(f.message))
        for f in status.findings)
    return ('<table id="findings-table"><thead><tr><th>Host</th><th>GPU'
            '</th><th>Severity</th><th>Finding</th><th>Detail</th></tr>'
            '</thead><tbody>%s</tbody></table>' % rows)


def _warnings(status: FleetStatus) -> str:
    if not status.warnings:
        return '<p class="none" id="no-warnings">No warnings.</p>'
    return '<ul id="warnings-list">%s</ul>' % ''.join(
        '<li>%s</li>' % _e(w) for w in status.warnings)


def _chart(gpus: Sequence[GpuReport], decisions: Iterable[Decision]) -> str:
    svg = chart.svg(gpus, title='GPU use', decisions=decisions)
    # inline: the XML declaration belongs to a file of its own
    return svg.split('?>', 1)[1].strip() if svg.startswith('<?xml') else svg


def render(status: FleetStatus, gpus: Sequence[GpuReport],
           decisions: Iterable[Decision], taken: str) -> str:
    """The page.

    :param gpus: the plan's GPU reports (the chart).
    :param decisions: the running placements (the VRAM they hold).
    :param taken: when the state was read (shown as is).
    """
    sides = ', '.join(status.sides) or 'none'
    return ''.join((
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="%s">'
        % _e(POLICY),
        '<meta name="viewport" content="width=device-width">',
        '<title>amdgpu-virt status</title><style>%s</style></head>\n'
        % STYLE,
        '<body><h1>GPU fleet status</h1>',
        '<p class="meta" id="meta">Taken %s; roles from %s; clouds asked: '
        '%s.</p>' % (_e(taken), _e(status.ledger or 'no ledger'),
                     _e(sides)),
        '<section id="summary"><h2>Summary</h2>%s</section>\n'
        % _summary(status),
        '<section id="chart"><h2>Occupancy</h2><div class="chart">%s'
        '</div></section>\n' % _chart(gpus, decisions),
        '<section id="gpus"><h2>GPUs</h2>%s</section>\n'
        % _gpu_table(status),
        '<section id="findings"><h2>Findings</h2>%s</section>\n'
        % _findings(status),
        '<section id="warnings"><h2>Warnings</h2>%s</section>\n'
        % _warnings(status),
        '</body></html>\n'))
