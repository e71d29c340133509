"""deploy/kubernetes validated offline against Kubernetes' schemas."""

from __future__ import annotations

import configparser
import glob
import importlib.metadata
import os
import urllib.parse
from typing import Any

import kubernetes_validate
import testtools
import yaml

from amdgpu_virt import conf as conf_pkg

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..')
DEPLOY = os.path.join(ROOT, 'deploy', 'kubernetes')
#: a release kubernetes-validate ships strict schemas for
KUBERNETES_VERSION = '1.34.0'


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, '*.yaml'))):
        with open(path) as stream:
            for doc in yaml.safe_load_all(stream):
                if doc:
                    found.append((os.path.basename(path), doc))
    return found


def _find(kind: str, name: str) -> dict[str, Any]:
    for _path, doc in _documents():
        if doc['kind'] == kind and doc['metadata']['name'] == name:
            return doc
    raise AssertionError('no %s %s in %s' % (kind, name, DEPLOY))


class ManifestTest(testtools.TestCase):

    def test_every_document_is_valid(self) -> None:
        docs = _documents()
        self.assertGreater(len(docs), 10)
        for path, doc in docs:
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION,
                                             strict=True)
            except kubernetes_validate.ValidationError as err:
                self.fail('%s: %s %s: %s' % (path, doc['kind'],
                                             doc['metadata']['name'], err))

    def test_validator_catches_mistakes(self) -> None:
        doc = _find('DaemonSet', 'amdgpu-virt-node')
        doc['spec']['template']['spec']['priorityClasName'] = 'typo'
        self.assertRaises(kubernetes_validate.ValidationError,
                          kubernetes_validate.validate, doc,
                          KUBERNETES_VERSION, True)

    def test_daemonset(self) -> None:
        pod = _find('DaemonSet', 'amdgpu-virt-node')['spec']['template'][
            'spec']
        self.assertEqual('system-node-critical', pod['priorityClassName'])
        paths = {v['hostPath']['path'] for v in pod['volumes']
                 if 'hostPath' in v}
        self.assertIn('/var/lib/kubelet/device-plugins', paths)
        for container in pod['containers']:
            env = {e['name']: e for e in container['env']}
            self.assertEqual('spec.nodeName', env['NODE_NAME']['valueFrom'][
                'fieldRef']['fieldPath'], container['name'])
            self.assertFalse(container['securityContext'].get('privileged'))
            # [inventory] sysfs_root and [kubernetes] device_root point here
            mounts = {m['mountPath'] for m in container['volumeMounts']}
            self.assertTrue({'/host/sys', '/host/dev',
                             '/etc/amdgpu_virt'} <= mounts,
                            container['name'])

    def test_scheduler_configuration(self) -> None:
        data = _find('ConfigMap', 'amdgpu-virt-scheduler-config')['data']
        config = yaml.safe_load(data['config.yaml'])
        self.assertEqual('kubescheduler.config.k8s.io/v1',
                         config['apiVersion'])
        (extender,) = config['extenders']
        self.assertEqual(
            ('filter', 'prioritize', 'bind', True, '30s'),
            (extender['filterVerb'], extender['prioritizeVerb'],
             extender['bindVerb'], extender['nodeCacheCapable'],
             extender['httpTimeout']))
        self.assertEqual(
            {'amd.com/gpu', 'amd.com/gpumem', 'amd.com/gpucores'},
            {r['name'] for r in extender['managedResources']
             if r['ignoredByScheduler']})
        self.assertEqual(['amdgpu-virt-scheduler'],
                         [p['schedulerName'] for p in config['profiles']])

    def test_rbac_is_least_privilege(self) -> None:
        for _path, doc in _documents():
            for rule in doc.get('rules', []):
                for field in ('apiGroups', 'resources', 'verbs'):
                    self.assertNotIn('*', rule[field], doc['metadata'])
                self.assertNotIn('delete', rule['verbs'])
                self.assertNotIn('secrets', rule['resources'])
        rules = _find('ClusterRole', 'amdgpu-virt-scheduler')['rules']
        binding = [r for r in rules if 'pods/binding' in r['resources']]
        self.assertEqual([['create']], [r['verbs'] for r in binding])

    def test_node_side_reads_only_the_ledger_configmap(self) -> None:
        conf = conf_pkg.new_conf()
        role = _find('Role', 'amdgpu-virt-ledger-reader')
        self.assertEqual(conf.pool.configmap_namespace,
                         role['metadata']['namespace'])
        self.assertEqual([{'apiGroups': [''], 'resources': ['configmaps'],
                           'resourceNames': [conf.pool.configmap_name],
                           'verbs': ['get']}], role['rules'])
        binding = _find('RoleBinding', 'amdgpu-virt-ledger-reader')
        self.assertEqual(['amdgpu-virt-node'],
                         [s['name'] for s in binding['subjects']])

    def test_webhook_points_at_the_service(self) -> None:
        hook = _find('MutatingWebhookConfiguration', 'amdgpu-virt')[
            'webhooks'][0]
        service = hook['clientConfig']['service']
        self.assertEqual('/webhook', service['path'])
        svc = _find('Service', service['name'])
        self.assertEqual(service['namespace'], svc['metadata']['namespace'])
        # no object selector: nothing a pod carries exempts it
        self.assertNotIn('objectSelector', hook)
        self.assertEqual(['CREATE', 'UPDATE'], hook['rules'][0]['operations'])
        self.assertEqual('NoneOnDryRun', hook['sideEffects'])

    def test_config_file_only_sets_known_options(self) -> None:
        data = _find('ConfigMap', 'amdgpu-virt-config')['data']
        parser = configparser.ConfigParser()
        parser.read_string(data['amdgpu-virt.conf'])
        conf = conf_pkg.new_conf()
        for section in parser.sections():
            group = getattr(conf, section)
            for key, value in parser.items(section):
                self.assertIn(key, group, '[%s] %s' % (section, key))
                conf.set_override(key, value, group=section)
                getattr(group, key)  # type and regex checks

    def test_extender_container_matches_the_configuration(self) -> None:
        data = _find('ConfigMap', 'amdgpu-virt-scheduler-config')['data']
        (extender,) = yaml.safe_load(data['config.yaml'])['extenders']
        url = urllib.parse.urlsplit(extender['urlPrefix'])
        self.assertEqual(('http', '127.0.0.1'), (url.scheme, url.hostname))
        pod = _find('Deployment', 'amdgpu-virt-scheduler')['spec'][
            'template']['spec']
        containers = {c['name']: c for c in pod['containers']}
        ext = containers['extender']
        self.assertEqual(['k8s', 'scheduler'], ext['command'][-2:])
        self.assertEqual([url.port], [p['containerPort']
                                      for p in ext['ports']])
        for probe in ('readinessProbe', 'livenessProbe'):
            self.assertEqual(url.port, ext[probe]['httpGet']['port'])
        self.assertEqual('/readyz', ext['readinessProbe']['httpGet']['path'])
        conf = conf_pkg.new_conf()
        parser = configparser.ConfigParser()
        parser.read_string(_find('ConfigMap', 'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf'])
        self.assertEqual(str(url.port), parser['scheduler']['port'])
        self.assertEqual(conf.scheduler.port, url.port)
        # every amdgpu-virt command of the manifests is a known command
        commands = {e.name for e in importlib.metadata.entry_points(
            group='amdgpu_virt.cli')}
        for _path, doc in _documents():
            template = (doc.get('spec') or {}).get('template') or {}
            for container in (template.get('spec') or {}).get(
                    'containers', []):
                command = container.get('command') or []
                if command[:1] == ['amdgpu-virt']:
                    words = command[3:]
                    self.assertIn('_'.join(words), commands,
                                  container['name'])
