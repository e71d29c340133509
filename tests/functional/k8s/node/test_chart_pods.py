"""The chart's node pods, run as ``helm install`` renders them.

The chart is rendered with the real Helm engine; its node DaemonSet's pod
runs through :mod:`tests.functional.fixtures.podrunner` (kubelet's and the
runtime's part) on a simulated node: a sysfs tree, device nodes, the
kubelet stand-in's device plugin directory and nothing else installed.
The init containers install the memory-limit library from a stand-in of
HAMi's image; then the node agent and the device plugin run as processes
with the rendered configuration, against the API server stand-in, which
authenticates the node's service account token and enforces the chart's
own RBAC and admission policies.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import _ctypes
import fixtures
import testtools
import yaml
from kubernetes import client

from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import enforcement
from amdgpu_virt.k8s.node import memhook
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import apiauth
from tests.functional.fixtures import cgroupfs
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.fixtures import podrunner
from tests.unit.deploy import chart

NAMESPACE = chart.NAMESPACE
NODE = 'gpu-1'
HAMI_IMAGE = 'ghcr.io/project-hami/amd-device-plugin:0.0.1'
LIBRARY_IN_IMAGE = '/opt/hami/lib/amd/libamvgpu.so'
RESOURCE = 'amd.com/gpu'
#: the node pods' token: the chart's service account, bound to a pod on
#: the node (as the real API server issues it)
TOKENS = {'node': apiauth.service_account(NAMESPACE, 'amdgpu-virt-node',
                                          NODE)}
_PLURALS = apiauth.PLURALS


def wait(predicate: Callable[[], Any], what: str,
         timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError('timed out waiting for %s' % what)
        time.sleep(0.1)


class ChartNodePodTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.kube = self.useFixture(kubeclient.ApiServerFixture(
            tokens=TOKENS))
        self.admin = self.kube.api
        for name in ('default', 'kube-system', NAMESPACE):
            self.admin.create_namespace({'metadata': {'name': name}})
        self.admin.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name=NODE)))
        # the node: its /sys, its device nodes, kubelet; nothing else
        self.node_root = os.path.join(self.tmp, 'node')
        self.inventory = simulate.simulate_host(
            simulate.HostSpec(hostname=NODE, gpus=2),
            self.node_root + '/sys')
        self.gpus = [str(g.address) for g in self.inventory.gpus]
        self.units = devices.units_from_inventory(self.inventory)
        # its cgroup v2 hierarchy: a kernel without the dmem controller
        # (older than 6.14), unless a test says otherwise
        self.cgroups(dmem_controller=False)
        os.makedirs(self.node_root + '/dev/dri')
        for path in ['/dev/kfd'] + [p for u in self.units
                                    for p in (u.card_path, u.render_path)]:
            open(self.node_root + path, 'w').close()
        plugins = self.node_root + '/var/lib/kubelet/device-plugins'
        os.makedirs(plugins)
        self.kubelet = kubelet_fixture.KubeletStandIn(plugins).start()
        self.addCleanup(self.kubelet.stop)
        # what the pods' service account token gives them
        self.kubeconfig = os.path.join(self.tmp, 'kubeconfig')
        with open(self.kubeconfig, 'w') as stream:
            yaml.safe_dump({
                'apiVersion': 'v1', 'kind': 'Config',
                'clusters': [{'name': 'c', 'cluster': {
                    'server': self.kube.server.url}}],
                'users': [{'name': 'node', 'user': {'token': 'node'}}],
                'contexts': [{'name': 'c', 'context': {
                    'cluster': 'c', 'user': 'node'}}],
                'current-context': 'c'}, stream)
        self.overlay = os.path.join(self.tmp, 'test.conf')
        with open(self.overlay, 'w') as stream:
            stream.write('[kubernetes]\nkubeconfig = %s\n'
                         'registration_interval = 1\n' % self.kubeconfig)

    # --- the pieces ----------------------------------------------------------

    def cgroups(self, dmem_controller: bool) -> None:
        root = self.node_root + '/sys/fs/cgroup'
        shutil.rmtree(root, ignore_errors=True)
        cgroupfs.SimNode(root, dmem_controller=dmem_controller,
                         gpus=dict.fromkeys(self.gpus, 192 << 30))

    def hami_image(self, with_library: bool = True) -> str:
        """A stand-in of HAMi's image: its library where HAMi puts it."""
        root = os.path.join(self.tmp, 'hami-image')
        os.makedirs(root + os.path.dirname(LIBRARY_IN_IMAGE), exist_ok=True)
        if with_library:
            with open(_ctypes.__file__, 'rb') as src, open(
                    root + LIBRARY_IN_IMAGE, 'wb') as out:
                out.write(src.read())
        return root

    def install(self, values: dict[str, Any] | None = None,
                with_library: bool = True, withhold: tuple[str, ...] = ()
                ) -> podrunner.PodRunner:
        """``helm install``: the objects in the API (but the RBAC and
        policy objects named in ``withhold``), the node pod made."""
        docs = chart.documents(values)
        for doc in docs:
            if doc['kind'] in _PLURALS and doc['metadata'][
                    'name'] not in withhold:
                self.kube.server.put_object(_PLURALS[doc['kind']], doc)
        self.docs = docs
        self.with_library = with_library
        return self.pod()

    def pod(self) -> podrunner.PodRunner:
        """A (new) pod of the node DaemonSet, on the node."""
        config = chart.find(self.docs, 'ConfigMap', 'amdgpu-virt-config')
        spec = chart.find(self.docs, 'DaemonSet', 'amdgpu-virt-node')[
            'spec']['template']['spec']

        def read_configmap(name: str) -> dict[str, str] | None:
            try:
                found = self.admin.read_namespaced_config_map(name,
                                                              NAMESPACE)
            except client.ApiException:
                return None
            return dict(found.data or {})

        pod_root = os.path.join(self.tmp, 'pod-%d' % len(os.listdir(
            self.tmp)))
        return podrunner.PodRunner(
            spec, NODE, self.node_root, pod_root,
            images={HAMI_IMAGE: self.hami_image(self.with_library)},
            configmaps={'amdgpu-virt-config': config['data']},
            read_configmap=read_configmap)

    def start(self, pod: podrunner.PodRunner,
              name: str) -> podrunner.Started:
        started = pod.start(name, (self.overlay,))
        self.addCleanup(pod.stop, started)
        return started

    def registered(self) -> dict[str, int]:
        """PCI address -> slots of the node's registration."""
        node = self.admin.read_node(NODE)
        value = (node.metadata.annotations or {}).get(hami.NODE_REGISTER)
        if value is None:
            return {}
        return {d.custominfo[hami.CUSTOMINFO_PCI_BDF]: d.count
                for d in hami.decode_node_register(value)}

    def label(self, key: str = memhook.LABEL) -> str | None:
        return (self.admin.read_node(NODE).metadata.labels or {}).get(key)

    def healthy(self) -> set[str] | None:
        """GPU addresses whose devices the plugin lists healthy."""
        plugin = self.kubelet.plugins.get(RESOURCE)
        if plugin is None or not plugin.updates:
            return None
        by_id = {}
        for unit in self.units:
            by_id[unit.uuid] = unit.gpu_address
        return {a for d in plugin.devices if d.health == 'Healthy'
                for uid, a in by_id.items() if d.ID.startswith(uid)}

    def write_ledger(self, *roles: Role,
                     where: ledgermap.Location | None = None) -> None:
        """What ``apply --push-configmap`` and ``move`` write."""
        ledgermap.write(self.admin, av_ledger.build([
            av_ledger.GpuAssignment(
                NODE, self.inventory.gpus[n].address, role, 'MI300X',
                vf_count=8 if role is Role.NOVA_VF else None)
            for n, role in enumerate(roles)]), where or ledgermap.Location(
                'kube-system', 'amdgpu-virt-ledger'))

    # --- the memory-limit library ------------------------------------------

    def test_helm_install_alone_gives_slices(self) -> None:
        pod = self.install()
        target = self.node_root + '/usr/local/vgpu/libamvgpu.so'
        self.assertFalse(os.path.exists(target))
        fetch, install = pod.run_init()
        self.assertEqual((0, 0), (fetch.returncode, install.returncode),
                         fetch.stderr + install.stderr)
        with open(_ctypes.__file__, 'rb') as src, open(target, 'rb') as got:
            self.assertEqual(src.read(), got.read())
        self.assertEqual(0o555, os.stat(target).st_mode & 0o777)
        self.assertIn('installed /usr/local/vgpu/libamvgpu.so'.replace(
            '/usr', self.node_root + '/usr'),
            pod.messages['memory-hook-install'])
        agent = self.start(pod, 'agent')
        self.start(pod, 'device-plugin')
        slots = wait(lambda: self.registered(), 'the registration')
        self.assertEqual(dict.fromkeys(self.gpus, 10), slots, agent.output())
        self.assertEqual(memhook.READY, wait(self.label, 'the label'))
        self.kubelet.wait_for_devices(RESOURCE, count=20, timeout=60)
        self.assertEqual(set(self.gpus), self.healthy())
        # the pod starts again (an upgrade, a reboot): nothing rewritten
        inode = os.stat(target).st_ino
        again = self.pod()
        self.assertEqual([0, 0], [r.returncode for r in again.run_init()])
        self.assertIn('is up to date', again.messages['memory-hook-install'])
        self.assertEqual(inode, os.stat(target).st_ino)

    def test_a_kernel_that_caps_vram_gives_slices_without_the_library(
            self) -> None:
        self.cgroups(dmem_controller=True)
        pod = self.install(with_library=False)
        self.assertEqual([0, 0], [r.returncode for r in pod.run_init()])
        agent = self.start(pod, 'agent')
        self.start(pod, 'device-plugin')
        self.assertEqual(dict.fromkeys(self.gpus, 10),
                         wait(self.registered, 'the registration'),
                         agent.output())
        self.assertEqual('kernel', wait(lambda: self.label(
            enforcement.NODE_LABEL), 'the enforcement label'))
        self.kubelet.wait_for_devices(RESOURCE, count=20, timeout=60)
        self.assertTrue(self.kubelet.plugins[RESOURCE].options
                        .pre_start_required)

    def test_no_library_whole_gpus_and_why(self) -> None:
        pod = self.install(with_library=False)
        fetch, install = pod.run_init()
        self.assertEqual((0, 0), (fetch.returncode, install.returncode))
        self.assertIn('cannot copy %s out of the image %s' % (
            pod.path(pod.spec['initContainers'][0], LIBRARY_IN_IMAGE),
            HAMI_IMAGE), fetch.stderr)
        message = pod.messages['memory-hook-install']
        self.assertIn('cannot be read: no such file', message)
        self.assertIn('the node offers whole GPUs only', message)
        self.start(pod, 'agent')
        self.assertEqual(dict.fromkeys(self.gpus, 1),
                         wait(self.registered, 'the registration'))
        self.assertEqual(memhook.UNAVAILABLE, wait(self.label, 'the label'))
        events = wait(lambda: [
            e for e in self.admin.list_namespaced_event('default').items
            if e.reason == memhook.EVENT_REASON], 'the event')
        self.assertIn('no such file', events[0].message)

    def test_required_install_keeps_the_pod_from_starting(self) -> None:
        pod = self.install({'node': {'memoryHook': {'install': {
            'required': True}}}}, with_library=False)
        (fetch,) = pod.run_init()
        self.assertEqual(1, fetch.returncode)

    # --- the role ledger ---------------------------------------------------

    def test_ledger_configmap_gives_only_kubernetes_gpus(self) -> None:
        self.write_ledger(Role.K8S_SHARED, Role.NOVA_VF)
        pod = self.install({'ledger': {'source': 'configmap'}})
        self.assertEqual([0, 0], [r.returncode for r in pod.run_init()])
        agent = self.start(pod, 'agent')
        plugin = self.start(pod, 'device-plugin')
        self.assertEqual({self.gpus[0]: 10}, wait(
            self.registered, 'the registration'), agent.output())
        self.kubelet.wait_for_devices(RESOURCE, count=20, timeout=60)
        self.assertEqual({self.gpus[0]}, wait(
            self.healthy, 'the device list'), plugin.output())
        # the Nova GPU is moved to Kubernetes ("amdgpu-virt move")
        self.write_ledger(Role.K8S_SHARED, Role.K8S_DEDICATED)
        wait(lambda: len(self.registered()) == 2, 'the moved GPU')
        self.assertEqual(dict.fromkeys(self.gpus, 10), self.registered())
        wait(lambda: self.healthy() == set(self.gpus),
             'the moved GPU healthy')

    def test_without_the_reader_role_nothing_is_offered(self) -> None:
        # the RBAC the chart renders is what lets the node read the
        # ledger: without it the read is denied and, failing closed, no
        # GPU is offered
        self.write_ledger(Role.K8S_SHARED, Role.K8S_SHARED)
        pod = self.install({'ledger': {'source': 'configmap'}},
                           withhold=('amdgpu-virt-ledger-reader',))
        pod.run_init()
        agent = self.start(pod, 'agent')
        wait(lambda: '403' in agent.output() or 'orbidden' in
             agent.output(), 'the denied read')
        self.assertEqual({}, self.registered())

    def test_ledger_file_is_the_mounted_configmap(self) -> None:
        where = ledgermap.Location(NAMESPACE, 'gpu-roles')
        self.write_ledger(Role.NOVA_VF, Role.K8S_DEDICATED, where=where)
        pod = self.install({'ledger': {'source': 'file', 'configMap': {
            'namespace': NAMESPACE, 'name': 'gpu-roles'}}})
        pod.run_init()
        agent = self.start(pod, 'agent')
        self.assertEqual({self.gpus[1]: 10}, wait(
            self.registered, 'the registration'), agent.output())
