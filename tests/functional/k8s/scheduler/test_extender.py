"""The extender service over HTTP against the API server stand-in."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.record import nodelock
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient
from tests.functional.k8s import cluster

NODES = ('n1', 'n2')


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class ExtenderServiceTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(NODES, gpus=2))
        self.server = self.cluster.kube.server
        self.cache = self.cluster.service.cache

    def _wait(self, predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 10
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError('timed out waiting for %s' % what)
            time.sleep(0.02)

    def _annotate_node(self, name: str, annotations: dict[str, Any]) -> None:
        self.cluster.api.patch_node(name, {'metadata': {
            'annotations': annotations}},
            _content_type='application/merge-patch+json')

    def _pod(self, name: str, **limits: str) -> dict[str, Any]:
        return self.cluster.create(cluster.gpu_pod(name, [
            limits or {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
                       'amd.com/gpumem': '1024'}]))

    # -- HTTP ------------------------------------------------------------

    def test_health_ready_and_metrics(self) -> None:
        http = self.cluster.http
        self.assertEqual(200, http.request('GET', '/healthz')[0])
        self.assertEqual(200, http.request('GET', '/readyz')[0])
        self.assertEqual(404, http.request('GET', '/nothing')[0])
        self.cluster.filter(self._pod('m'))
        status, body = http.request('GET', '/metrics')
        self.assertEqual(200, status)
        text = body.decode()
        self.assertIn('amdgpu_virt_extender_filter_seconds_count 1.0', text)
        self.assertIn('amdgpu_virt_extender_decisions_total{result="fit",'
                      'verb="filter"} 1.0', text)
        self.assertIn('amdgpu_virt_extender_cache_nodes 2.0', text)
        self.assertIn('amdgpu_virt_extender_bind_seconds_bucket', text)

    def test_bad_requests_get_errors(self) -> None:
        http = self.cluster.http
        status, body = http.request('POST', '/filter', None)
        self.assertEqual(200, status)
        self.assertIn('(body)', json.loads(body)['Error'])
        answer = http.post('/filter', {'NodeNames': ['n1']})
        self.assertIn('Pod', answer['Error'])
        pod = cluster.gpu_pod('x', [{'amd.com/gpucores': 'lots'}])
        answer = self.cluster.filter(pod)
        self.assertIn("resources.limits[amd.com/gpucores]", answer['Error'])
        self.assertIsNone(answer['NodeNames'])
        answer = http.post('/bind', {'PodName': 'x'})
        self.assertIn('PodNamespace', answer['Error'])
        status, _body = http.request('POST', '/prioritize', [])
        self.assertEqual(400, status)
        status, _body = http.request('POST', '/nothing', {})
        self.assertEqual(404, status)

    def test_a_pod_the_api_does_not_have_is_refused(self) -> None:
        # the request's pod is not trusted: the extender reads it
        pod = cluster.gpu_pod('ghost', [{'amd.com/gpu': '1'}])
        answer = self.cluster.filter(pod)
        self.assertIn('GET pod team/ghost', answer['Error'])
        self.assertEqual(0, self.cache.reservation_count())
        self.assertIsNone(self.cache.placement('team/ghost'))

    def test_nodes_instead_of_node_names(self) -> None:
        pod = self._pod('p')
        nodes = {'items': [{'metadata': {'name': n}} for n in NODES]}
        answer = self.cluster.http.post('/filter', {
            'Pod': pod, 'Nodes': nodes, 'NodeNames': None})
        self.assertEqual('', answer['Error'])
        self.assertIsNone(answer['NodeNames'])
        self.assertEqual(1, len(answer['Nodes']['items']))

    def test_prioritize(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        scores = self.cluster.http.post('/prioritize', {
            'Pod': pod, 'NodeNames': list(NODES)})
        self.assertEqual({n: 10 if n == node else 0 for n in NODES},
                         {s['Host']: s['Score'] for s in scores})

    # -- bad annotations written by someone else ---------------------------

    def test_malformed_annotations_are_skipped_not_fatal(self) -> None:
        good = hami.decode_node_register(self.server.get_object(
            'nodes', 'n2')['metadata']['annotations'][hami.NODE_REGISTER])
        entries = [hami.device_to_json(d) for d in good]
        entries[0]['devcore'] = 'many'
        self._annotate_node('n2', {hami.NODE_REGISTER: json.dumps(entries)})
        self._annotate_node('n1', {hami.NODE_REGISTER: '{not json'})
        self._wait(lambda: self.cache.view('n1').problem and len(
            self.cache.view('n2').gpus) == 1, 'the bad registrations')
        answer = self.cluster.filter(self._pod('a'))
        self.assertEqual(['n2'], answer['NodeNames'])
        self.assertIn('unreadable hami.io/node-amd-register',
                      answer['FailedNodes']['n1'])
        chosen = hami.decode_pod_devices(self.cluster.read_pod(
            'team', 'a')['metadata']['annotations'][hami.DEVICES_ALLOCATED])
        self.assertEqual(good[1].id, chosen[0][0].uuid)

        # a pod with an unreadable allocation closes its node
        bad = cluster.gpu_pod('bad', [{'amd.com/gpu': '1'}])
        bad['metadata']['annotations'] = {
            hami.DEVICES_ALLOCATED: 'no-separator:;',
            hami.VGPU_NODE: 'n2'}
        self.server.put_object('pods', bad)
        self._wait(lambda: self.cache.view('n2').problem,
                   'the bad pod')
        answer = self.cluster.filter(self._pod('b'))
        self.assertEqual([], answer['NodeNames'])
        self.assertIn('pod team/bad carries an unreadable annotation',
                      answer['FailedNodes']['n2'])
        self.assertIn('missing the "," field separator',
                      answer['FailedNodes']['n2'])
        self.assertEqual(200, self.cluster.http.request('GET',
                                                        '/healthz')[0])
        # once the bad pod is gone, the node takes pods again
        self.cluster.api.delete_namespaced_pod('bad', 'team')
        self._wait(lambda: not self.cache.view('n2').problem,
                   'the bad pod to go')
        self.assertEqual(['n2'], self.cluster.filter(
            self._pod('c'))['NodeNames'])

    # -- bind and the node lock ----------------------------------------------

    def _bind_elsewhere(self, name: str, node: str) -> None:
        self.cluster.api.create_namespaced_pod_binding(
            name, 'team', {'apiVersion': 'v1', 'kind': 'Binding',
                           'metadata': {'name': name},
                           'target': {'kind': 'Node', 'name': node}},
            _preload_content=False)

    def test_bind_failure_releases_the_lock(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        # someone else binds it to another node: the binding answers 409
        self._bind_elsewhere('p', next(n for n in NODES if n != node))
        answer = self.cluster.bind(pod, node)
        self.assertIn('already bound to node', answer['Error'])
        self.assertNotIn(hami.NODE_LOCK, self.server.get_object(
            'nodes', node)['metadata'].get('annotations', {}))
        # bound elsewhere: not ours to mark failed
        self.assertNotIn(hami.BIND_PHASE, self.cluster.read_pod(
            'team', 'p')['metadata']['annotations'])

    def test_bind_again_after_it_went_through(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))
        before = self.cluster.read_pod('team', 'p')
        # a retry (kube-scheduler after a timeout) changes nothing
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))
        self.assertEqual(before, self.cluster.read_pod('team', 'p'))
        self.assertTrue(hami.decode_node_lock(self.server.get_object(
            'nodes', node)['metadata']['annotations'][hami.NODE_LOCK])
            .held_by('team', 'p'))

    def test_bind_refuses_another_node_and_a_new_uid(self) -> None:
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        other = next(n for n in NODES if n != node)
        self.assertIn('does not place pod team/p',
                      self.cluster.bind(pod, other)['Error'])
        stale = dict(pod, metadata=dict(pod['metadata'], uid='old'))
        self.assertIn('PodUID', self.cluster.bind(stale, node)['Error'])
        self.assertNotIn(hami.NODE_LOCK, self.server.get_object(
            'nodes', node)['metadata'].get('annotations', {}))

    def test_bind_waits_for_a_held_lock_and_gives_up(self) -> None:
        holder = self._pod('holder')
        pod = self._pod('p')
        node = self.cluster.filter(pod)['NodeNames'][0]
        value = hami.encode_node_lock(hami.NodeLock(_now(), 'team',
                                                    'holder'))
        self._annotate_node(node, {hami.NODE_LOCK: value})
        self.cluster.service.extender.locker.wait = 0.2
        answer = self.cluster.bind(pod, node)
        self.assertIn('held by team/holder', answer['Error'])
        self.assertEqual(value, self.server.get_object('nodes', node)[
            'metadata']['annotations'][hami.NODE_LOCK])
        self.assertIsNone(self.server.get_object('pods', 'p', 'team')[
            'spec'].get('nodeName'))
        # the holder finishes: its lock is stale and the bind goes through
        self.server.store.objects[('pods', 'team', 'holder')]['status'][
            'phase'] = 'Succeeded'
        del holder
        self.assertEqual({'Error': ''}, self.cluster.bind(pod, node))
        lock = hami.decode_node_lock(self.server.get_object(
            'nodes', node)['metadata']['annotations'][hami.NODE_LOCK])
        self.assertTrue(lock.held_by('team', 'p'))


class NodeLockerTest(testtools.TestCase):
    """Lock rules against the API server stand-in."""

    def setUp(self) -> None:
        super().setUp()
        self.cluster = self.useFixture(cluster.Cluster(('n1',), gpus=1))
        self.server = self.cluster.kube.server
        for name in ('live', 'p'):
            self.cluster.create(cluster.gpu_pod(name, [{
                'amd.com/gpu': '1'}]))
        self.locker = nodelock.NodeLocker(self.cluster.api, wait=0.1)

    def _lock(self) -> str | None:
        annotations = self.server.get_object('nodes', 'n1')['metadata'].get(
            'annotations', {})
        value: str | None = annotations.get(hami.NODE_LOCK)
        return value

    def _set(self, value: str) -> None:
        self.cluster.api.patch_node('n1', {'metadata': {'annotations': {
            hami.NODE_LOCK: value}}},
            _content_type='application/merge-patch+json')

    def test_free_node(self) -> None:
        self.locker.acquire('n1', 'team', 'p')
        self.assertTrue(hami.decode_node_lock(self._lock() or '').held_by(
            'team', 'p'))
        self.assertFalse(self.locker.release('n1', 'team', 'other'))
        self.assertTrue(self.locker.release('n1', 'team', 'p'))
        self.assertIsNone(self._lock())
        self.assertFalse(self.locker.release('n1', 'team', 'p'))

    def test_held_by_a_live_pod_or_the_same_pod(self) -> None:
        for owner in ('live', 'p'):
            self._set(hami.encode_node_lock(hami.NodeLock(
                _now(), 'team', owner)))
            err = self.assertRaises(exception.NodeLockError,
                                    self.locker.acquire, 'n1', 'team', 'p')
            self.assertIn('held by team/%s' % owner, str(err))

    def test_unreadable_lock_is_refused(self) -> None:
        self._set('garbage,,')
        err = self.assertRaises(exception.NodeLockError, self.locker.acquire,
                                'n1', 'team', 'p')
        self.assertIn("unreadable lock (Invalid hami.io/mutex.lock value "
                      "'garbage,,'", str(err))
        self.assertIn('Node n1', str(err))
        self.assertEqual('garbage,,', self._lock())

    def test_stale_locks_are_taken_over(self) -> None:
        old = _now() - datetime.timedelta(minutes=6)
        for value in (
                hami.encode_node_lock(hami.NodeLock(old, 'team', 'live')),
                hami.format_rfc3339(old),
                hami.encode_node_lock(hami.NodeLock(old, 'team', 'gone'))):
            self._set(value)
            self.locker.acquire('n1', 'team', 'p', 'uid-p')
            self.assertTrue(hami.decode_node_lock(
                self._lock() or '').held_by('team', 'p'), value)
            self.assertEqual('uid-p', nodelock.lock_uid(self.server.get_object(
                'nodes', 'n1')['metadata']['annotations']))

    def test_the_lock_of_a_gone_pod_is_kept_until_it_expires(self) -> None:
        # the pod may have been bound: its late Allocate must find the
        # lock naming it, so that the device plugin refuses it instead of
        # serving it the next pod's allocation
        locker = nodelock.NodeLocker(self.cluster.api, wait=0.1, grace=0.01)
        live = self.server.get_object('pods', 'live', 'team')
        when = _now() - datetime.timedelta(seconds=10)

        def lock(holder: str, uid: str | None,
                 paired: bool = True) -> None:
            value = hami.encode_node_lock(hami.NodeLock(when, 'team',
                                                        holder))
            self.cluster.api.patch_node('n1', {'metadata': {'annotations': {
                hami.NODE_LOCK: value, nodelock.LOCK_UID:
                nodelock.encode_lock_uid(uid, value if paired else 'other')
                if uid else None}}},
                _content_type='application/merge-patch+json')

        for holder, uid in (('gone', 'uid-gone'),
                            # deleted and created again with the same name
                            ('live', 'uid-of-the-old-live')):
            lock(holder, uid)
            err = self.assertRaises(exception.NodeLockError, locker.acquire,
                                    'n1', 'team', 'p', 'uid-p')
            self.assertIn('held by team/%s' % holder, str(err))
        # the lock with the live pod's own UID, unbound: stale after the
        # grace (a failed bind whose release was lost); and so is one
        # whose UID was written for another lock value (another writer
        # took the lock over and wrote no UID): the name decides then
        for paired in (True, False):
            lock('live', live['metadata']['uid'] if paired
                 else 'uid-of-the-old-live', paired)
            locker.acquire('n1', 'team', 'p', 'uid-p')
            self.assertTrue(hami.decode_node_lock(
                self._lock() or '').held_by('team', 'p'))


class SchedulerCommandTest(testtools.TestCase):
    """``amdgpu-virt k8s scheduler`` as a process."""

    def test_serves_until_sigterm(self) -> None:
        kube = self.useFixture(kubeclient.ApiServerFixture())
        directory = self.useFixture(fixtures.TempDir()).path
        with socket.socket() as probe:
            probe.bind(('127.0.0.1', 0))
            port = probe.getsockname()[1]
        config = os.path.join(directory, 'amdgpu-virt.conf')
        with open(config, 'w') as stream:
            stream.write('[kubernetes]\nkubeconfig = %s\n\n[scheduler]\n'
                         'host = 127.0.0.1\nport = %d\nmetrics_port = 0\n'
                         % (kube.write_kubeconfig(directory), port))
        log = os.path.join(directory, 'log')
        with open(log, 'w') as output:
            process = subprocess.Popen(
                [sys.executable, '-m', 'amdgpu_virt.cmd.main',
                 '--config-file', config, 'k8s', 'scheduler'],
                stdout=output, stderr=subprocess.STDOUT)
        self.addCleanup(process.wait, 10)
        self.addCleanup(process.kill)
        http = cluster.HttpJson('127.0.0.1', port)
        self.addCleanup(http.close)
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.request('GET', '/readyz')[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                with open(log) as stream:
                    self.fail('not ready: %s' % stream.read())
            time.sleep(0.1)
        pod = cluster.gpu_pod('p', [{'amd.com/gpu': '1'}])
        pod['spec']['schedulerName'] = 'amdgpu-virt-scheduler'
        kube.api.create_namespace({'metadata': {'name': 'team'}})
        kube.server.put_object('pods', pod)
        answer = http.post('/filter', {'Pod': pod, 'NodeNames': ['nowhere']})
        self.assertIn('nowhere', answer['FailedAndUnresolvableNodes'])
        process.send_signal(signal.SIGTERM)
        self.assertEqual(0, process.wait(20))
