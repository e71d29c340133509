"""The chart's Grafana dashboard: valid PromQL over metrics we export.

Every PromQL expression of the dashboard (panel targets and template
variable queries) is parsed by ``promql-parser`` (the Rust parser of the
Prometheus grammar), after Grafana's variables are replaced the way
Grafana does; every metric name in it must be one the components really
export: the names are collected from the real registries (the node
telemetry collector reading a simulated node with a pod, a grant and an
enforcement level, and the scheduler extender's metrics), not from a
list kept by hand.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

import promql_parser
import testtools

from amdgpu_virt.inventory import simnode
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import health as node_health
from amdgpu_virt.k8s.node import telemetry
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.scheduler import metrics as extender_metrics
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from tests.unit.deploy import chart

DASHBOARD = os.path.join(chart.CHART, 'dashboards', 'amdgpu-virt.json')
#: what Grafana puts in place of its variables before sending a query
VARIABLES = {'$__rate_interval': '5m', '$__interval': '1m',
             '$__range': '1h', '${datasource}': 'prom'}
_VARIABLE = re.compile(r'\$\{?[A-Za-z_][A-Za-z0-9_]*\}?')
_LABEL_VALUES = re.compile(r'^label_values\((?:(.+),\s*)?([a-zA-Z_]\w*)\)$')
UID = '0b6f0c55-6a1e-4b2c-9d7a-1f2e3d4c5b6a'
CID = 'd' * 64


def grafana_expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    # a multi-value variable becomes a regex alternation
    return _VARIABLE.sub('.*', expr)


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every query of the dashboard."""
    for panel in dashboard['panels']:
        for target in panel.get('targets', ()):
            yield 'panel %r %s' % (panel['title'], target['refId']), \
                target['expr']
    for variable in dashboard['templating']['list']:
        if variable['type'] != 'query':
            continue
        query = variable['query']
        text = query['query'] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(text.strip())
        if match is None:
            yield 'variable %s' % variable['name'], text
        elif match.group(1):
            yield 'variable %s' % variable['name'], match.group(1)


def metric_names(node: Any) -> set[str]:
    """Every metric name an expression selects."""
    names: set[str] = set()

    def visit(item: Any) -> None:
        if isinstance(item, promql_parser.VectorSelector):
            if item.name:
                names.add(item.name)
            for matcher in item.matchers.matchers:
                if matcher.name == '__name__':
                    names.add(matcher.value)
            return
        if isinstance(item, promql_parser.MatrixSelector):
            visit(item.vector_selector)
        elif isinstance(item, promql_parser.BinaryExpr):
            visit(item.lhs)
            visit(item.rhs)
        elif isinstance(item, promql_parser.Call):
            for arg in item.args:
                visit(arg)
        elif isinstance(item, (promql_parser.AggregateExpr,
                               promql_parser.ParenExpr,
                               promql_parser.SubqueryExpr,
                               promql_parser.UnaryExpr)):
            visit(item.expr)
            if isinstance(item, promql_parser.AggregateExpr) and \
                    item.param is not None:
                visit(item.param)

    visit(node)
    return names


def exported_names() -> set[str]:
    """Sample names of the node telemetry and the extender, collected
    from their registries."""
    root = tempfile.mkdtemp(prefix='dash')
    inventory = simulate.simulate_host(simulate.HostSpec(
        hostname='n1', gpus=2), root)
    units = devices.units_from_inventory(inventory)
    address = units[0].gpu_address
    simnode.enable_dmem(root, {address: 192 << 30})
    simnode.add_container(root, UID, CID, current={address: 1 << 30},
                          limit={address: 2 << 30})
    pods = [{'metadata': {'uid': UID, 'namespace': 'team', 'name': 'job'},
             'spec': {'nodeName': 'n1'},
             'status': {'containerStatuses': [{
                 'name': 'main', 'containerID': 'containerd://' + CID}]}}]
    record = allocrecord.Record('n1', {UID: allocrecord.PodGrants(
        UID, 'team', 'job', 1, ((allocrecord.Grant(units[0].uuid, 1024,
                                                   0xff),),))})
    errors = node_health.ErrorCounts()
    errors.add('ras')
    collector = telemetry.NodeTelemetry(
        'n1', units, 10, root, os.path.join(root, 'fs', 'cgroup'),
        health=node_health.HealthMonitor(units, root, root, errors=errors),
        enforcement=lambda address: 'kernel', pods=lambda: pods,
        record=lambda: record)
    collector.dropped['unattributed'] = 1
    extender = extender_metrics.Metrics(schedcache.ClusterCache())
    # a labelled counter has series once something is counted
    extender.decisions.labels('filter', 'fit').inc()
    names = set()
    for registry in (collector.registry, extender.registry):
        for family in registry.collect():
            names.update(sample.name for sample in family.samples)
    return names


class DashboardTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        with open(DASHBOARD, encoding='utf-8') as source:
            self.dashboard = json.load(source)

    def test_every_query_parses_and_names_exported_metrics(self) -> None:
        exported = exported_names()
        seen: set[str] = set()
        checked = 0
        for where, expr in expressions(self.dashboard):
            try:
                parsed = promql_parser.parse(grafana_expand(expr))
            except Exception as err:  # the parser's own error types
                self.fail('%s: %r is not PromQL: %s' % (where, expr, err))
            names = metric_names(parsed)
            self.assertTrue(names, '%s selects no metric' % where)
            unknown = names - exported
            self.assertFalse(unknown, '%s uses metrics nothing exports: %s'
                             % (where, sorted(unknown)))
            seen |= names
            checked += 1
        self.assertGreater(checked, 20)
        # the panels cover the node, the pods, health and the extender
        for name in ('hami_host_gpu_memory_used_bytes',
                     'hami_vgpu_memory_used_bytes',
                     'amdgpu_virt_gpu_healthy',
                     'amdgpu_virt_gpu_ras_errors_total',
                     'amdgpu_virt_extender_filter_seconds_bucket'):
            self.assertIn(name, seen)

    def test_the_checker_catches_a_misspelt_metric(self) -> None:
        parsed = promql_parser.parse(grafana_expand(
            'sum by (node) (rate(hami_vgpu_memory_usd_bytes{node=~"$node"}'
            '[$__rate_interval])) / on (node) amdgpu_virt_gpu_info'))
        self.assertEqual({'hami_vgpu_memory_usd_bytes',
                          'amdgpu_virt_gpu_info'}, metric_names(parsed))
        self.assertNotIn('hami_vgpu_memory_usd_bytes', exported_names())
        self.assertRaises(ValueError, promql_parser.parse,
                          'sum by (node (hami_host_gpu_utilization_ratio)')

    def test_the_chart_ships_it_for_the_sidecar(self) -> None:
        docs = chart.variant('monitoring')
        config_map = chart.find(docs, 'ConfigMap', 'amdgpu-virt-dashboard')
        self.assertEqual('1', config_map['metadata']['labels'][
            'grafana_dashboard'])
        self.assertEqual('monitoring', config_map['metadata']['namespace'])
        self.assertEqual(self.dashboard, json.loads(
            config_map['data']['amdgpu-virt.json']))
        monitor = chart.find(docs, 'PodMonitor', 'amdgpu-virt-node')
        self.assertEqual('prom', monitor['metadata']['labels']['release'])
        self.assertEqual([{'port': 'metrics', 'path': '/metrics',
                           'interval': '30s'}],
                         monitor['spec']['podMetricsEndpoints'])
        names = {(d['kind'], d['metadata']['name'])
                 for d in chart.documents()}
        self.assertNotIn(('ConfigMap', 'amdgpu-virt-dashboard'), names)
        self.assertNotIn(('PodMonitor', 'amdgpu-virt-node'), names)
