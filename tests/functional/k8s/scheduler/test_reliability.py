"""Many pods at once: two extender processes, several workers, 20 nodes.

Two extenders run as OS processes of their own (``amdgpu-virt k8s
scheduler``, each with its configuration file, kubeconfig, port, API
client and watch-fed cache: a failover, a scale-up or a stuck old leader),
against the API server stand-in served from the test process. Worker
threads play kube-scheduler: each filters and binds pods of random sizes
(seeded) over HTTP through one of the two extenders, all at the same time,
on 20 simulated nodes of 8 GPUs; only the allocation records keep the two
from booking the same CUs. Each node has a kubelet stand-in and the node's
device plugin on unix sockets in a temporary directory; one thread per
node plays kubelet: as soon as a pod is bound there it admits each GPU
container through the stand-in (``GetPreferredAllocation``, then
``Allocate`` over gRPC, with the container's ``amd.com/gpu`` count). Then,
from what the containers got (their environment) and what the API holds:

* no CU is given twice, no GPU's memory, CUs or slots are over-committed,
  and a whole GPU goes to one container only;
* each bound pod is booked once in the record of its node, with exactly
  what its containers got;
* every node lock is released;
* every pod was bound once (the API agrees) or rejected with a reason for
  every node.

``AMDGPU_VIRT_RELIABILITY_PODS`` sets the number of pods of the
fault-free run (default 1000). ``AMDGPU_VIRT_RELIABILITY_FAULT_PODS`` sets
those of the same run with the fault-injection proxy between the API
server stand-in and both the extender processes and the kubelets' device
plugins (500s, resets, answers lost after the write, truncated answers and
delays by seeded schedule; default 1000): the same invariants hold, every
failed request being retried as kube-scheduler and kubelet retry. The
extender processes use the ``kubernetes`` client as deployed (its
connection retries on), the device plugins' client retries nothing. Smaller
runs for a quick check::

    AMDGPU_VIRT_RELIABILITY_PODS=100 AMDGPU_VIRT_RELIABILITY_FAULT_PODS=100 \\
        python -m stestr --test-path=./tests/functional run test_reliability

``tox -e reliability`` runs both at 1,000 pods whatever the defaults, and
``python bench/reliability.py`` prints their times (figures in
``bench/README.rst``, "reliability.py").
"""

from __future__ import annotations

import collections
import datetime
import os
import queue
import random
import re
import threading
import time
from typing import Any

import fixtures
import grpc
import testtools
from kubernetes import client
from testtools import content

from amdgpu_virt.k8s.node import deviceplugin
from amdgpu_virt.k8s.node import podsource
from amdgpu_virt.k8s.node import sharedalloc
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.record import sweep as recordgc
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import faultproxy
from tests.functional.fixtures import kubelet as kubelet_fixture
from tests.functional.k8s import cluster

NODES = tuple('r%02d' % n for n in range(20))
WORKERS = 4
SEED = 20261130
RESOURCE = 'amd.com/gpu'
SLOTS = 10
#: the longest a whole run may take (then the workers give up and the
#: test fails naming what was left)
DEADLINE = 1500.0


def _random_pod(rng: random.Random, number: int) -> dict[str, Any]:
    containers = []
    for _n in range(1 if rng.random() < 0.9 else 2):
        percent = rng.choice((5, 10, 20, 25, 33, 50, 100))
        limits = {'amd.com/gpu': str(1 if rng.random() < 0.85 else 2),
                  'amd.com/gpucores': str(percent)}
        if percent < 100 or rng.random() < 0.5:
            limits['amd.com/gpumem'] = str(rng.choice(
                (1024, 4096, 16384, 32768, 65536)))
        containers.append(limits)
    annotations = {}
    if rng.random() < 0.5:
        annotations[hami.NODE_SCHEDULER_POLICY] = 'spread'
    if rng.random() < 0.3:
        annotations[hami.GPU_SCHEDULER_POLICY] = 'binpack'
    pod = cluster.gpu_pod('p%04d' % number, containers,
                          annotations=annotations)
    pod['spec']['schedulerName'] = 'amdgpu-virt-scheduler'
    return pod


FAULTS = {'seed': SEED, 'delay': 0.05, 'lifetime': DEADLINE + 300, 'rates': {
    faultproxy.Fault.ERROR: 0.02, faultproxy.Fault.RESET: 0.01,
    faultproxy.Fault.RESET_AFTER: 0.01, faultproxy.Fault.TRUNCATE: 0.01,
    faultproxy.Fault.DELAY: 0.02}}


class _Run:
    """What the workers and kubelets saw, shared between their threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bound_to: dict[str, list[str]] = collections.defaultdict(list)
        self.rejected: dict[str, dict[str, str]] = {}
        self.errors: list[str] = []
        self.retried: list[str] = []
        #: (node, gpu uuid) -> [(pod, CU mask, MiB)] from containers' env
        self.got: dict[tuple[str, str], list[tuple[str, int, int]]] = \
            collections.defaultdict(list)
        #: bookings the record sweep removed after a run through faults
        self.swept: int | None = None

    def add(self, what: list[Any], item: Any) -> None:
        with self.lock:
            what.append(item)


class ReliabilityTest(testtools.TestCase):

    def test_many_pods_many_workers(self) -> None:
        self._run(int(os.environ.get('AMDGPU_VIRT_RELIABILITY_PODS',
                                     '1000')), None)

    def test_many_pods_through_api_faults(self) -> None:
        # the extenders and the device plugins reach the API server
        # through the fault proxy: 500s, resets, answers lost after the
        # write, truncated answers and delays, by seeded schedule
        self._run(int(os.environ.get('AMDGPU_VIRT_RELIABILITY_FAULT_PODS',
                                     '1000')), FAULTS)

    def _run(self, count: int, faults: dict[str, Any] | None) -> None:
        started = time.monotonic()
        deadline = started + DEADLINE
        world = self.useFixture(cluster.Cluster(
            NODES, gpus=8, overrides={('scheduler', 'node_lock_wait'): 20.0},
            extenders=2, faults=faults, processes=True))
        rng = random.Random(SEED)
        created = [world.kube.server.put_object('pods', _random_pod(rng, n))
                   for n in range(count)]
        kubelets = self._kubelets(world)
        ready = time.monotonic()
        run = _Run()
        work: queue.Queue[dict[str, Any] | None] = queue.Queue()
        for pod in created:
            work.put(pod)
        node_queues: dict[str, queue.Queue[str | None]] = {
            name: queue.Queue() for name in NODES}
        retrying = faults is not None

        def scheduler(via: int) -> None:
            while True:
                pod = work.get()
                if pod is None:
                    return
                node = self._schedule(world, run, pod, via, retrying,
                                      deadline)
                if node is not None:
                    node_queues[node].put(pod['metadata']['name'])

        def kubelet(node: str) -> None:
            while True:
                key = node_queues[node].get()
                if key is None:
                    return
                self._admit(world, run, kubelets[node], node, key, retrying,
                            deadline)

        threads = [threading.Thread(target=kubelet, args=(name,),
                                    daemon=True, name='kubelet-' + name)
                   for name in NODES]
        workers = [threading.Thread(target=scheduler, args=(n % 2,),
                                    daemon=True, name='scheduler-%d' % n)
                   for n in range(WORKERS)]
        for thread in threads + workers:
            thread.start()
        for _n in workers:
            work.put(None)
        for thread in workers:
            thread.join(timeout=max(1.0, deadline - time.monotonic()))
        for name in NODES:
            node_queues[name].put(None)
        for thread in threads:
            thread.join(timeout=max(1.0, deadline - time.monotonic()))
        alive = [t.name for t in workers + threads if t.is_alive()]
        now = time.monotonic()
        figures = '%d pods: %d bound, %d rejected, %d retried requests; ' \
            'setup %.1f s, placing and allocating %.1f s' % (
                count, len(run.bound_to), len(run.rejected),
                len(run.retried), ready - started, now - ready)
        if world.proxy is not None:
            figures += '; faults: %s' % dict(collections.Counter(
                f.value for _m, _p, f in world.proxy.log))
        # read once the test is over: the final sweep's count is known then
        self.addDetail('figures', content.Content(
            content.UTF8_TEXT, lambda: [(figures + (
                '' if run.swept is None else '; stale bookings swept at '
                'the end: %d' % run.swept)).encode()]))
        self.assertEqual([], alive, 'still running after %.0f s' % DEADLINE)
        self.assertEqual([], run.errors)
        self._check_answers(run, count, faults)
        self._check_containers(world, run)
        self._check_records(world, run, faults)
        self._check_locks(world, faults)

    # -- kube-scheduler and kubelet ----------------------------------------

    def _kubelets(self, world: cluster.Cluster
                  ) -> dict[str, kubelet_fixture.KubeletStandIn]:
        """A kubelet stand-in and the device plugin of each node, on unix
        sockets of a temporary directory; the plugins read and write the
        API through the proxy when there is one."""
        config = client.Configuration(host=world.proxy.url if world.proxy
                                      else world.kube.server.url)
        config.connection_pool_maxsize = len(NODES) + 4
        config.retries = 0
        api_client = client.ApiClient(config)
        self.addCleanup(api_client.close)
        api = client.CoreV1Api(api_client)
        base = self.useFixture(fixtures.TempDir()).path
        kubelets = {}
        for name in NODES:
            directory = os.path.join(base, name)
            os.mkdir(directory)
            kubelet = kubelet_fixture.KubeletStandIn(directory).start()
            self.addCleanup(kubelet.stop)
            plugin = deviceplugin.DevicePlugin(
                world.inventories[name], plugin_dir=directory,
                socket_name='amdgpu.sock', share_count=SLOTS,
                pod_source=podsource.KubernetesPodSource(name, api))
            plugin.start()
            self.addCleanup(plugin.stop)
            kubelets[name] = kubelet
        for kubelet in kubelets.values():
            kubelet.wait_for_devices(RESOURCE, count=8 * SLOTS, timeout=30)
        return kubelets

    def _schedule(self, world: cluster.Cluster, run: _Run,
                  pod: dict[str, Any], via: int, retrying: bool,
                  deadline: float) -> str | None:
        """Filter and bind ``pod`` as kube-scheduler does, through
        extender ``via``; :returns: the node it was bound to."""
        key = pod['metadata']['name']
        last = 'none'
        for attempt in range(20 if retrying else 5):
            if time.monotonic() > deadline:
                break
            if attempt:
                # kube-scheduler backs a failed pod off (1 s up to 10 s),
                # letting the watches catch up
                time.sleep(min(0.05 * 2 ** attempt, 2.0))
            answer = world.filter(pod, via=via)
            bound = re.search(r'already bound to node (\S+);',
                              answer['Error'])
            if retrying and bound:
                # an earlier bind went through, its answer lost
                run.add(run.bound_to[key], bound.group(1))
                return bound.group(1)
            if answer['Error'] and not retrying:
                run.add(run.errors, '%s filter: %s' % (key, answer['Error']))
                return None
            if answer['Error']:
                # kube-scheduler retries a failed filter
                last = '%s filter: %s' % (key, answer['Error'])
                run.add(run.retried, last)
                continue
            if not answer['NodeNames'] and any(
                    'allocation record' in reason
                    for reason in answer['FailedNodes'].values()):
                # the other extender won the record: kube-scheduler tries
                # the pod again
                last = '%s filter: %s' % (key, answer['FailedNodes'])
                run.add(run.retried, last)
                continue
            if not answer['NodeNames']:
                reasons = dict(answer['FailedNodes'])
                reasons.update(answer['FailedAndUnresolvableNodes'])
                with run.lock:
                    run.rejected[key] = reasons
                return None
            node = answer['NodeNames'][0]
            result = world.bind(pod, node, via=via)
            if not result['Error']:
                run.add(run.bound_to[key], node)
                return node
            # kube-scheduler retries a pod whose bind failed (for example
            # a node lock held too long): so do we
            last = '%s bind: %s' % (key, result['Error'])
            run.add(run.retried, last)
        run.add(run.errors, '%s: no attempt succeeded (last: %s)' % (key,
                                                                      last))
        return None

    def _admit(self, world: cluster.Cluster, run: _Run,
               kubelet: kubelet_fixture.KubeletStandIn, node: str, key: str,
               retrying: bool, deadline: float) -> None:
        """Kubelet's admission of the bound pod ``key``: Allocate for each
        container that asks for GPUs (retried with the same device IDs,
        as kubelet does, while the plugin fails)."""
        pod = world.read_pod('team', key)
        units = {u.rocr_id: u for u in world.units[node]}
        for number, container in enumerate(pod['spec']['containers']):
            wanted = int(container['resources']['limits'].get(RESOURCE, 0))
            if not wanted:
                continue
            response = None
            for attempt in range(20 if retrying else 1):
                try:
                    _ids, response = kubelet.admit(RESOURCE, wanted)
                    break
                except grpc.RpcError as err:
                    if attempt == (19 if retrying else 0) or \
                            time.monotonic() > deadline:
                        run.add(run.errors, '%s container %d: %s' % (
                            key, number, err))
                        return
                    time.sleep(min(0.05 * 2 ** attempt, 1.0))
            assert response is not None
            envs = dict(response.envs)
            gpus = [units[rocr] for rocr in
                    envs['ROCR_VISIBLE_DEVICES'].split(',')]
            if len(gpus) != wanted:
                run.add(run.errors, '%s container %d: %d GPUs for %d' % (
                    key, number, len(gpus), wanted))
            masks = cumask.parse_hsa_cu_mask(envs['HSA_CU_MASK']).as_dict() \
                if 'HSA_CU_MASK' in envs else {}
            for local, unit in enumerate(gpus):
                limit = envs.get('%s_%d' % (hami.ENV_HIP_DEVICE_MEMORY_LIMIT,
                                            local))
                mib = int(limit.rstrip('m')) if limit else unit.vram_mib
                mask = masks.get(local, (1 << unit.compute_units) - 1)
                run.add(run.got[(node, unit.uuid)], (key, mask, mib))

    # -- the invariants ----------------------------------------------------

    def _check_answers(self, run: _Run, count: int,
                       faults: dict[str, Any] | None) -> None:
        """Every pod bound once or rejected for every node, with reasons;
        retries are rare and only for held node locks or records booked
        by the other extender (and, with faults, failed API requests)."""
        if faults is None:
            self.assertLess(len(run.retried), count // 20, run.retried[:5])
        for message in run.retried:
            self.assertTrue('hami.io/mutex.lock not acquired' in message or
                            'allocation record' in message or
                            faults is not None and 'Kubernetes request'
                            in message, message)
        self.assertEqual(count, len(run.bound_to) + len(run.rejected))
        self.assertFalse(set(run.bound_to) & set(run.rejected))
        self.assertEqual([], [k for k, v in run.bound_to.items()
                              if len(v) != 1])
        for key, reasons in run.rejected.items():
            self.assertEqual(set(NODES), set(reasons), key)
            self.assertTrue(all(reasons.values()), key)
        self.assertGreater(len(run.bound_to), count // 4)

    def _check_containers(self, world: cluster.Cluster, run: _Run) -> None:
        """No CU given twice, no memory over-committed (from the
        containers' env); the API binds exactly the pods bound, and their
        annotations (the mirror) agree on the slots, CUs and memory."""
        for (node, uuid), held in run.got.items():
            unit = {u.uuid: u for u in world.units[node]}[uuid]
            seen = 0
            for key, mask, _mib in held:
                self.assertFalse(seen & mask, '%s on %s/%s' % (key, node,
                                                             uuid))
                seen |= mask
            self.assertLessEqual(sum(mib for _k, _m, mib in held),
                                 unit.vram_mib, '%s/%s' % (node, uuid))
            self.assertLessEqual(len(held), SLOTS, '%s/%s' % (node, uuid))
        used: dict[tuple[str, str], list[int]] = collections.defaultdict(
            lambda: [0, 0, 0])
        for number in range(len(run.bound_to) + len(run.rejected)):
            key = 'p%04d' % number
            pod = world.read_pod('team', key)
            node = pod['spec'].get('nodeName')
            self.assertEqual(run.bound_to.get(key, [None])[0], node, key)
            if node is None:
                continue
            annotations = pod['metadata']['annotations']
            self.assertEqual('success', annotations[hami.BIND_PHASE], key)
            for container in hami.decode_pod_devices(
                    annotations[hami.DEVICES_ALLOCATED]):
                for device in container:
                    total = used[(node, device.uuid)]
                    total[0] += 1
                    total[1] += device.usedcores
                    total[2] += device.usedmem
        for (node, uuid), (slots, cores, mem) in used.items():
            unit = {u.uuid: u for u in world.units[node]}[uuid]
            self.assertLessEqual(slots, SLOTS)
            self.assertLessEqual(cores, unit.compute_units)
            self.assertLessEqual(mem, unit.vram_mib)

    def _check_records(self, world: cluster.Cluster, run: _Run,
                       faults: dict[str, Any] | None) -> None:
        """Nothing over-committed in the records; each bound pod booked
        once, on its node, with exactly the CUs its containers got."""
        store = recordstore.RecordStore(world.api)
        if faults is not None:
            # a booking whose removal failed (the API lost it) is left on
            # a node the pod is not bound to until the record sweep
            run.swept = recordgc.Collector(store, world.api).sweep()
        booked: dict[str, str] = {}
        for name in NODES:
            record = store.read(name)[0]
            allocrecord.check(record, sharedalloc.capacity(
                world.units[name], SLOTS))
            for grants in record.pods.values():
                self.assertNotIn(grants.name, booked)
                booked[grants.name] = name
                for gpu, mask in grants.masks().items():
                    held = 0
                    for key, got, _mib in run.got[(name, gpu)]:
                        if key == grants.name:
                            held |= got
                    self.assertEqual(mask, held, grants.name)
        self.assertEqual({k: v[0] for k, v in run.bound_to.items()}, booked)

    def _check_locks(self, world: cluster.Cluster,
                     faults: dict[str, Any] | None) -> None:
        """Every node lock released (through faults: a release whose
        answer was lost leaves a lock that is stale, its pod allocated)."""
        locker = nodelock.NodeLocker(world.api)
        for name in NODES:
            node = world.kube.server.get_object('nodes', name)
            value = node['metadata'].get('annotations', {}).get(
                hami.NODE_LOCK)
            if faults is None or value is None:
                self.assertIsNone(value, name)
            else:
                self.assertIsNone(locker.holder(
                    value, datetime.datetime.now(datetime.UTC), name), name)
