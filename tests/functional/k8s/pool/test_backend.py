"""The ``kubernetes`` backend against the API server stand-in."""

from __future__ import annotations

import testtools
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import plugins
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.pool import backend
from amdgpu_virt.k8s.pool import side as pool
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import PciAddress
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient


class KubernetesBackendTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_node(client.V1Node(
            metadata=client.V1ObjectMeta(name='n1')))
        inventory = simulate.design_host(simulate.HostSpec(hostname='n1',
                                                           gpus=2))
        self.units = devices.units_from_inventory(inventory)
        self.agent = agent.NodeAgent(
            agent.KubernetesNodeStore('n1', self.kube.api), self.units, 10)
        self.agent.sync_once()
        self.backend = plugins.load_driver(
            'amdgpu_virt.backends', 'kubernetes', conf_pkg.new_conf(),
            core_api=self.kube.api)
        self.first = PciAddress.parse(self.units[0].gpu_address)
        self.second = PciAddress.parse(self.units[1].gpu_address)

    def _pod(self, name: str, uuid: str, bound: bool,
             phase: str = 'Running', **annotations: str) -> None:
        value = hami.encode_pod_devices([[hami.ContainerDevice(
            uuid, 'AMD Instinct MI300X', 1024, 30)]])
        pod = {'metadata': {'name': name, 'namespace': 'team',
                            'labels': {hami.VGPU_NODE: 'n1'},
                            'annotations': {hami.DEVICES_ALLOCATED: value,
                                            hami.VGPU_NODE: 'n1',
                                            **annotations}},
               'spec': {'containers': [{'name': 'c', 'image': 'x'}]},
               'status': {'phase': phase}}
        if bound:
            pod['spec']['nodeName'] = 'n1'
        self.kube.server.put_object('pods', pod)

    def _both(self, address: PciAddress) -> tuple[str, ...]:
        """The backend's answer, checked against the pool's (move's)."""
        answer = self.backend.consumers('n1', address)
        side = pool.KubernetesPool(self.kube.api, ledgermap.Location(
            'amdgpu-virt', 'amdgpu-virt-ledger'))
        self.assertEqual(answer, side.consumers('n1', address))
        return answer

    def test_offered_and_consumers(self) -> None:
        self.assertIsInstance(self.backend, backend.KubernetesBackend)
        self.assertTrue(self.backend.is_offered('n1', self.first))
        self.assertFalse(self.backend.is_withdrawn('n1', self.first))
        self.assertFalse(self.backend.is_offered('gone', self.first))
        self.assertTrue(self.backend.is_withdrawn('gone', self.first))
        self.assertEqual((), self._both(self.first))
        chosen = 'team/chosen (chosen by the extender, not bound yet)'
        self._pod('bound', self.units[0].uuid, True)
        self._pod('chosen', self.units[0].uuid, False)
        self._pod('other', self.units[1].uuid, True)
        self.assertEqual(('team/bound', chosen), self._both(self.first))
        self.assertEqual(('team/other',), self._both(self.second))
        # withdrawn: the pods' devices are unknown now, so they may be on
        # this GPU (fail closed)
        self.agent.cleanup()
        self.assertTrue(self.backend.is_withdrawn('n1', self.first))
        unknown = ' (device %s not registered: may be this GPU)'
        self.assertEqual((
            'team/bound' + unknown % self.units[0].uuid.lower(),
            chosen[:-1] + '; device %s not registered: may be this GPU)'
            % self.units[0].uuid.lower(),
            'team/other' + unknown % self.units[1].uuid.lower()),
            self._both(self.first))

    def test_the_old_answers_agree(self) -> None:
        first, second = self.units[0].uuid, self.units[1].uuid
        cases = (
            # name, device, bound, extra annotations, phase, counts on GPU 1
            ('bound', first, True, {}, 'Running', 'team/bound'),
            ('binding', first, False, {hami.BIND_PHASE: 'allocating'},
             'Pending', 'team/binding (chosen by the extender, not bound '
             'yet)'),
            ('filtered', first, False, {}, 'Pending',
             'team/filtered (chosen by the extender, not bound yet)'),
            ('done', first, True, {}, 'Succeeded', None),
            ('failed', first, True, {}, 'Failed', None),
            ('elsewhere', second, True, {}, 'Running', None),
            ('unreadable', second, True,
             {hami.DEVICES_ALLOCATED: 'g0,AMD:;'}, 'Running',
             'team/unreadable (unreadable allocation'),
        )
        expected = []
        for name, uuid, bound, extra, phase, counts in cases:
            self._pod(name, uuid, bound, phase, **extra)
            if counts:
                expected.append(counts)
        answer = self._both(self.first)
        self.assertEqual(len(expected), len(answer), answer)
        for want, got in zip(sorted(expected), answer, strict=True):
            self.assertTrue(got.startswith(want), (want, got))
        # the cross-audit's observation carries the same consumers
        observations, warnings = pool.KubernetesPool(
            self.kube.api, ledgermap.Location(
                'amdgpu-virt', 'amdgpu-virt-ledger')).observations()
        seen = {o.address: o.consumers for o in observations}
        self.assertEqual(answer, seen[self.first])
        self.assertIn('pod team/unreadable: unreadable allocation',
                      ' '.join(warnings))

    def test_allocated_claims_count_for_the_backend_and_move(self) -> None:
        """The backend and the pool (move, audit) share one view: an
        allocated ResourceClaim of our DRA driver holds its GPU."""
        device = 'gpu-%s-%s-%s-%s' % (
            '%04x' % self.first.domain, '%02x' % self.first.bus,
            '%02x' % self.first.device, '%x' % self.first.function)
        for name, driver in (('mine', 'gpu.amd.com'), ('theirs', 'x.io')):
            self.kube.server.put_object('resourceclaims', {
                'metadata': {'name': name, 'namespace': 'team'},
                'spec': {'devices': {'requests': []}},
                'status': {'allocation': {'devices': {'results': [{
                    'request': 'g', 'driver': driver, 'pool': 'n1',
                    'device': device + '-share'}]}}}})
        answer = self._both(self.first)
        self.assertEqual(1, len(answer), answer)
        self.assertTrue(answer[0].startswith('team/mine'), answer)
        self.assertEqual((), self._both(self.second))
