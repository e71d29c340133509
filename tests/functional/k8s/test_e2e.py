"""Pods from the webhook to the container environment, end to end.

Three nodes (simulated MI300X hosts) are registered by the node agent in
the API server stand-in; every pod goes through the webhook, the
extender's ``/filter`` and ``/bind`` over HTTP, and kubelet's Allocate on
the node's device plugin through the kubelet stand-in (gRPC). Kubelet
itself cannot run here; the stand-in does what its device manager does.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import testtools

from amdgpu_virt.k8s.admission import intent
from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster

RESOURCE = 'amd.com/gpu'
NODES = ('n1', 'n2', 'n3')


class EndToEndTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(NODES, gpus=2))
        self.kubelets: dict[str, kubelet_fixture.KubeletStandIn] = {}
        for name in NODES:
            directory = tempfile.mkdtemp(prefix='e2e')
            self.addCleanup(shutil.rmtree, directory, True)
            kubelet = kubelet_fixture.KubeletStandIn(directory).start()
            self.addCleanup(kubelet.stop)
            plugin = deviceplugin.DevicePlugin(
                self.cluster.inventories[name], plugin_dir=directory,
                socket_name='amdgpu.sock', share_count=10,
                poll_interval=0.05,
                pod_source=podsource.KubernetesPodSource(name,
                                                    self.cluster.api))
            plugin.start()
            self.addCleanup(plugin.stop)
            kubelet.wait_for_devices(RESOURCE, count=20)
            self.kubelets[name] = kubelet

    def _schedule(self, pod: dict[str, Any]
                  ) -> tuple[str, dict[str, Any], list[Any]]:
        """Webhook, filter, bind, Allocate for every GPU container.

        :returns: (node, the pod afterwards, Allocate responses in
            container order).
        """
        stored = self.cluster.create(pod)
        self.assertEqual('amdgpu-virt-scheduler',
                         stored['spec']['schedulerName'])
        answer = self.cluster.filter(stored)
        self.assertEqual('', answer['Error'])
        self.assertEqual(1, len(answer['NodeNames']), answer)
        node = answer['NodeNames'][0]
        self.assertEqual(set(NODES) - {node}, set(answer['FailedNodes']))
        meta = stored['metadata']
        annotated = self.cluster.read_pod(meta['namespace'], meta['name'])
        annotations = annotated['metadata']['annotations']
        self.assertEqual(node, annotations[hami.VGPU_NODE])
        self.assertEqual(node, annotated['metadata']['labels'][
            hami.VGPU_NODE])
        self.assertEqual(annotations[hami.DEVICES_TO_ALLOCATE],
                         annotations[hami.DEVICES_ALLOCATED])
        hami.decode_unix_time(annotations[hami.VGPU_TIME])
        self.assertEqual({'Error': ''}, self.cluster.bind(stored, node))
        bound = self.cluster.read_pod(meta['namespace'], meta['name'])
        self.assertEqual(node, bound['spec']['nodeName'])
        self.assertIn(hami.NODE_LOCK, self.cluster.kube.server.get_object(
            'nodes', node)['metadata']['annotations'])
        responses = []
        for container in hami.decode_pod_devices(
                annotations[hami.DEVICES_ALLOCATED]):
            if container:
                _ids, response = self.kubelets[node].admit(
                    RESOURCE, len(container))
                responses.append(response)
        done = self.cluster.read_pod(meta['namespace'], meta['name'])
        self.assertEqual('success', done['metadata']['annotations'][
            hami.BIND_PHASE])
        self.assertNotIn(hami.NODE_LOCK, self.cluster.kube.server.get_object(
            'nodes', node)['metadata'].get('annotations', {}))
        return node, done, responses

    def _check_env(self, node: str, devices: hami.PodDevices,
                   responses: list[Any]) -> dict[str, int]:
        """Each container's env matches its devices; :returns: uuid ->
        CUs of this pod (whole GPUs: all)."""
        units = {u.uuid: u for u in self.cluster.units[node]}
        held: dict[str, int] = {}
        for container, response in zip([c for c in devices if c],
                                        responses, strict=True):
            envs = dict(response.envs)
            gpus = [units[d.uuid] for d in container]
            self.assertEqual(','.join(u.rocr_id for u in gpus),
                             envs['ROCR_VISIBLE_DEVICES'])
            self.assertEqual(','.join(str(n) for n in range(len(gpus))),
                             envs['HIP_VISIBLE_DEVICES'])
            self.assertEqual(
                ['/dev/kfd'] + [p for u in gpus
                                for p in (u.card_path, u.render_path)],
                [d.host_path for d in response.devices])
            masks = cumask.parse_hsa_cu_mask(
                envs['HSA_CU_MASK']).as_dict() if 'HSA_CU_MASK' in envs \
                else {}
            for local, (device, unit) in enumerate(zip(container, gpus,
                                                       strict=True)):
                whole = device.usedcores >= unit.compute_units
                if whole:
                    self.assertNotIn(local, masks)
                    mask = (1 << unit.compute_units) - 1
                else:
                    mask = masks[local]
                    self.assertEqual(device.usedcores, mask.bit_count())
                if device.usedmem < unit.vram_mib:
                    self.assertEqual(
                        '%dm' % device.usedmem,
                        envs['HIP_DEVICE_MEMORY_LIMIT_%d' % local])
                else:
                    self.assertNotIn('HIP_DEVICE_MEMORY_LIMIT_%d' % local,
                                     envs)
                self.assertFalse(held.get(unit.uuid, 0) & mask)
                held[unit.uuid] = held.get(unit.uuid, 0) | mask
        return held

    def test_pods_end_to_end(self) -> None:
        shapes = [
            ('half', [{'amd.com/gpu': '1', 'amd.com/gpucores': '50',
                       'amd.com/gpumem': '32768'}], None, None),
            ('multi', [{'amd.com/gpu': '2', 'amd.com/gpucores': '25',
                        'amd.com/gpumem': '16384'}, {}],
             [{'amd.com/gpucores': '10', 'amd.com/gpumem': '4096'}], None),
            ('whole', [{'amd.com/gpu': '1', 'amd.com/gpucores': '100'}],
             None, None),
            ('spread', [{'amd.com/gpu': '1', 'amd.com/gpucores': '33',
                         'amd.com/gpumem': '8192'}], None,
             {hami.NODE_SCHEDULER_POLICY: 'spread'}),
            ('typed', [{'amd.com/gpucores': '20', 'amd.com/gpumem': '1024'}],
             None, {hami.USE_GPUTYPE: 'mi300x'}),
        ]
        shapes += [('fill%d' % n, [{'amd.com/gpu': '1',
                                    'amd.com/gpucores': '30',
                                    'amd.com/gpumem': '10000'}], None, None)
                   for n in range(8)]
        holders: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for name, containers, init, extra in shapes:
            node, pod, responses = self._schedule(cluster.gpu_pod(
                name, containers, init, annotations=extra))
            devices = hami.decode_pod_devices(
                pod['metadata']['annotations'][hami.DEVICES_ALLOCATED])
            self.assertEqual(len(containers) + len(init or []),
                             len(devices), name)
            for uuid, mask in self._check_env(node, devices,
                                              responses).items():
                holders.setdefault((node, uuid), []).append((name, mask))
        # every pair of pods on a GPU has disjoint CUs
        shared = 0
        for (node, uuid), held in holders.items():
            for n, (first, mask) in enumerate(held):
                for second, other in held[n + 1:]:
                    shared += 1
                    self.assertFalse(
                        mask & other, '%s and %s share CUs of %s on %s'
                        % (first, second, uuid, node))
        self.assertGreater(shared, 3)
        # the stored ranges agree with what the containers got
        whole = [h for h in holders.values() if any(n == 'whole'
                                                     for n, _m in h)]
        self.assertEqual([1], [len(h) for h in whole])
        # binpack (the default) packed the first pods on one node
        self.assertGreaterEqual(max(len(h) for h in holders.values()), 3)

    def test_pod_that_fits_nowhere(self) -> None:
        stored = self.cluster.create(cluster.gpu_pod('huge', [{
            'amd.com/gpu': '1', 'amd.com/gpumem': '999999'}]))
        answer = self.cluster.filter(stored)
        self.assertEqual([], answer['NodeNames'])
        self.assertEqual('', answer['Error'])
        self.assertEqual(set(NODES), set(answer[
            'FailedAndUnresolvableNodes']))
        self.assertIn('asks for 999999 MiB on 1 GPU(s)',
                      answer['FailedAndUnresolvableNodes']['n1'])
        stored = self.cluster.create(cluster.gpu_pod('many', [{
            'amd.com/gpu': '3', 'amd.com/gpucores': '10'}]))
        answer = self.cluster.filter(stored)
        self.assertEqual([], answer['NodeNames'])
        self.assertIn('asks for 3 GPUs, the node has 2',
                      answer['FailedAndUnresolvableNodes']['n2'])
        # the webhook stops an impossible core percentage before that
        self.assertRaisesRegex(AssertionError, '1..100', self.cluster.create,
                               cluster.gpu_pod('bad', [{
                                   'amd.com/gpucores': '150'}]))

    def test_isolated_tenants_get_whole_gpus_only(self) -> None:
        self.assertRaisesRegex(
            AssertionError, 'only gets whole GPUs', self.cluster.create,
            cluster.gpu_pod('slice', [{'amd.com/gpucores': '50'}],
                            namespace='secure'))
        node, pod, responses = self._schedule(cluster.gpu_pod(
            'whole', [{'amd.com/gpu': '1'}], namespace='secure'))
        envs = dict(responses[0].envs)
        self.assertNotIn('HSA_CU_MASK', envs)
        self.assertNotIn('LD_AUDIT', envs)
        (container,) = hami.decode_pod_devices(
            pod['metadata']['annotations'][hami.DEVICES_ALLOCATED])
        unit = {u.uuid: u for u in self.cluster.units[node]}[
            container[0].uuid]
        self.assertEqual((unit.vram_mib, unit.compute_units),
                         (container[0].usedmem, container[0].usedcores))

    def test_stated_needs_follow_the_namespace(self) -> None:
        # the same statement of needs: a CU slice where tenants are
        # trusted, a whole GPU where they are isolated; both say why
        stated = {intent.ANNOTATION: 'memory: 20GiB, compute: 25%'}
        results = {}
        for namespace in ('team', 'secure'):
            node, pod, responses = self._schedule(cluster.gpu_pod(
                'stated', [{}], namespace=namespace, annotations=stated))
            limits = pod['spec']['containers'][0]['resources']['limits']
            annotations = pod['metadata']['annotations']
            (container,) = hami.decode_pod_devices(
                annotations[hami.DEVICES_ALLOCATED])
            envs = dict(responses[0].envs)
            self.cluster.events.flush()
            events = self.cluster.api.list_namespaced_event(namespace).items
            results[namespace] = (limits, annotations, container[0], envs,
                                  [e.message for e in events
                                   if e.involved_object.name == 'stated'])
        limits, annotations, device, envs, events = results['team']
        self.assertEqual({'amd.com/gpu': '1', 'amd.com/gpucores': '25',
                          'amd.com/gpumem': '20480'}, limits)
        self.assertEqual('cu-slice', annotations[intent.DECISION_ANNOTATION])
        reason = annotations[intent.REASON_ANNOTATION]
        self.assertIn('CU slice of 25% of the CUs and 20480 MiB', reason)
        self.assertIn('tenancy is trusted', reason)
        self.assertEqual([reason], events)
        self.assertEqual((20480, 76), (device.usedmem, device.usedcores))
        self.assertEqual(76, cumask.parse_hsa_cu_mask(
            envs['HSA_CU_MASK']).as_dict()[0].bit_count())
        self.assertEqual('20480m', envs['HIP_DEVICE_MEMORY_LIMIT_0'])
        limits, annotations, device, envs, events = results['secure']
        self.assertEqual({'amd.com/gpu': '1'}, limits)
        self.assertEqual('whole', annotations[intent.DECISION_ANNOTATION])
        reason = annotations[intent.REASON_ANNOTATION]
        self.assertIn('whole GPU (1): no CU slice because tenancy is '
                      'isolated', reason)
        self.assertEqual([reason], events)
        self.assertEqual(304, device.usedcores)
        self.assertNotIn('HSA_CU_MASK', envs)
        self.assertNotIn('LD_AUDIT', envs)

    def test_needs_stated_per_container_follow_the_namespace(self) -> None:
        # two containers, each stating its own needs: each gets its CU
        # slice where tenants are trusted and a whole GPU where they are
        # isolated, with its own reason and Event
        stated = {intent.CONTAINER_PREFIX + 'c0': 'memory: 20GiB, '
                  'compute: 25%', intent.CONTAINER_PREFIX + 'c1':
                  'memory: 8GiB, compute: 10%'}
        results = {}
        for namespace in ('team', 'secure'):
            node, pod, responses = self._schedule(cluster.gpu_pod(
                'pair', [{}, {}], namespace=namespace, annotations=stated))
            limits = [c['resources']['limits']
                      for c in pod['spec']['containers']]
            annotations = pod['metadata']['annotations']
            devices = hami.decode_pod_devices(
                annotations[hami.DEVICES_ALLOCATED])
            held = self._check_env(node, devices, responses)
            self.cluster.events.flush()
            events = {e.involved_object.field_path: e.message
                      for e in self.cluster.api.list_namespaced_event(
                          namespace).items
                      if e.involved_object.name == 'pair'}
            results[namespace] = (limits, annotations, devices, responses,
                                  events, held)
        limits, annotations, devices, responses, events, held = \
            results['team']
        self.assertEqual([{'amd.com/gpu': '1', 'amd.com/gpucores': '25',
                           'amd.com/gpumem': '20480'},
                          {'amd.com/gpu': '1', 'amd.com/gpucores': '10',
                           'amd.com/gpumem': '8192'}], limits)
        self.assertEqual([(20480, 76), (8192, 30)],
                         [(c[0].usedmem, c[0].usedcores) for c in devices])
        self.assertEqual(['20480m', '8192m'],
                         [dict(r.envs)['HIP_DEVICE_MEMORY_LIMIT_0']
                          for r in responses])
        for name in ('c0', 'c1'):
            self.assertEqual('cu-slice', annotations[
                intent.DECISION_PREFIX + name])
            reason = annotations[intent.REASON_PREFIX + name]
            self.assertIn('tenancy is trusted', reason)
            self.assertEqual("container '%s': %s" % (name, reason),
                             events['spec.containers{%s}' % name])
        self.assertIn('CU slice of 10% of the CUs and 8192 MiB',
                      annotations[intent.REASON_PREFIX + 'c1'])
        self.assertEqual(2, len(events))
        self.assertNotIn(intent.DECISION_ANNOTATION, annotations)
        limits, annotations, devices, responses, events, held = \
            results['secure']
        self.assertEqual([{'amd.com/gpu': '1'}] * 2, limits)
        self.assertEqual([304, 304], [c[0].usedcores for c in devices])
        self.assertEqual(2, len({c[0].uuid for c in devices}))
        for name, response in zip(('c0', 'c1'), responses, strict=True):
            self.assertNotIn('HSA_CU_MASK', dict(response.envs))
            self.assertEqual('whole', annotations[
                intent.DECISION_PREFIX + name])
            reason = annotations[intent.REASON_PREFIX + name]
            self.assertIn('whole GPU (1): no CU slice because tenancy is '
                          'isolated', reason)
        # the same decision for both: one Event, of the pod
        self.assertEqual({None: "containers 'c0', 'c1': %s" % reason},
                         events)
        # a statement for a container the pod does not have, or one that
        # never fits, is denied naming the container
        for needs, reason in (
                ({intent.CONTAINER_PREFIX + 'c2': 'gpus: 1'},
                 "no container or init container 'c2' .it has: c0, c1."),
                ({intent.CONTAINER_PREFIX + 'c1': 'memory: 300GiB'},
                 r"container 'c1': metadata.annotations\[workload.gpu.amd.com"
                 r"/c1\]: fits no GPU of the cluster: \[size\]")):
            self.assertRaisesRegex(AssertionError, reason,
                                   self.cluster.create, cluster.gpu_pod(
                                       'bad', [{}, {}], annotations=needs))

    def test_stated_needs_that_never_fit_are_denied(self) -> None:
        for needs, reason in (
                ('memory: 300GiB', r'fits no GPU of the cluster: \[size\] '
                 'requested 304 CUs and 307200 MiB per GPU, but a whole AMD '
                 'Instinct MI300X has 304 CUs and [0-9]+ MiB$'),
                ('{gpus: 2, p2p: true, tenancy: trusted, compute: 10%}',
                 None),
                ('tenancy: trusted', "tenancy: 'trusted' is not allowed: "
                 "namespace 'secure'")):
            pod = cluster.gpu_pod('n', [{}], namespace='secure',
                                  annotations={intent.ANNOTATION: needs})
            if reason is None:
                # P2P across two GPUs: whole GPUs, even where trusted
                pod['metadata']['namespace'] = 'team'
                stored = self.cluster.create(pod)
                self.assertEqual('whole', stored['metadata']['annotations'][
                    intent.DECISION_ANNOTATION])
                self.assertIn('P2P', stored['metadata']['annotations'][
                    intent.REASON_ANNOTATION])
                continue
            self.assertRaisesRegex(AssertionError, reason,
                                   self.cluster.create, pod)

    def test_pod_without_gpus_is_left_alone(self) -> None:
        pod = cluster.gpu_pod('cpu', [{}])
        pod['metadata']['uid'] = 'u'
        answer = self.cluster.filter(pod)
        self.assertEqual(list(NODES), answer['NodeNames'])
        self.assertEqual({}, answer['FailedNodes'])

    def test_full_gpus_are_refused_with_reasons(self) -> None:
        # two whole-GPU pods per node take every GPU of n1..n3
        for n in range(6):
            self._schedule(cluster.gpu_pod('w%d' % n, [{
                'amd.com/gpu': '1', 'amd.com/gpucores': '100'}]))
        stored = self.cluster.create(cluster.gpu_pod('late', [{
            'amd.com/gpu': '1', 'amd.com/gpucores': '10',
            'amd.com/gpumem': '100'}]))
        answer = self.cluster.filter(stored)
        self.assertEqual([], answer['NodeNames'])
        for node in NODES:
            self.assertIn('at most 0 CUs', answer['FailedNodes'][node])
