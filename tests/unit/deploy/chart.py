"""Render the Helm chart with the real Helm engine, for the deploy tests.

The chart is rendered by ``helm_python`` (Helm's Go SDK behind a C ABI),
exactly as ``helm install`` would, offline (``lookup`` finds nothing).
Renderings are cached per values, since every test module reads them.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
from typing import Any

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..',
                                    '..'))
CHART = os.path.join(ROOT, 'deploy', 'helm', 'amdgpu-virt')
DEPLOY = os.path.join(ROOT, 'deploy', 'kubernetes')
NAMESPACE = 'amdgpu-virt'

#: The variants the documentation describes, each with the values that
#: select it (rendered and validated like the defaults).
VARIANTS: dict[str, dict[str, Any]] = {
    'default': {},
    'helm-tls': {'webhook': {'tls': {'mode': 'helm'}}},
    'cert-manager-cluster-issuer': {'webhook': {'tls': {'certManager': {
        'issuerRef': {'kind': 'ClusterIssuer', 'name': 'corp-ca'}}}}},
    'service-monitor': {
        'serviceMonitor': {'enabled': True, 'labels': {'release': 'prom'}},
        'networkPolicy': {'metricsFrom': [{'namespaceSelector': {
            'matchLabels': {
                'kubernetes.io/metadata.name': 'monitoring'}}}]}},
    'ha': {'scheduler': {'replicas': 3}, 'webhook': {'replicas': 3}},
    'whole-gpus': {'node': {'allocationMode': 'whole'}, 'shareCount': 1},
    'webhook-ignore': {'webhook': {
        'failurePolicy': 'Ignore', 'timeoutSeconds': 5,
        'exemptNamespaces': ['kube-system', 'monitoring'],
        'namespaceSelector': [{'key': 'example.org/gpu-tenants',
                               'operator': 'Exists'}]}},
    'node-only': {'scheduler': {'enabled': False},
                  'webhook': {'enabled': False},
                  'node': {'allocationMode': 'whole'}},
    'policies-warn': {'admissionPolicies': {
        'validationActions': ['Warn', 'Audit'],
        'extraAllocationWriters': [
            'system:serviceaccount:kube-system:hami-scheduler']}},
    'no-policies': {'admissionPolicies': {'enabled': False},
                    'networkPolicy': {'enabled': False}},
    'other-namespace': {},
    'dra': {'dra': {'enabled': True}, 'webhook': {'draClaims': True}},
    'hook-digest': {'node': {'memoryHook': {'install': {'image': {
        'tag': '', 'digest': 'sha256:' + '0123456789abcdef' * 4}}}}},
    'hook-image-volume': {'node': {'memoryHook': {'install': {
        'method': 'imageVolume', 'required': True}}},
        'dra': {'enabled': True}},
    'hook-off': {'node': {'memoryHook': {'install': {'enabled': False}}}},
    'ledger-configmap': {'ledger': {'source': 'configmap'},
                         'dra': {'enabled': True}},
    'ledger-file': {'ledger': {'source': 'file', 'configMap': {
        'namespace': 'amdgpu-virt', 'name': 'gpu-roles'}},
        'dra': {'enabled': True}},
    'monitoring': {
        'node': {'metrics': {'podMonitor': {
            'enabled': True, 'labels': {'release': 'prom'}}},
            'health': {'maxUncorrectable': 2, 'maxCorrectablePerHour': 100,
                       'exporterUrl': 'http://amd-metrics-exporter.'
                                      'kube-amd-gpu:5000/metrics'}},
        'grafana': {'dashboards': {'enabled': True,
                                   'namespace': 'monitoring'}},
        'networkPolicy': {'metricsFrom': [{'namespaceSelector': {
            'matchLabels': {
                'kubernetes.io/metadata.name': 'monitoring'}}}]}},
    'gpuless-pods': {'scheduler': {
        'percentageOfNodesToScore': 0,
        'extender': {'gpulessNamespaces': ['batch', 'services'],
                     'gpulessWeight': 3}}},
}
#: the namespace a variant is installed in (default: NAMESPACE)
VARIANT_NAMESPACES = {'other-namespace': 'gpu-system'}


def _renderer() -> Any:
    spec = importlib.util.spec_from_file_location(
        'render_manifests', os.path.join(ROOT, 'deploy',
                                         'render_manifests.py'))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


renderer = _renderer()


@functools.lru_cache(maxsize=64)
def _render(values_json: str, namespace: str) -> dict[str, str]:
    return renderer.render(json.loads(values_json) or None, namespace)


def render(values: dict[str, Any] | None = None,
           namespace: str = NAMESPACE) -> dict[str, str]:
    """Template file name -> rendered text."""
    return dict(_render(json.dumps(values or {}, sort_keys=True),
                        namespace))


def documents(values: dict[str, Any] | None = None,
              namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every rendered object (deep copies: tests may change them)."""
    found = []
    for text in render(values, namespace).values():
        found.extend(d for d in yaml.safe_load_all(text) if d)
    return copy.deepcopy(found)


def variant(name: str) -> list[dict[str, Any]]:
    return documents(VARIANTS[name],
                     VARIANT_NAMESPACES.get(name, NAMESPACE))


def schema_error(values: dict[str, Any]) -> str:
    """The Helm engine's refusal of ``values`` (which must be refused)."""
    import helm_python

    with helm_python.Chart.load(CHART) as loaded:
        try:
            loaded.render(values, name='amdgpu-virt', namespace=NAMESPACE)
        except helm_python.HelmValuesError as err:
            return str(err)
    raise AssertionError('values %r were accepted' % (values,))


def find(docs: list[dict[str, Any]], kind: str,
         name: str) -> dict[str, Any]:
    for doc in docs:
        if doc['kind'] == kind and doc['metadata']['name'] == name:
            return doc
    raise AssertionError('no %s %s rendered' % (kind, name))
