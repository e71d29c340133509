"""The node pods' part of the chart: the memory-limit hook's init
containers (node.memoryHook.install) and the role ledger (ledger.*).

Every variant used here is in :data:`chart.VARIANTS`, so its objects are
also strictly validated for every Kubernetes release (test_chart).
"""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import shutil
import subprocess
from typing import Any

import fixtures
import helm_python
import testtools

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.k8s.node import roles as noderoles
from amdgpu_virt.k8s.record import ledgermap
from tests.unit.deploy import chart
from tests.unit.k8s.node import test_hookinstall

HAMI_IMAGE = 'ghcr.io/project-hami/amd-device-plugin'
DIGEST = 'sha256:' + '0123456789abcdef' * 4
#: the DaemonSets whose pods use the library and the ledger
NODE_PODS = ('amdgpu-virt-node', 'amdgpu-virt-dra-plugin')


def pod(docs: list[dict[str, Any]], name: str = 'amdgpu-virt-node'
        ) -> dict[str, Any]:
    spec: dict[str, Any] = chart.find(docs, 'DaemonSet', name)['spec'][
        'template']['spec']
    return spec


def config(docs: list[dict[str, Any]]) -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read_string(chart.find(docs, 'ConfigMap', 'amdgpu-virt-config')[
        'data']['amdgpu-virt.conf'])
    return parser


def oslo_conf(docs: list[dict[str, Any]]) -> Any:
    """The rendered configuration as the pods' oslo.config reads it."""
    conf = conf_pkg.new_conf()
    parser = config(docs)
    for section in parser.sections():
        for key, value in parser.items(section):
            conf.set_override(key, value, group=section)
    return conf


def init(spec: dict[str, Any], name: str) -> dict[str, Any]:
    for container in spec.get('initContainers', []):
        if container['name'] == name:
            return container
    raise AssertionError('no init container %s' % name)


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


class HookInitContainersTest(testtools.TestCase):

    def test_default_copies_from_hamis_image_then_installs(self) -> None:
        docs = chart.documents()
        spec = pod(docs)
        self.assertEqual(['memory-hook-fetch', 'memory-hook-install'],
                         [c['name'] for c in spec['initContainers']])
        fetch = init(spec, 'memory-hook-fetch')
        install = init(spec, 'memory-hook-install')
        self.assertEqual('%s:0.0.1' % HAMI_IMAGE, fetch['image'])
        # sh -c SCRIPT $0 $1=source $2=staged $3=image $4=optional
        script, _zero, source, staged, image, need = fetch['command'][2:]
        self.assertEqual(['sh', '-c'], fetch['command'][:2])
        self.assertEqual('/opt/hami/lib/amd/libamvgpu.so', source)
        self.assertEqual(fetch['image'], image)
        self.assertEqual('optional', need)
        self.assertNotIn(source, script)  # values are arguments only
        # the install container reads what the fetch container wrote
        command = install['command']
        self.assertEqual(['amdgpu-virt', 'k8s', 'install-hook'],
                         command[:3])
        self.assertEqual(staged, option(command, '--from'))
        self.assertIn('--best-effort', command)
        self.assertEqual('/dev/termination-log',
                         option(command, '--message-file'))
        mounts = {m['name']: m for m in install['volumeMounts']}
        self.assertTrue(staged.startswith(
            mounts['memory-hook-staging']['mountPath'] + '/'))
        self.assertTrue(mounts['memory-hook-staging']['readOnly'])
        self.assertEqual(
            {'name': 'memory-hook-staging', 'mountPath': os.path.dirname(
                staged)}, fetch['volumeMounts'][0])
        self.assertEqual(os.path.dirname(staged), fetch['workingDir'])
        # a known command, from the project's one image
        self.assertIn('k8s_install-hook', {
            e.name for e in importlib.metadata.entry_points(
                group='amdgpu_virt.cli')})
        self.assertEqual(spec['containers'][0]['image'], install['image'])

    def test_installs_where_the_pods_read_it(self) -> None:
        for name in chart.VARIANTS:
            docs = chart.variant(name)
            library = config(docs)['kubernetes']['vgpu_library']
            for ds in NODE_PODS:
                if ds == 'amdgpu-virt-dra-plugin' and not chart.VARIANTS[
                        name].get('dra', {}).get('enabled'):
                    continue
                spec = pod(docs, ds)
                volumes = {v['name']: v for v in spec['volumes']}
                if name == 'hook-off':
                    self.assertNotIn('initContainers', spec)
                    continue
                install = init(spec, 'memory-hook-install')
                self.assertEqual(library, option(install['command'],
                                                 '--to'), (name, ds))
                (hook,) = [m for m in install['volumeMounts']
                           if m['name'] == 'memory-hook']
                # the one writable mount of the host's library directory
                self.assertNotIn('readOnly', hook)
                self.assertEqual(os.path.dirname(library),
                                 hook['mountPath'])
                self.assertEqual(
                    {'path': os.path.dirname(library),
                     'type': 'DirectoryOrCreate'},
                    volumes['memory-hook']['hostPath'])
                for container in spec['containers']:
                    for mount in container['volumeMounts']:
                        if mount['name'] == 'memory-hook':
                            self.assertTrue(mount['readOnly'])

    def test_init_containers_hold_no_privilege(self) -> None:
        for name in ('default', 'hook-image-volume'):
            spec = pod(chart.variant(name))
            for container in spec['initContainers']:
                security = container['securityContext']
                self.assertTrue(security['readOnlyRootFilesystem'])
                self.assertFalse(security['allowPrivilegeEscalation'])
                self.assertEqual({'drop': ['ALL']},
                                 security['capabilities'])
                self.assertNotIn('privileged', security)
                if container['name'] == 'memory-hook-fetch':
                    # the foreign image runs as nobody of ours
                    self.assertTrue(security['runAsNonRoot'])
                    self.assertEqual(65532, security['runAsUser'])
                self.assertEqual({'cpu': '10m', 'memory': '32Mi'},
                                 container['resources']['requests'])

    def test_pinned_by_digest(self) -> None:
        fetch = init(pod(chart.variant('hook-digest')), 'memory-hook-fetch')
        self.assertEqual('%s@%s' % (HAMI_IMAGE, DIGEST), fetch['image'])
        both = chart.documents({'node': {'memoryHook': {'install': {
            'image': {'digest': DIGEST}}}}})
        self.assertEqual('%s:0.0.1@%s' % (HAMI_IMAGE, DIGEST),
                         init(pod(both), 'memory-hook-fetch')['image'])

    def test_image_volume_needs_no_shell_in_the_image(self) -> None:
        docs = chart.variant('hook-image-volume')
        for ds in NODE_PODS:
            spec = pod(docs, ds)
            self.assertEqual(['memory-hook-install'],
                             [c['name'] for c in spec['initContainers']])
            install = spec['initContainers'][0]
            volumes = {v['name']: v for v in spec['volumes']}
            self.assertEqual({'reference': '%s:0.0.1' % HAMI_IMAGE,
                              'pullPolicy': 'IfNotPresent'},
                             volumes['memory-hook-image']['image'])
            mounts = {m['name']: m for m in install['volumeMounts']}
            self.assertEqual(
                mounts['memory-hook-image']['mountPath'] +
                '/opt/hami/lib/amd/libamvgpu.so',
                option(install['command'], '--from'))
            # required: a failure keeps the pods from starting
            self.assertNotIn('--best-effort', install['command'])

    def test_schema_refuses_bad_install_values(self) -> None:
        cases = [
            ({'digest': 'sha256:abc'}, '/digest'),
            ({'digest': 'md5:' + '0' * 32}, '/digest'),
            ({'tag': 'v 1'}, '/tag'),
            ({'tag': '', 'digest': ''}, '/image'),
            ({'repository': 'Upper/Case'}, '/repository'),
            ({'pullPolicy': 'Sometimes'}, '/pullPolicy'),
        ]
        for image, field in cases:
            self.assertIn('/node/memoryHook/install/image' + field.replace(
                '/image', ''), chart.schema_error({'node': {'memoryHook': {
                    'install': {'image': image}}}}), image)
        for install, field in [
                ({'sourcePath': 'lib/libamvgpu.so'}, 'sourcePath'),
                ({'sourcePath': '/opt/../etc/shadow'}, 'sourcePath'),
                ({'sourcePath': '/opt/lib amvgpu.so'}, 'sourcePath'),
                ({'method': 'oci'}, 'method'),
                ({'required': 'yes'}, 'required'),
                ({'resources': {'limits': {'memory': 'lots'}}},
                 'resources')]:
            self.assertIn('/node/memoryHook/install/' + field,
                          chart.schema_error({'node': {'memoryHook': {
                              'install': install}}}), install)


class FetchScriptTest(testtools.TestCase):
    """The fetch container's rendered command, run by this machine's sh
    and cp (standing in for the library image's own: no container engine
    runs here), with its paths moved into a temporary directory."""

    def setUp(self) -> None:
        super().setUp()
        if shutil.which('sh') is None or shutil.which('cp') is None:
            self.skipTest('no sh or cp here')
        self.tmp = self.useFixture(fixtures.TempDir()).path

    def run_fetch(self, values: dict[str, Any], present: bool
                  ) -> subprocess.CompletedProcess[str]:
        fetch = init(pod(chart.documents(values)), 'memory-hook-fetch')
        command = list(fetch['command'])
        image_root = os.path.join(self.tmp, 'image')
        staging = os.path.join(self.tmp, 'staging')
        os.makedirs(staging, exist_ok=True)
        source = image_root + command[4]
        if present:
            os.makedirs(os.path.dirname(source), exist_ok=True)
            with open(source, 'wb') as stream:
                stream.write(test_hookinstall.library())
        command[4] = source
        command[5] = os.path.join(staging, os.path.basename(command[5]))
        self.staged = command[5]
        return subprocess.run(command, capture_output=True, text=True,
                              cwd=staging, timeout=60,
                              stdin=subprocess.DEVNULL)

    def test_copies_the_library_out(self) -> None:
        done = self.run_fetch({}, present=True)
        self.assertEqual(0, done.returncode, done.stderr)
        with open(self.staged, 'rb') as stream:
            self.assertEqual(test_hookinstall.library(), stream.read())

    def test_a_missing_library_is_reported(self) -> None:
        done = self.run_fetch({}, present=False)
        self.assertEqual(0, done.returncode)  # the install step says why
        self.assertIn('cannot copy /', done.stderr)
        self.assertIn('out of the image %s:0.0.1' % HAMI_IMAGE, done.stderr)
        self.assertFalse(os.path.exists(self.staged))
        done = self.run_fetch({'node': {'memoryHook': {'install': {
            'required': True}}}}, present=False)
        self.assertEqual(1, done.returncode)

    def test_values_cannot_reach_the_script(self) -> None:
        # the schema keeps shell words out of sourcePath...
        self.assertIn('/node/memoryHook/install/sourcePath',
                      chart.schema_error({'node': {'memoryHook': {
                          'install': {'sourcePath': '/x;reboot'}}}}))
        # ...and the script takes it as an argument anyway
        fetch = init(pod(chart.documents()), 'memory-hook-fetch')
        command = list(fetch['command'])
        witness = os.path.join(self.tmp, 'pwned')
        command[4] = '/nonexistent"; touch %s; echo "' % witness
        command[5] = os.path.join(self.tmp, 'staged.so')
        done = subprocess.run(command, capture_output=True, text=True,
                              cwd=self.tmp, timeout=60,
                              stdin=subprocess.DEVNULL)
        self.assertEqual(0, done.returncode)
        self.assertIn('cannot copy /nonexistent"; touch', done.stderr)
        self.assertFalse(os.path.exists(witness))


class LedgerValuesTest(testtools.TestCase):

    def test_default_offers_every_gpu_and_reads_no_ledger(self) -> None:
        docs = chart.documents()
        self.assertEqual('none', config(docs)['kubernetes']['ledger_source'])
        self.assertIsNone(noderoles.from_conf(oslo_conf(docs), 'n1'))
        self.assertEqual([], [d for d in docs if d['kind'] in (
            'Role', 'RoleBinding') and d['metadata']['name'] ==
            'amdgpu-virt-ledger-reader'])
        self.assertNotIn('ledger', {v['name'] for v in pod(docs)[
            'volumes']})

    def test_configmap_source_reads_that_one_object(self) -> None:
        docs = chart.documents({'ledger': {'source': 'configmap',
                                           'configMap': {
                                               'namespace': 'gpu-pool',
                                               'name': 'roles'}}})
        conf = oslo_conf(docs)
        roles = noderoles.from_conf(conf, 'n1', core_api=object())
        assert roles is not None
        self.assertIsInstance(roles.source, noderoles.ConfigMapSource)
        self.assertEqual(ledgermap.Location('gpu-pool', 'roles'),
                         roles.source.where)  # type: ignore[attr-defined]
        role = chart.find(docs, 'Role', 'amdgpu-virt-ledger-reader')
        self.assertEqual('gpu-pool', role['metadata']['namespace'])
        self.assertEqual([{'apiGroups': [''], 'resources': ['configmaps'],
                           'resourceNames': ['roles'], 'verbs': ['get']}],
                         role['rules'])
        binding = chart.find(docs, 'RoleBinding',
                             'amdgpu-virt-ledger-reader')
        self.assertEqual('gpu-pool', binding['metadata']['namespace'])
        self.assertEqual([{'kind': 'ServiceAccount',
                           'name': 'amdgpu-virt-node',
                           'namespace': chart.NAMESPACE}],
                         binding['subjects'])
        # the DRA plugin runs as the same account
        self.assertEqual('amdgpu-virt-node', pod(
            chart.variant('ledger-configmap'), 'amdgpu-virt-dra-plugin')[
                'serviceAccountName'])

    def test_the_defaults_match_what_apply_writes(self) -> None:
        docs = chart.variant('ledger-configmap')
        defaults = conf_pkg.new_conf().pool
        self.assertEqual(
            (defaults.configmap_namespace, defaults.configmap_name),
            (oslo_conf(docs).pool.configmap_namespace,
             oslo_conf(docs).pool.configmap_name))

    def test_file_source_mounts_the_configmap(self) -> None:
        docs = chart.variant('ledger-file')
        conf = oslo_conf(docs)
        roles = noderoles.from_conf(conf, 'n1')
        assert roles is not None
        self.assertIsInstance(roles.source, noderoles.FileSource)
        path = conf.kubernetes.ledger_file
        self.assertEqual(ledgermap.DATA_KEY, os.path.basename(path))
        for ds in NODE_PODS:
            spec = pod(docs, ds)
            volumes = {v['name']: v for v in spec['volumes']}
            self.assertEqual({'name': 'gpu-roles', 'optional': True},
                             volumes['ledger']['configMap'])
            for container in spec['containers']:
                (mount,) = [m for m in container['volumeMounts']
                            if m['name'] == 'ledger']
                self.assertEqual((os.path.dirname(path), True),
                                 (mount['mountPath'], mount['readOnly']))
                self.assertNotIn('subPath', mount)  # kubelet updates it
        # no API access to the ledger is granted
        self.assertEqual([], [d for d in docs if d['metadata'][
            'name'] == 'amdgpu-virt-ledger-reader'])

    def test_file_source_needs_the_release_namespace(self) -> None:
        with helm_python.Chart.load(chart.CHART) as loaded:
            err = self.assertRaises(
                helm_python.HelmError, loaded.render,
                {'ledger': {'source': 'file'}}, name='amdgpu-virt',
                namespace=chart.NAMESPACE)
        self.assertIn('must then be in the release namespace amdgpu-virt, '
                      'not kube-system', str(err))

    def test_schema_refuses_bad_ledger_values(self) -> None:
        for values, field in [
                ({'source': 'etcd'}, '/ledger/source'),
                ({'configMap': {'namespace': 'Kube_System'}},
                 '/ledger/configMap/namespace'),
                ({'configMap': {'name': ''}}, '/ledger/configMap/name'),
                ({'file': '/etc/ledger.yaml'}, "'file' not allowed")]:
            self.assertIn(field, chart.schema_error({'ledger': values}),
                          values)
