"""The Helm chart, rendered and linted by the real Helm engine.

Every object of every documented variant passes kubernetes-validate's
strict schemas of each Kubernetes release from 1.33 that the installed
package knows; bad values fail at install naming the field; and
deploy/kubernetes/ is the chart's default rendering.
"""

from __future__ import annotations

import base64
import configparser
import datetime
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import fixtures
import helm_python
import jsonschema
import kubernetes_validate
from kubernetes_validate import utils as kv_utils
import referencing
import testtools
import yaml

from tests.unit.deploy import chart

#: kinds whose schemas come with their operators' CRDs, which
#: kubernetes-validate does not ship; checked by hand below
CRD_KINDS = {('cert-manager.io/v1', 'Issuer'),
             ('cert-manager.io/v1', 'Certificate'),
             ('monitoring.coreos.com/v1', 'ServiceMonitor'),
             ('monitoring.coreos.com/v1', 'PodMonitor')}


def kubernetes_versions() -> list[str]:
    versions = set()
    for version in kv_utils.all_versions():
        major, minor = (int(p) for p in version.split('.')[:2])
        if (major, minor) >= (1, 33):
            versions.add(version)
    return sorted(versions, key=lambda v: [int(p) for p in v.split('.')])


@functools.cache
def _validator(version: str, api_version: str, kind: str) -> Any:
    """kubernetes-validate's strict schema of one kind, compiled once.

    The schema files and their choice are kubernetes-validate's own (as in
    ``kubernetes_validate.validate(doc, version, strict=True)``); only the
    compiled validator is kept, since the library re-reads its large
    definitions file at every call.
    """
    schema_version = [v for v in kv_utils.all_versions()
                      if kv_utils.major_minor(v) <=
                      kv_utils.major_minor(version)][-1]
    directory = 'kubernetes-json-schema/v%s-local-strict' % schema_version
    group = re.sub(r'^([^./]*)(?:\.[^/]*)?/', r'\1-', api_version)
    try:
        schema = kv_utils.schema_contents(
            '%s/%s-%s.json' % (directory, kind.lower(), group), version)
    except FileNotFoundError:
        raise kubernetes_validate.SchemaNotFoundError(
            version=version, kind=kind, api_version=api_version) from None
    definitions = kv_utils.schema_contents(
        '%s/_definitions.json' % directory, version)
    registry = (referencing.Resource.from_contents(definitions) @
                (referencing.Resource.from_contents(schema) @
                 referencing.Registry()))
    return jsonschema.validators.Draft202012Validator(schema,
                                                      registry=registry)


#: the fields of KubeSchedulerConfiguration v1 the chart may set, from
#: k8s.io/kube-scheduler/config/v1 (types.go) and the component-base
#: leader election configuration; a dict value names the fields of each
#: item (lists) or of the object
KUBE_SCHEDULER_V1: dict[str, Any] = {
    'apiVersion': None, 'kind': None, 'parallelism': None,
    'leaderElection': {'leaderElect': None, 'leaseDuration': None,
                       'renewDeadline': None, 'retryPeriod': None,
                       'resourceLock': None, 'resourceName': None,
                       'resourceNamespace': None},
    'clientConnection': None, 'enableProfiling': None,
    'enableContentionProfiling': None, 'percentageOfNodesToScore': None,
    'podInitialBackoffSeconds': None, 'podMaxBackoffSeconds': None,
    'profiles': {'schedulerName': None, 'percentageOfNodesToScore': None,
                 'plugins': None, 'pluginConfig': None},
    'extenders': {'urlPrefix': None, 'filterVerb': None,
                  'preemptVerb': None, 'prioritizeVerb': None,
                  'weight': None, 'bindVerb': None, 'enableHTTPS': None,
                  'tlsConfig': None, 'httpTimeout': None,
                  'nodeCacheCapable': None,
                  'managedResources': {'name': None,
                                       'ignoredByScheduler': None},
                  'ignorable': None},
    'delayCacheUntilActive': None,
}


def _known(test: testtools.TestCase, value: Any, fields: dict[str, Any],
           where: str) -> None:
    """Every key of ``value`` (a dict or a list of dicts) is in
    ``fields``, recursively."""
    for item in value if isinstance(value, list) else [value]:
        test.assertIsInstance(item, dict, where)
        for key, inner in item.items():
            test.assertIn(key, fields, '%s.%s' % (where, key))
            if fields[key] is not None:
                _known(test, inner, fields[key], '%s.%s' % (where, key))


def strict_validate(doc: dict[str, Any], version: str) -> None:
    """:raises jsonschema.ValidationError: naming the path at fault."""
    _validator(version, doc['apiVersion'], doc['kind']).validate(doc)


def _shape(doc: dict[str, Any]) -> str:
    """The object without its config checksum annotation, which differs
    between variants but not in what the schema checks."""
    copy = json.loads(json.dumps(doc))
    annotations = (((copy.get('spec') or {}).get('template') or {}).get(
        'metadata') or {}).get('annotations') or {}
    annotations.pop('checksum/config', None)
    return json.dumps(copy, sort_keys=True)


class KubernetesVersionsTest(testtools.TestCase):

    def test_versions_1_33_to_1_37_are_known(self) -> None:
        minors = {v.rsplit('.', 1)[0] for v in kubernetes_versions()}
        self.assertTrue({'1.33', '1.34', '1.35', '1.36', '1.37'} <= minors,
                        minors)


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split('.')[:2]
    return int(major), int(minor)


class StrictValidationTest(testtools.TestCase):

    def test_every_variant_is_valid_on_every_version(self) -> None:
        seen: set[str] = set()
        checked = 0
        for name in chart.VARIANTS:
            docs = chart.variant(name)
            self.assertGreater(len(docs), 5, name)
            for doc in docs:
                key = _shape(doc)
                if key in seen:
                    continue  # the same object in another variant
                seen.add(key)
                if (doc['apiVersion'], doc['kind']) in CRD_KINDS:
                    self._check_crd_object(name, doc)
                    continue
                for version in kubernetes_versions():
                    if doc['apiVersion'] == 'resource.k8s.io/v1' and \
                            _minor(version) < (1, 34):
                        # DRA's v1 API is served from 1.34 on (dra.rst
                        # says so): such a cluster has no schema for it
                        self.assertRaises(
                            kubernetes_validate.SchemaNotFoundError,
                            strict_validate, doc, version)
                        continue
                    try:
                        strict_validate(doc, version)
                    except jsonschema.ValidationError as err:
                        self.fail('%s: %s %s on %s: %s' % (
                            name, doc['kind'], doc['metadata']['name'],
                            version, err))
                    checked += 1
        self.assertGreater(checked, 60)

    def _check_crd_object(self, variant: str, doc: dict) -> None:
        self.assertEqual({'apiVersion', 'kind', 'metadata', 'spec'},
                         set(doc), variant)
        spec = doc['spec']
        if doc['kind'] == 'Certificate':
            self.assertTrue({'secretName', 'dnsNames', 'issuerRef'}
                            <= set(spec), variant)
        elif doc['kind'] == 'ServiceMonitor':
            self.assertTrue(spec['endpoints'] and spec['selector'], variant)
        elif doc['kind'] == 'PodMonitor':
            self.assertTrue(spec['podMetricsEndpoints'] and spec['selector'],
                            variant)

    def test_validator_catches_mistakes(self) -> None:
        doc = chart.find(chart.documents(), 'DaemonSet', 'amdgpu-virt-node')
        doc['spec']['template']['spec']['priorityClasName'] = 'typo'
        for version in kubernetes_versions():
            self.assertRaises(kubernetes_validate.ValidationError,
                              kubernetes_validate.validate, doc, version,
                              True)
            self.assertRaises(jsonschema.ValidationError, strict_validate,
                              doc, version)

    def test_cached_validator_agrees_with_the_library(self) -> None:
        # one object of each kind (the library re-reads its schemas at
        # every call, which is slow)
        latest = kubernetes_versions()[-1]
        kinds: dict[str, dict] = {}
        for doc in chart.documents():
            if (doc['apiVersion'], doc['kind']) not in CRD_KINDS:
                kinds.setdefault(doc['kind'], doc)
        self.assertGreater(len(kinds), 10)
        for doc in kinds.values():
            kubernetes_validate.validate(doc, latest, strict=True)
            strict_validate(doc, latest)
            broken = json.loads(json.dumps(doc))
            broken['metadata']['labelz'] = {}
            self.assertRaises(jsonschema.ValidationError, strict_validate,
                              broken, latest)

    def test_crd_kinds_are_really_unknown_to_the_validator(self) -> None:
        # if kubernetes-validate learns them, validate them strictly
        doc = chart.find(chart.documents(), 'Certificate',
                         'amdgpu-virt-webhook')
        self.assertRaises(kubernetes_validate.SchemaNotFoundError,
                          kubernetes_validate.validate, doc,
                          kubernetes_versions()[-1], True)
        self.assertRaises(kubernetes_validate.SchemaNotFoundError,
                          strict_validate, doc, kubernetes_versions()[-1])


class LintTest(testtools.TestCase):

    def test_lint_is_clean_for_every_variant(self) -> None:
        for name, values in chart.VARIANTS.items():
            report = helm_python.lint(
                chart.CHART, values or None, strict=True,
                namespace=chart.VARIANT_NAMESPACES.get(name,
                                                       chart.NAMESPACE))
            self.assertEqual([], report['errors'], name)
            self.assertEqual(
                [], [m for m in report['messages'] if m['severity'] >= 2],
                name)

    def test_chart_metadata(self) -> None:
        with helm_python.Chart.load(chart.CHART) as loaded:
            meta = loaded.metadata
            self.assertEqual('amdgpu-virt', meta['name'])
            self.assertEqual('v2', meta['apiVersion'])
            self.assertIsNotNone(loaded.schema)

    def test_the_default_image_tag_is_the_package_release(self) -> None:
        # the image tag defaults to appVersion: a release build (pbr,
        # from the git tag) must be tagged exactly that, or a default
        # install pulls a tag nothing built
        import pbr.version
        with helm_python.Chart.load(chart.CHART) as loaded:
            meta = loaded.metadata
        parser = configparser.ConfigParser()
        parser.read(os.path.join(chart.ROOT, 'setup.cfg'))
        planned = parser['metadata']['version']
        installed = pbr.version.VersionInfo(
            'amdgpu_virt').semantic_version().brief_string()
        self.assertEqual(planned, installed)
        self.assertEqual(planned, meta['appVersion'])
        self.assertEqual(planned, meta['version'])
        image = chart.find(chart.documents(), 'DaemonSet',
                           'amdgpu-virt-node')['spec']['template']['spec'][
            'containers'][0]['image']
        self.assertTrue(image.endswith(':' + planned), image)


class SchemaTest(testtools.TestCase):
    """Bad values fail before anything is rendered, naming the field."""

    def _error(self, values: dict) -> str:
        with helm_python.Chart.load(chart.CHART) as loaded:
            err = self.assertRaises(helm_python.HelmValuesError,
                                    loaded.render, values,
                                    name='amdgpu-virt',
                                    namespace=chart.NAMESPACE)
        return str(err)

    def test_bad_values_name_the_field(self) -> None:
        cases = [
            ({'shareCount': 0}, '/shareCount'),
            ({'shareCount': '10'}, '/shareCount'),
            ({'webhook': {'failurePolicy': 'Sometimes'}},
             '/webhook/failurePolicy'),
            ({'webhook': {'timeoutSeconds': 31}}, '/webhook/timeoutSeconds'),
            ({'webhook': {'tls': {'mode': 'by-hand'}}}, '/webhook/tls/mode'),
            ({'node': {'memoryHook': {'path': 'libamvgpu.so'}}},
             '/node/memoryHook/path'),
            ({'node': {'allocationMode': 'mig'}}, '/node/allocationMode'),
            ({'image': {'pullPolicy': 'Sometimes'}}, '/image/pullPolicy'),
            ({'scheduler': {'replicas': -1}}, '/scheduler/replicas'),
            ({'scheduler': {'extender': {'port': 70000}}},
             '/scheduler/extender/port'),
            ({'isolatedNamespaceLabel': 'no-value'},
             '/isolatedNamespaceLabel'),
            ({'resourceName': 'nvidia.com/gpu'}, '/resourceName'),
            ({'webhhook': {}}, "'webhhook' not allowed"),
            ({'admissionPolicies': {'validationActions': ['Reject']}},
             '/admissionPolicies/validationActions/0'),
        ]
        for values, field in cases:
            self.assertIn(field, self._error(values), values)

    def test_values_cannot_inject_cel(self) -> None:
        # user names are pasted into CEL string literals
        for user in ["x' || true || '", 'a b', 'x\\']:
            self.assertIn('/admissionPolicies/extraAllocationWriters/0',
                          self._error({'admissionPolicies': {
                              'extraAllocationWriters': [user]}}))

    def test_service_monitor_scrapes_the_metrics_listener(self) -> None:
        # the extender port stays on 127.0.0.1; Prometheus reaches the
        # second listener, which the NetworkPolicy admits from metricsFrom
        scrapers = [{'namespaceSelector': {'matchLabels': {
            'kubernetes.io/metadata.name': 'monitoring'}}}]
        docs = chart.documents({'serviceMonitor': {'enabled': True},
                                'networkPolicy': {'metricsFrom': scrapers}})
        service = chart.find(docs, 'Service', 'amdgpu-virt-scheduler-metrics')
        self.assertEqual([(8889, 'metrics')], [
            (p['port'], p['targetPort']) for p in service['spec']['ports']])
        policy = chart.find(docs, 'NetworkPolicy', 'amdgpu-virt-scheduler')
        self.assertEqual([{'ports': [{'protocol': 'TCP', 'port': 8889}],
                           'from': scrapers}], policy['spec']['ingress'])
        # without scrapers nothing from the network is admitted
        docs = chart.documents({'serviceMonitor': {'enabled': True}})
        self.assertEqual([], chart.find(
            docs, 'NetworkPolicy', 'amdgpu-virt-scheduler')['spec']['ingress'])


class DriftTest(testtools.TestCase):

    def test_deploy_kubernetes_is_the_default_rendering(self) -> None:
        wanted = chart.renderer.expected_files()
        present = sorted(n for n in os.listdir(chart.DEPLOY)
                         if n.endswith('.yaml'))
        self.assertEqual(sorted(wanted), present,
                         'run python3 deploy/render_manifests.py')
        for name, content in wanted.items():
            with open(os.path.join(chart.DEPLOY, name),
                      encoding='utf-8') as stream:
                self.assertEqual(content, stream.read(),
                                 'deploy/kubernetes/%s drifted from the '
                                 'chart: run python3 '
                                 'deploy/render_manifests.py' % name)

    def test_default_rendering_is_deterministic(self) -> None:
        chart._render.cache_clear()
        first = chart.render()
        chart._render.cache_clear()
        self.assertEqual(first, chart.render())

    def test_check_mode_reports_drift_and_rewrite_fixes_it(self) -> None:
        self.assertEqual(0, chart.renderer.main(['--check']))
        copy = self.useFixture(fixtures.TempDir()).path
        for name in os.listdir(chart.DEPLOY):
            shutil.copy(os.path.join(chart.DEPLOY, name), copy)
        with open(os.path.join(copy, 'rbac.yaml'), 'a') as out:
            out.write('# edited by hand\n')
        with open(os.path.join(copy, 'stale.yaml'), 'w') as out:
            out.write('kind: Stale\n')
        self.useFixture(fixtures.MonkeyPatch('sys.stdout', io.StringIO()))
        self.assertEqual(1, chart.renderer.main(['--check', '--output',
                                                 copy]))
        self.assertEqual(0, chart.renderer.main(['--output', copy]))
        self.assertEqual(0, chart.renderer.main(['--check', '--output',
                                                 copy]))
        self.assertFalse(os.path.exists(os.path.join(copy, 'stale.yaml')))


class HelmTlsTest(testtools.TestCase):
    """webhook.tls.mode=helm: a CA and a serving certificate for the
    Service, the CA in the webhook's caBundle."""

    def test_generated_certificate_serves_the_service(self) -> None:
        from cryptography import x509

        docs = chart.variant('helm-tls')
        secret = chart.find(docs, 'Secret', 'amdgpu-virt-webhook-tls')
        self.assertEqual('kubernetes.io/tls', secret['type'])
        hook = chart.find(docs, 'MutatingWebhookConfiguration',
                          'amdgpu-virt')
        self.assertNotIn('annotations', hook['metadata'])
        bundle = hook['webhooks'][0]['clientConfig']['caBundle']
        self.assertEqual(secret['data']['ca.crt'], bundle)
        ca = x509.load_pem_x509_certificate(base64.b64decode(bundle))
        cert = x509.load_pem_x509_certificate(
            base64.b64decode(secret['data']['tls.crt']))
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName)
        self.assertIn('amdgpu-virt-webhook.amdgpu-virt.svc', names)
        self.assertGreater(cert.not_valid_after_utc,
                           datetime.datetime.now(datetime.UTC)
                           + datetime.timedelta(days=3000))
        self.assertIn(b'PRIVATE KEY',
                      base64.b64decode(secret['data']['tls.key']))

    def test_cert_manager_mode_injects_the_ca(self) -> None:
        docs = chart.documents()
        hook = chart.find(docs, 'MutatingWebhookConfiguration',
                          'amdgpu-virt')
        self.assertEqual('amdgpu-virt/amdgpu-virt-webhook',
                         hook['metadata']['annotations'][
                             'cert-manager.io/inject-ca-from'])
        self.assertNotIn('caBundle', hook['webhooks'][0]['clientConfig'])
        cert = chart.find(docs, 'Certificate', 'amdgpu-virt-webhook')
        deploy = chart.find(docs, 'Deployment', 'amdgpu-virt-webhook')
        volumes = {v['name']: v for v in deploy['spec']['template'][
            'spec']['volumes']}
        self.assertEqual(cert['spec']['secretName'],
                         volumes['tls']['secret']['secretName'])
        self.assertEqual({'kind': 'Issuer', 'name': 'amdgpu-virt-selfsigned'},
                         cert['spec']['issuerRef'])
        chart.find(docs, 'Issuer', 'amdgpu-virt-selfsigned')
        self.assertEqual([], [d for d in docs if d['kind'] == 'Secret'])

    def test_cluster_issuer_replaces_the_self_signed_one(self) -> None:
        docs = chart.variant('cert-manager-cluster-issuer')
        self.assertEqual([], [d for d in docs if d['kind'] == 'Issuer'])
        cert = chart.find(docs, 'Certificate', 'amdgpu-virt-webhook')
        self.assertEqual('ClusterIssuer', cert['spec']['issuerRef']['kind'])


class VariantTest(testtools.TestCase):

    def test_disabled_components_render_nothing(self) -> None:
        kinds = {(d['kind'], d['metadata']['name'])
                 for d in chart.variant('node-only')}
        self.assertIn(('DaemonSet', 'amdgpu-virt-node'), kinds)
        self.assertNotIn(('Deployment', 'amdgpu-virt-scheduler'), kinds)
        self.assertNotIn(('MutatingWebhookConfiguration', 'amdgpu-virt'),
                         kinds)
        self.assertNotIn(('ServiceAccount', 'amdgpu-virt-scheduler'), kinds)

    def test_replicas(self) -> None:
        docs = chart.variant('ha')
        self.assertEqual(3, chart.find(docs, 'Deployment',
                                       'amdgpu-virt-scheduler')['spec'][
                                           'replicas'])
        data = chart.find(docs, 'ConfigMap', 'amdgpu-virt-scheduler-config')
        election = yaml.safe_load(data['data']['config.yaml'])[
            'leaderElection']
        self.assertEqual(
            {'leaderElect': True, 'resourceLock': 'leases',
             'resourceName': 'amdgpu-virt-scheduler',
             'resourceNamespace': 'amdgpu-virt'}, election)

    def test_scheduler_configurations_are_kube_scheduler_v1(self) -> None:
        # kube-scheduler decodes its file strictly: every field must be
        # one of KubeSchedulerConfiguration v1's
        # (k8s.io/kube-scheduler/config/v1, types.go)
        for name in chart.VARIANTS:
            docs = chart.variant(name)
            try:
                data = chart.find(docs, 'ConfigMap',
                                  'amdgpu-virt-scheduler-config')
            except AssertionError:
                continue   # no scheduler in this variant
            config = yaml.safe_load(data['data']['config.yaml'])
            _known(self, config, KUBE_SCHEDULER_V1, name)
            self.assertEqual('kubescheduler.config.k8s.io/v1',
                             config['apiVersion'])
            for profile in config['profiles']:
                self.assertTrue(0 <= profile['percentageOfNodesToScore']
                                <= 100)
            binders = [e for e in config['extenders'] if e.get('bindVerb')]
            self.assertEqual(1, len(binders), name)

    def test_pods_without_gpus_are_scored_when_asked(self) -> None:
        config = yaml.safe_load(chart.find(
            chart.variant('default'), 'ConfigMap',
            'amdgpu-virt-scheduler-config')['data']['config.yaml'])
        self.assertEqual(1, len(config['extenders']))
        self.assertEqual(100, config['profiles'][0][
            'percentageOfNodesToScore'])
        docs = chart.variant('gpuless-pods')
        config = yaml.safe_load(chart.find(
            docs, 'ConfigMap', 'amdgpu-virt-scheduler-config')['data'][
                'config.yaml'])
        managed, scoring = config['extenders']
        self.assertEqual(managed['urlPrefix'], scoring['urlPrefix'])
        # asked for every pod (no managedResources), scores only, and
        # scheduling goes on without it
        self.assertEqual({'urlPrefix', 'prioritizeVerb', 'weight',
                          'enableHTTPS', 'nodeCacheCapable', 'httpTimeout',
                          'ignorable'}, set(scoring))
        self.assertEqual(('prioritize', 3, True),
                         (scoring['prioritizeVerb'], scoring['weight'],
                          scoring['ignorable']))
        self.assertEqual(0, config['profiles'][0][
            'percentageOfNodesToScore'])
        conf = chart.find(docs, 'ConfigMap', 'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf']
        self.assertIn('gpuless_namespaces = batch,services', conf)

    def test_release_namespace_everywhere(self) -> None:
        docs = chart.variant('other-namespace')
        for doc in docs:
            ns = doc['metadata'].get('namespace')
            self.assertIn(ns, (None, 'gpu-system', 'kube-system'),
                          doc['metadata']['name'])
            for subject in doc.get('subjects', []):
                self.assertEqual('gpu-system', subject['namespace'])
        text = json.dumps(docs)
        self.assertNotIn('system:serviceaccount:amdgpu-virt:', text)
        self.assertIn('system:serviceaccount:gpu-system:amdgpu-virt-node',
                      text)


#: makes ``import helm_python`` fail, as in an environment made by
#: ``pip install .`` alone (sitecustomize runs before the script)
_NO_ENGINE = '''
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'helm_python':
            raise ModuleNotFoundError("No module named 'helm_python'",
                                      name='helm_python')
sys.meta_path.insert(0, _Block())
'''


class QuickStartTest(testtools.TestCase):

    def test_without_the_helm_engine_the_script_says_what_it_needs(self):
        site = self.useFixture(fixtures.TempDir()).path
        with open(os.path.join(site, 'sitecustomize.py'), 'w') as handle:
            handle.write(_NO_ENGINE)
        out = self.useFixture(fixtures.TempDir()).path
        for argv in ([], ['--check']):
            done = subprocess.run(
                [sys.executable, os.path.join(chart.ROOT, 'deploy',
                                              'render_manifests.py'),
                 '--output', out, *argv],
                capture_output=True, text=True, timeout=120,
                env=dict(os.environ, PYTHONPATH=site))
            self.assertEqual(69, done.returncode, done.stderr)
            self.assertNotIn('Traceback', done.stderr)
            self.assertIn('pip install -r test-requirements.txt',
                          done.stderr)
            self.assertIn('helm-python-sdk', done.stderr)
            self.assertEqual([], os.listdir(out))
