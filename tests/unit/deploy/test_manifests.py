"""What the chart's objects promise the code, checked on the default
rendering (which deploy/kubernetes/ is)."""

from __future__ import annotations

import configparser
import importlib.metadata
import urllib.parse
from typing import Any

import testtools
import yaml

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.sharing import hami
from tests.unit.deploy import chart


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [('chart', d) for d in chart.documents()]


def _find(kind: str, name: str) -> dict[str, Any]:
    return chart.find(chart.documents(), kind, name)


class ManifestTest(testtools.TestCase):

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
        # granted only with ledger.source=configmap (test_chart_node)
        role = chart.find(chart.variant('ledger-configmap'), 'Role',
                          'amdgpu-virt-ledger-reader')
        self.assertEqual(conf.pool.configmap_namespace,
                         role['metadata']['namespace'])
        self.assertEqual([{'apiGroups': [''], 'resources': ['configmaps'],
                           'resourceNames': [conf.pool.configmap_name],
                           'verbs': ['get']}], role['rules'])
        binding = chart.find(chart.variant('ledger-configmap'),
                             'RoleBinding', 'amdgpu-virt-ledger-reader')
        self.assertEqual(['amdgpu-virt-node'],
                         [s['name'] for s in binding['subjects']])

    def test_webhook_points_at_the_service(self) -> None:
        hook = _find('MutatingWebhookConfiguration', 'amdgpu-virt')[
            'webhooks'][0]
        service = hook['clientConfig']['service']
        self.assertEqual('/webhook', service['path'])
        svc = _find('Service', service['name'])
        self.assertEqual(service['namespace'], svc['metadata']['namespace'])
        # exemptions by namespace only: no label a pod owner sets can
        # keep a pod from the webhook
        self.assertNotIn('objectSelector', hook)
        self.assertEqual(['CREATE', 'UPDATE'],
                         hook['rules'][0]['operations'])
        exempt = hook['namespaceSelector']['matchExpressions'][0]
        self.assertEqual(('kubernetes.io/metadata.name', 'NotIn'),
                         (exempt['key'], exempt['operator']))
        self.assertIn('amdgpu-virt', exempt['values'])
        for doc in chart.documents():
            template = (doc.get('spec') or {}).get('template') or {}
            labels = (template.get('metadata') or {}).get('labels') or {}
            self.assertNotIn(hami.WEBHOOK_LABEL, labels)

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
        ports = {p['name']: p['containerPort'] for p in ext['ports']}
        self.assertEqual(url.port, ports['extender'])
        # the extender stays on 127.0.0.1, out of kubelet's reach: kubelet
        # probes the second (probes and metrics only) listener
        for probe, path in (('readinessProbe', '/readyz'),
                            ('livenessProbe', '/healthz')):
            self.assertEqual({'path': path, 'port': 'metrics'},
                             ext[probe]['httpGet'])
        conf = conf_pkg.new_conf()
        parser = configparser.ConfigParser()
        parser.read_string(_find('ConfigMap', 'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf'])
        self.assertEqual(str(url.port), parser['scheduler']['port'])
        self.assertEqual(url.hostname, parser['scheduler']['host'])
        self.assertEqual(str(ports['metrics']),
                         parser['scheduler']['metrics_port'])
        self.assertNotEqual(ports['metrics'], url.port)
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
                    self.assertEqual(['--config-file',
                                      '/etc/amdgpu_virt/amdgpu-virt.conf'],
                                     command[1:3])
                    words = command[3:]
                    self.assertIn('_'.join(words), commands,
                                  container['name'])

    def test_memory_hook_is_mounted_where_the_config_says(self) -> None:
        parser = configparser.ConfigParser()
        parser.read_string(_find('ConfigMap', 'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf'])
        library = parser['kubernetes']['vgpu_library']
        self.assertEqual(conf_pkg.new_conf().kubernetes.vgpu_library,
                         library)
        pod = _find('DaemonSet', 'amdgpu-virt-node')['spec']['template'][
            'spec']
        volumes = {v['name']: v for v in pod['volumes']}
        for container in pod['containers']:
            mounts = {m['name']: m for m in container['volumeMounts']}
            hook = mounts['memory-hook']
            self.assertTrue(hook['readOnly'])
            self.assertTrue(library.startswith(hook['mountPath'] + '/'))
            self.assertEqual(hook['mountPath'], volumes['memory-hook'][
                'hostPath']['path'])

    def test_host_cgroups_are_mounted_where_the_config_says(self) -> None:
        parser = configparser.ConfigParser()
        parser.read_string(_find('ConfigMap', 'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf'])
        root = parser['kubernetes']['cgroup_root']
        self.assertEqual('kernel-or-hook',
                         parser['kubernetes']['memory_enforcement'])
        pod = _find('DaemonSet', 'amdgpu-virt-node')['spec']['template'][
            'spec']
        self.assertEqual({'path': '/sys/fs/cgroup', 'type': 'Directory'},
                         {v['name']: v for v in pod['volumes']}['cgroup'][
                             'hostPath'])
        writable = {}
        for container in pod['containers']:
            (mount,) = [m for m in container['volumeMounts']
                        if m['name'] == 'cgroup']
            self.assertEqual(root, mount['mountPath'])
            writable[container['name']] = not mount.get('readOnly')
        # only the device plugin writes caps
        self.assertEqual({'device-plugin': True, 'agent': False}, writable)

    def test_containers_run_read_only_without_capabilities(self) -> None:
        for doc in chart.documents():
            template = (doc.get('spec') or {}).get('template') or {}
            spec = template.get('spec') or {}
            for container in spec.get('initContainers', []) + spec.get(
                    'containers', []):
                security = container['securityContext']
                self.assertTrue(security['readOnlyRootFilesystem'])
                self.assertFalse(security['allowPrivilegeEscalation'])
                self.assertEqual(['ALL'], security['capabilities']['drop'])
                self.assertNotIn('add', security['capabilities'])
                self.assertFalse(security.get('privileged'))
                # root without capabilities: these write directories of
                # the host that belong to root
                if container['name'] not in ('device-plugin',
                                             'memory-hook-install'):
                    self.assertTrue(security['runAsNonRoot'],
                                    container['name'])

    def test_rbac_uses_patch_not_update_on_pods_and_nodes(self) -> None:
        for doc in chart.documents():
            if doc['kind'] not in ('ClusterRole', 'Role'):
                continue
            for rule in doc['rules']:
                if {'pods', 'nodes'} & set(rule['resources']):
                    self.assertNotIn('update', rule['verbs'],
                                     doc['metadata']['name'])
        node = _find('ClusterRole', 'amdgpu-virt-node')['rules']
        self.assertEqual(
            {('nodes', ('get', 'patch')), ('nodes/status', ('patch',)),
             ('pods', ('list', 'patch')), ('events', ('create',))},
            {(r['resources'][0], tuple(r['verbs'])) for r in node})

    def test_leader_election_lease(self) -> None:
        data = _find('ConfigMap', 'amdgpu-virt-scheduler-config')['data']
        election = yaml.safe_load(data['config.yaml'])['leaderElection']
        role = _find('Role', 'amdgpu-virt-leader-election')
        self.assertEqual(election['resourceNamespace'],
                         role['metadata']['namespace'])
        named = [r for r in role['rules'] if r.get('resourceNames')]
        self.assertEqual([[election['resourceName']]],
                         [r['resourceNames'] for r in named])
        self.assertTrue({'get', 'watch', 'update'} <= set(named[0]['verbs']))

    def test_network_policies_admit_only_the_webhook_port(self) -> None:
        policy = _find('NetworkPolicy', 'amdgpu-virt-webhook')
        (rule,) = policy['spec']['ingress']
        self.assertEqual([{'protocol': 'TCP', 'port': 8443}], rule['ports'])
        for name in ('amdgpu-virt-scheduler', 'amdgpu-virt-node'):
            self.assertEqual([], _find('NetworkPolicy', name)['spec'][
                'ingress'])
        docs = chart.variant('service-monitor')
        (rule,) = chart.find(docs, 'NetworkPolicy', 'amdgpu-virt-scheduler')[
            'spec']['ingress']
        # the metrics listener, never the extender's filter/bind port
        self.assertEqual([{'protocol': 'TCP', 'port': 8889}], rule['ports'])
        self.assertTrue(rule['from'])
        # the node pods: the agent's metrics port only
        (rule,) = chart.find(docs, 'NetworkPolicy', 'amdgpu-virt-node')[
            'spec']['ingress']
        self.assertEqual([{'protocol': 'TCP', 'port': 9394}], rule['ports'])
        self.assertTrue(rule['from'])
