"""The pod runner stand-in does what kubelet and a runtime do with a pod
spec, where the chart's node pods depend on it."""

from __future__ import annotations

import os
import shutil

import fixtures
import testtools

from tests.functional.fixtures import podrunner


def spec(**extra: object) -> dict:
    base: dict = {
        'volumes': [
            {'name': 'hook', 'hostPath': {'path': '/usr/local/vgpu',
                                          'type': 'DirectoryOrCreate'}},
            {'name': 'sys', 'hostPath': {'path': '/sys',
                                         'type': 'Directory'}},
            {'name': 'scratch', 'emptyDir': {}},
            {'name': 'config', 'configMap': {'name': 'cfg'}},
            {'name': 'roles', 'configMap': {'name': 'roles',
                                            'optional': True}},
        ],
        'initContainers': [],
        'containers': [],
    }
    base.update(extra)
    return base


def container(name: str, script: str, *args: str, **extra: object) -> dict:
    item: dict = {
        'name': name, 'image': 'img', 'command': ['sh', '-c', script, name,
                                                  *args],
        'volumeMounts': [
            {'name': 'hook', 'mountPath': '/usr/local/vgpu'},
            {'name': 'sys', 'mountPath': '/host/sys'},
            {'name': 'scratch', 'mountPath': '/scratch'},
            {'name': 'config', 'mountPath': '/etc/app'},
        ]}
    item.update(extra)
    return item


class PodRunnerTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        if shutil.which('sh') is None:
            self.skipTest('no sh here')
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.node = os.path.join(self.tmp, 'node')
        os.makedirs(self.node + '/sys/class')
        self.image = os.path.join(self.tmp, 'image')
        os.makedirs(self.image + '/opt')
        with open(self.image + '/opt/file', 'w') as stream:
            stream.write('from the image\n')

    def runner(self, pod: dict, **kwargs: object) -> podrunner.PodRunner:
        kwargs.setdefault('configmaps', {'cfg': {
            'app.conf': '[a]\nroot = /host/sys\nlib = /usr/local/vgpu/x.so\n'
                        'name = amd.com/gpu\n'}})
        return podrunner.PodRunner(pod, 'n1', self.node,
                                   os.path.join(self.tmp, 'pod'),
                                   images={'img': self.image},
                                   **kwargs)  # type: ignore[arg-type]

    def test_volumes(self) -> None:
        runner = self.runner(spec())
        self.assertEqual(self.node + '/usr/local/vgpu',
                         runner.volumes['hook'])
        self.assertTrue(os.path.isdir(runner.volumes['hook']))  # created
        self.assertEqual(self.node + '/sys', runner.volumes['sys'])
        with open(os.path.join(runner.volumes['config'], 'app.conf')) as s:
            self.assertIn('root = /host/sys', s.read())
        self.assertEqual([], os.listdir(runner.volumes['roles']))
        err = self.assertRaises(AssertionError, self.runner, spec(),
                                configmaps={})
        self.assertIn('configMap cfg of volume config does not exist',
                      str(err))
        shutil.rmtree(self.node + '/sys')
        err = self.assertRaises(AssertionError, self.runner, spec())
        self.assertIn('hostPath /sys of volume sys is not a directory',
                      str(err))

    def test_paths_of_the_container(self) -> None:
        runner = self.runner(spec())
        item = container('c', 'true')
        self.assertEqual(self.node + '/usr/local/vgpu/libamvgpu.so',
                         runner.path(item, '/usr/local/vgpu/libamvgpu.so'))
        self.assertEqual(self.node + '/sys/class',
                         runner.path(item, '/host/sys/class'))
        # outside the mounts: the container's root, with the image's files
        # and a link at each mount point
        root_file = runner.path(item, '/opt/file')
        with open(root_file) as stream:
            self.assertEqual('from the image\n', stream.read())
        self.assertTrue(os.path.isdir(runner.path(item, '/host') + '/sys'))
        self.assertNotEqual(runner.path(item, '/dev/termination-log'),
                            runner.path(container('d', 'true'),
                                        '/dev/termination-log'))

    def test_config_files_see_the_container_paths(self) -> None:
        runner = self.runner(spec())
        item = container('c', 'true')
        item['command'] = ['amdgpu-virt', '--config-file',
                           '/etc/app/app.conf', 'k8s', 'agent']
        argv = runner.command(item, ('/tmp/extra.conf',))
        self.assertTrue(argv[0].endswith('/amdgpu-virt'))
        self.assertEqual(['--config-file', '/tmp/extra.conf', 'k8s',
                          'agent'], argv[3:])
        with open(argv[2]) as stream:
            text = stream.read()
        self.assertIn('root = %s/sys\n' % self.node, text)
        self.assertIn('lib = %s/usr/local/vgpu/x.so\n' % self.node, text)
        self.assertIn('name = amd.com/gpu\n', text)

    def test_init_containers_in_order_until_one_fails(self) -> None:
        pod = spec(initContainers=[
            container('first', 'echo one > "$1"; echo done > "$2"',
                      '/scratch/order', '/dev/termination-log'),
            container('second', 'cat "$1" > /dev/null && exit 3',
                      '/scratch/order'),
            container('third', 'echo never > "$1"', '/scratch/never'),
        ])
        runner = self.runner(pod)
        results = runner.run_init()
        self.assertEqual([0, 3], [r.returncode for r in results])
        self.assertEqual('done\n', runner.messages['first'])
        self.assertFalse(os.path.exists(runner.volumes['scratch'] +
                                        '/never'))

    def test_environment_and_working_directory(self) -> None:
        item = container('c', 'echo "$NODE_NAME $POD_UID $X $(pwd)" > "$1"',
                         '/scratch/env', workingDir='/usr/local/vgpu', env=[
                             {'name': 'NODE_NAME', 'valueFrom': {
                                 'fieldRef': {'fieldPath': 'spec.nodeName'}}},
                             {'name': 'POD_UID', 'valueFrom': {
                                 'fieldRef': {'fieldPath': 'metadata.uid'}}},
                             {'name': 'X', 'value': 'y'}])
        runner = self.runner(spec(containers=[item]))
        started = runner.start('c')
        self.assertEqual(0, started.process.wait(30))
        with open(runner.volumes['scratch'] + '/env') as stream:
            self.assertEqual('n1 %s y %s\n' % (
                runner.uid, runner.volumes['hook']), stream.read())
        self.assertEqual(0, podrunner.PodRunner.stop(started))
