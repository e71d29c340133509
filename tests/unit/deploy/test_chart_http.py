"""The chart's ``http`` values: the ``[kubernetes] http_*`` limits.

Rendered by the real Helm engine, read back by oslo.config from the
rendered ConfigMap, and compared with the options themselves, so that the
chart's schema, its defaults and the options cannot drift apart. Also the
DRA plugin's ``dra.sliceLayout``.
"""

from __future__ import annotations

import configparser
import json
import os

import fixtures
import testtools
import yaml

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.conf import kubernetes as k8s_opts
from amdgpu_virt.k8s.api import httpserver
from tests.unit.deploy import chart

#: value key -> option name
KEYS = {
    'maxConnections': 'http_max_connections',
    'maxConnectionsPerPeer': 'http_max_connections_per_peer',
    'workers': 'http_workers',
    'maxQueue': 'http_max_queue',
    'maxBodyBytes': 'http_max_body_bytes',
    'handshakeTimeout': 'http_handshake_timeout',
    'requestTimeout': 'http_request_timeout',
    'minRequestRate': 'http_min_request_rate',
    'idleTimeout': 'http_idle_timeout',
    'handlerTimeout': 'http_handler_timeout',
}


def _options():
    return {opt.dest: opt for opt in k8s_opts.kubernetes_opts
            if opt.dest.startswith('http_')}


def _schema():
    with open(os.path.join(chart.CHART, 'values.schema.json')) as handle:
        return json.load(handle)


def _defaults():
    with open(os.path.join(chart.CHART, 'values.yaml')) as handle:
        return yaml.safe_load(handle)


class TestValuesMatchTheOptions(testtools.TestCase):

    def test_every_option_has_a_value(self):
        self.assertEqual(set(_options()), set(KEYS.values()))
        self.assertEqual(set(KEYS), set(_schema()['properties']['http'][
            'properties']))

    def test_ranges_types_and_defaults(self):
        schema = _schema()['properties']['http']
        defaults = _defaults()['http']
        options = _options()
        for key, dest in KEYS.items():
            opt = options[dest]
            prop = schema['properties'][key]
            self.assertEqual((opt.type.min, opt.type.max),
                             (prop['minimum'], prop['maximum']), key)
            integer = isinstance(opt.default, int)
            self.assertEqual('integer' if integer else 'number',
                             prop['type'], key)
            self.assertEqual(opt.default, defaults[key], key)
        self.assertFalse(schema['additionalProperties'])
        self.assertEqual(set(KEYS), set(schema['required']))


class TestRendered(testtools.TestCase):

    def conf_of(self, values):
        """The configuration the components read, from the rendering."""
        docs = chart.documents(values)
        text = chart.find(docs, 'ConfigMap', 'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf']
        tmp = self.useFixture(fixtures.TempDir()).path
        path = os.path.join(tmp, 'amdgpu-virt.conf')
        with open(path, 'w') as handle:
            handle.write(text)
        parser = configparser.ConfigParser()
        parser.read_string(text)
        return conf_pkg.new_conf(default_config_files=[path]), parser

    def test_defaults_are_the_options_defaults(self):
        conf, parser = self.conf_of({})
        self.assertEqual(httpserver.Limits(), httpserver.Limits.from_conf(
            conf))
        self.assertEqual(set(KEYS.values()),
                         {k for k in parser['kubernetes']
                          if k.startswith('http_')})

    def test_values_reach_the_servers_limits(self):
        conf, _parser = self.conf_of({'http': {
            'maxConnections': 65536, 'workers': 1, 'maxQueue': 0,
            'maxBodyBytes': 268435456, 'handshakeTimeout': 0.1,
            'requestTimeout': 29.5, 'idleTimeout': 3600,
            'handlerTimeout': 600}})
        limits = httpserver.Limits.from_conf(conf)
        self.assertEqual(
            (65536, 1, 0, 268435456, 0.1, 29.5, 3600.0, 600.0),
            (limits.max_connections, limits.workers, limits.max_queue,
             limits.max_body_bytes, limits.handshake_timeout,
             limits.request_timeout, limits.idle_timeout,
             limits.handler_timeout))

    def test_one_value_changes_one_option(self):
        conf, _parser = self.conf_of({'http': {'idleTimeout': 5}})
        limits = httpserver.Limits.from_conf(conf)
        self.assertEqual(5.0, limits.idle_timeout)
        self.assertEqual(1024, limits.max_connections)

    def _error(self, values):
        return chart.schema_error(values)

    def test_out_of_range_values_are_refused_naming_the_field(self):
        for key, bad in (('maxConnections', 15), ('maxConnections', 65537),
                         ('workers', 0), ('maxQueue', -1),
                         ('maxBodyBytes', 268435457), ('maxBodyBytes', 1.5),
                         ('handshakeTimeout', 0), ('requestTimeout', 301),
                         ('idleTimeout', '60s')):
            self.assertIn('/http/%s' % key, self._error(
                {'http': {key: bad}}), (key, bad))
        # null removes a value in Helm: the schema wants it back
        self.assertIn("missing property 'handlerTimeout'", self._error(
            {'http': {'handlerTimeout': None}}))
        self.assertIn("'maxHeaders' not allowed", self._error(
            {'http': {'maxHeaders': 1}}))


class TestDraSliceLayout(testtools.TestCase):

    def env(self, values):
        docs = chart.documents(dict(values, dra=dict(
            values.get('dra', {}), enabled=True)))
        pod = chart.find(docs, 'DaemonSet', 'amdgpu-virt-dra-plugin')[
            'spec']['template']['spec']
        (container,) = pod['containers']
        return {e['name']: e.get('value') for e in container['env']}

    def test_rendered_into_the_plugins_environment(self):
        self.assertEqual('auto', self.env({})['OS_DRA__SLICE_LAYOUT'])
        self.assertEqual('mixed', self.env({'dra': {'sliceLayout': 'mixed'}})[
            'OS_DRA__SLICE_LAYOUT'])
        conf = conf_pkg.new_conf()
        conf.set_override('slice_layout', 'separate', group='dra')
        self.assertEqual('separate', conf.dra.slice_layout)

    def test_unknown_layouts_are_refused(self):
        self.assertIn('/dra/sliceLayout', chart.schema_error({'dra': {
            'enabled': True, 'sliceLayout': '1.34'}}))


class TestHostileClientValues(testtools.TestCase):
    """The review budget and where the probe listener binds."""

    def _config(self, values):
        docs = chart.documents(values)
        text = chart.find(docs, 'ConfigMap', 'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf']
        parser = configparser.ConfigParser()
        parser.read_string(text)
        return parser

    def test_review_budget_is_below_the_api_servers_wait(self):
        self.assertEqual('5', self._config({})['kubernetes'][
            'webhook_review_budget'])
        self.assertEqual('2.5', self._config({'webhook': {
            'timeoutSeconds': 5}})['kubernetes']['webhook_review_budget'])
        self.assertEqual('7', self._config({'webhook': {
            'reviewBudget': 7}})['kubernetes']['webhook_review_budget'])
        import helm_python

        with helm_python.Chart.load(chart.CHART) as loaded:
            err = self.assertRaises(
                helm_python.errors.HelmRenderError, loaded.render,
                {'webhook': {'reviewBudget': 10}}, name='amdgpu-virt',
                namespace=chart.NAMESPACE)
        self.assertIn('webhook.reviewBudget must be below '
                      'webhook.timeoutSeconds', str(err))

    def test_probe_listener_binds_the_pod_address(self):
        parser = self._config({})
        self.assertNotIn('metrics_host', parser['scheduler'])
        deployment = chart.find(chart.documents({}), 'Deployment',
                                'amdgpu-virt-scheduler')
        (extender,) = [c for c in deployment['spec']['template']['spec'][
            'containers'] if c['name'] == 'extender']
        self.assertIn({'name': 'POD_IP', 'valueFrom': {'fieldRef': {
            'fieldPath': 'status.podIP'}}}, extender['env'])
