"""The API server stand-in, driven by the real kubernetes client and kubectl.

The stand-in replaces a kube-apiserver, which cannot run here; these tests
pin the behaviours the rest of the functional suite relies on.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse

import testtools
from kubernetes import client
from kubernetes import watch
from kubernetes.client import exceptions

from tests.functional.fixtures import kubeclient


def _pod(name: str, node: str | None = None, ns: str = 'default',
         labels: dict[str, str] | None = None,
         scheduler: str | None = None) -> client.V1Pod:
    spec = client.V1PodSpec(containers=[client.V1Container(
        name='main', image='busybox',
        env=[client.V1EnvVar(name='A', value='1')])], node_name=node,
        scheduler_name=scheduler)
    return client.V1Pod(metadata=client.V1ObjectMeta(
        name=name, namespace=ns, labels=labels), spec=spec)


def _node(name: str, labels: dict[str, str] | None = None) -> client.V1Node:
    return client.V1Node(metadata=client.V1ObjectMeta(name=name,
                                                      labels=labels))


class ApiServerTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture(history=50))
        self.api = self.kube.api

    def test_create_get_and_resource_versions_increase(self) -> None:
        first = self.api.create_node(_node('n1'))
        second = self.api.create_node(_node('n2'))
        self.assertLess(int(first.metadata.resource_version),
                        int(second.metadata.resource_version))
        got = self.api.read_node('n1')
        self.assertEqual(first.metadata.uid, got.metadata.uid)
        pods = self.api.list_namespaced_pod('default')
        self.assertGreaterEqual(int(pods.metadata.resource_version),
                                int(second.metadata.resource_version))

    def test_not_found_and_already_exists(self) -> None:
        self.assertRaises(exceptions.NotFoundException,
                          self.api.read_node, 'nope')
        self.api.create_node(_node('n1'))
        err = self.assertRaises(exceptions.ConflictException,
                                self.api.create_node, _node('n1'))
        self.assertEqual('AlreadyExists', json.loads(err.body)['reason'])

    def test_pod_defaults(self) -> None:
        pod = self.api.create_namespaced_pod('default', _pod('p'))
        self.assertEqual('default-scheduler', pod.spec.scheduler_name)
        self.assertEqual('Pending', pod.status.phase)

    def test_stale_resource_version_in_put_is_409(self) -> None:
        node = self.api.create_node(_node('n1'))
        node.metadata.labels = {'a': 'b'}
        fresh = self.api.replace_node('n1', node)
        self.assertNotEqual(node.metadata.resource_version,
                            fresh.metadata.resource_version)
        node.metadata.labels = {'a': 'c'}
        err = self.assertRaises(exceptions.ConflictException,
                                self.api.replace_node, 'n1', node)
        status = json.loads(err.body)
        self.assertEqual(('Status', 'Conflict', 409),
                         (status['kind'], status['reason'], status['code']))

    def test_stale_resource_version_in_merge_patch_is_409(self) -> None:
        node = self.api.create_node(_node('n1'))
        old_rv = node.metadata.resource_version
        patch = {'metadata': {'resourceVersion': old_rv,
                              'annotations': {'k': 'v1'}}}
        done = self.api.patch_node(
            'n1', patch, _content_type='application/merge-patch+json')
        self.assertEqual('v1', done.metadata.annotations['k'])
        patch['metadata']['annotations'] = {'k': 'v2'}
        self.assertRaises(
            exceptions.ConflictException, self.api.patch_node, 'n1', patch,
            _content_type='application/merge-patch+json')
        self.assertEqual('v1', self.api.read_node(
            'n1').metadata.annotations['k'])

    def test_merge_patch_deletes_with_null(self) -> None:
        self.api.create_node(_node('n1', labels={'a': '1', 'b': '2'}))
        done = self.api.patch_node(
            'n1', {'metadata': {'labels': {'a': None}}},
            _content_type='application/merge-patch+json')
        self.assertEqual({'b': '2'}, done.metadata.labels)

    def test_json_patch(self) -> None:
        self.api.create_namespaced_pod('default', _pod('p'))
        done = self.api.patch_namespaced_pod('p', 'default', [
            {'op': 'add', 'path': '/metadata/annotations', 'value': {}},
            {'op': 'add', 'path': '/metadata/annotations/hami.io~1x',
             'value': 'y'},
            {'op': 'add', 'path': '/spec/containers/0/env/-',
             'value': {'name': 'B', 'value': '2'}}])
        self.assertEqual({'hami.io/x': 'y'}, done.metadata.annotations)
        self.assertEqual(['A', 'B'],
                         [e.name for e in done.spec.containers[0].env])
        self.assertRaises(
            exceptions.UnprocessableEntityException,
            self.api.patch_namespaced_pod, 'p', 'default',
            [{'op': 'test', 'path': '/metadata/name', 'value': 'q'}])

    def test_strategic_merge_patch_merges_by_name(self) -> None:
        self.api.create_namespaced_pod('default', _pod('p'))
        done = self.api.patch_namespaced_pod('p', 'default', {'spec': {
            'containers': [{'name': 'main', 'env': [
                {'name': 'A', 'value': 'changed'},
                {'name': 'C', 'value': '3'}]}]}})
        container = done.spec.containers[0]
        self.assertEqual('busybox', container.image)
        self.assertEqual([('A', 'changed'), ('C', '3')],
                         [(e.name, e.value) for e in container.env])

    def test_status_subresource(self) -> None:
        self.api.create_namespaced_pod('default', _pod('p'))
        done = self.api.patch_namespaced_pod_status(
            'p', 'default', {'status': {'phase': 'Running'},
                             'metadata': {'labels': {'ignored': 'x'}}})
        self.assertEqual('Running', done.status.phase)
        self.assertIsNone(done.metadata.labels)
        # the main resource does not change status
        done = self.api.patch_namespaced_pod(
            'p', 'default', {'status': {'phase': 'Failed'}})
        self.assertEqual('Running', done.status.phase)
        self.api.create_node(_node('n1'))
        node = self.api.patch_node_status('n1', {'status': {
            'capacity': {'amd.com/gpu': '8'}}})
        self.assertEqual('8', node.status.capacity['amd.com/gpu'])

    def test_binding_and_second_binding_conflicts(self) -> None:
        self.api.create_namespaced_pod('default', _pod('p'))
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name='p'),
            target=client.V1ObjectReference(kind='Node', name='n1'))
        self.api.create_namespaced_pod_binding(
            'p', 'default', binding, _preload_content=False)
        self.assertEqual('n1', self.api.read_namespaced_pod(
            'p', 'default').spec.node_name)
        err = self.assertRaises(
            exceptions.ConflictException,
            self.api.create_namespaced_pod_binding, 'p', 'default', binding,
            _preload_content=False)
        self.assertIn('already assigned', json.loads(err.body)['message'])

    def test_field_selectors(self) -> None:
        self.api.create_namespaced_pod('default', _pod('a', node='n1'))
        self.api.create_namespaced_pod('default', _pod('b', node='n2'))
        self.api.create_namespaced_pod('other', _pod(
            'c', node='n1', ns='other', scheduler='amdgpu-virt'))
        names = self._names(self.api.list_pod_for_all_namespaces(
            field_selector='spec.nodeName=n1'))
        self.assertEqual(['a', 'c'], names)
        self.assertEqual(['c'], self._names(
            self.api.list_pod_for_all_namespaces(
                field_selector='spec.schedulerName=amdgpu-virt')))
        self.assertEqual(['b'], self._names(self.api.list_namespaced_pod(
            'default', field_selector='spec.nodeName!=n1')))
        self.assertEqual(['a'], self._names(self.api.list_namespaced_pod(
            'default', field_selector='metadata.name=a,'
            'status.phase=Pending')))
        self.assertRaises(exceptions.BadRequestException,
                          self.api.list_namespaced_pod, 'default',
                          field_selector='spec.bogus=x')

    def test_label_selectors(self) -> None:
        self.api.create_node(_node('a', labels={'gpu': 'amd', 'zone': 'z1'}))
        self.api.create_node(_node('b', labels={'gpu': 'nvidia'}))
        self.api.create_node(_node('c'))
        cases = {'gpu=amd': ['a'], 'gpu!=amd': ['b', 'c'], 'gpu': ['a', 'b'],
                 '!gpu': ['c'], 'gpu in (amd, nvidia),zone': ['a'],
                 'gpu notin (amd)': ['b', 'c']}
        for selector, expected in cases.items():
            self.assertEqual(expected, self._names(
                self.api.list_node(label_selector=selector)), selector)

    def test_limit_and_continue(self) -> None:
        for n in range(5):
            self.api.create_node(_node('n%d' % n))
        seen: list[str] = []
        token = None
        pages = 0
        while True:
            page = self.api.list_node(limit=2, _continue=token)
            seen.extend(self._names(page))
            pages += 1
            token = page.metadata._continue
            if not token:
                break
        self.assertEqual(['n0', 'n1', 'n2', 'n3', 'n4'], seen)
        self.assertEqual(3, pages)
        first = self.api.list_node(limit=2)
        self.assertEqual(3, first.metadata.remaining_item_count)
        self.api.create_node(_node('later'))
        self.kube.server.store.compact()
        err = self.assertRaises(exceptions.ApiException, self.api.list_node,
                                limit=2, _continue=first.metadata._continue)
        self.assertEqual(410, err.status)

    def test_watch_from_resource_version(self) -> None:
        start = self.api.list_namespaced_pod('default').metadata
        self.api.create_namespaced_pod('default', _pod('p'))
        self.api.patch_namespaced_pod('p', 'default',
                                      {'metadata': {'labels': {'x': 'y'}}})
        self.api.delete_namespaced_pod('p', 'default')
        events = [(e['type'], e['object'].metadata.name) for e in
                  watch.Watch().stream(
                      self.api.list_namespaced_pod, 'default',
                      resource_version=start.resource_version,
                      timeout_seconds=1)]
        self.assertEqual([('ADDED', 'p'), ('MODIFIED', 'p'),
                          ('DELETED', 'p')], events)

    def test_watch_without_version_lists_then_streams(self) -> None:
        self.api.create_node(_node('old'))
        seen: list[tuple[str, str]] = []
        listed = threading.Event()
        watcher = watch.Watch()

        def consume() -> None:
            for event in watcher.stream(self.api.list_node,
                                        timeout_seconds=5):
                seen.append((event['type'], event['object'].metadata.name))
                listed.set()
                if len(seen) == 2:
                    watcher.stop()

        thread = threading.Thread(target=consume)
        thread.start()
        # create only once the synthetic ADDED of what exists has arrived
        self.assertTrue(listed.wait(10))
        self.api.create_node(_node('new'))
        thread.join(10)
        self.assertFalse(thread.is_alive())
        self.assertEqual([('ADDED', 'old'), ('ADDED', 'new')], seen)

    def test_watch_field_selector_sees_binding_as_added(self) -> None:
        start = self.api.create_namespaced_pod('default', _pod('p'))
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name='p'),
            target=client.V1ObjectReference(kind='Node', name='n1'))
        self.api.create_namespaced_pod_binding('p', 'default', binding,
                                               _preload_content=False)
        events = [e['type'] for e in watch.Watch().stream(
            self.api.list_pod_for_all_namespaces,
            field_selector='spec.nodeName=n1',
            resource_version=start.metadata.resource_version,
            timeout_seconds=1)]
        self.assertEqual(['ADDED'], events)

    def test_watch_expired_version_is_410(self) -> None:
        node = self.api.create_node(_node('n1'))
        self.api.create_node(_node('n2'))
        self.kube.server.store.compact()
        err = self.assertRaises(
            exceptions.ApiException, list, watch.Watch().stream(
                self.api.list_node,
                resource_version=node.metadata.resource_version,
                timeout_seconds=1))
        self.assertEqual(410, err.status)

    def test_history_window_compacts(self) -> None:
        first = self.api.create_node(_node('n0'))
        for n in range(1, 60):
            self.api.create_node(_node('n%d' % n))
        self.assertGreater(self.kube.server.store.compacted_rv,
                           int(first.metadata.resource_version))

    def test_events_configmaps_leases(self) -> None:
        self.api.create_namespaced_event('default', client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name='p.'),
            involved_object=client.V1ObjectReference(kind='Pod', name='p'),
            reason='Allocated', message='ok', type='Normal'))
        events = self.api.list_namespaced_event('default').items
        self.assertEqual(['Allocated'], [e.reason for e in events])
        self.assertTrue(events[0].metadata.name.startswith('p.'))
        self.api.create_namespaced_config_map(
            'kube-system', client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name='cfg'), data={'a': 'b'}))
        self.assertEqual({'a': 'b'}, self.api.read_namespaced_config_map(
            'cfg', 'kube-system').data)
        lease = self.kube.coordination.create_namespaced_lease(
            'kube-system', client.V1Lease(
                metadata=client.V1ObjectMeta(name='leader'),
                spec=client.V1LeaseSpec(holder_identity='a')))
        lease.spec.holder_identity = 'b'
        self.kube.coordination.replace_namespaced_lease(
            'leader', 'kube-system', lease)
        lease.spec.holder_identity = 'c'
        self.assertRaises(exceptions.ConflictException,
                          self.kube.coordination.replace_namespaced_lease,
                          'leader', 'kube-system', lease)

    @staticmethod
    def _names(items: object) -> list[str]:
        return sorted(i.metadata.name for i in items.items)  # type: ignore


@unittest.skipIf(shutil.which('kubectl') is None, 'kubectl not installed')
class KeepAliveTest(testtools.TestCase):
    """The stand-in answers a kept-alive connection as Go's net/http does:
    TCP_NODELAY, and each answer in one write. Without either, a client's
    delayed ACK held every answer's second segment (its body) for about
    40 ms: 100 requests took 4.6 s."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.kube.api.create_namespace({'metadata': {'name': 'ns'}})
        self.kube.api.create_namespaced_config_map(
            'ns', {'metadata': {'name': 'c'}, 'data': {'a': '0'}})
        url = urllib.parse.urlsplit(self.kube.server.url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port)
        self.addCleanup(self.conn.close)

    def _request(self, method: str, body: bytes | None = None) -> bytes:
        headers = {'Content-Type': 'application/merge-patch+json'} \
            if body else {}
        self.conn.request(method, '/api/v1/namespaces/ns/configmaps/c',
                          body, headers)
        response = self.conn.getresponse()
        data = response.read()
        self.assertEqual(200, response.status, data)
        return data

    def test_100_kept_alive_requests_take_well_under_a_second(self) -> None:
        self._request('GET')
        sock = self.conn.sock
        # the client side as the kubernetes client's urllib3 leaves it:
        # delayed ACKs on (quick ACK off where the platform has it)
        if hasattr(socket, 'TCP_QUICKACK'):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
        started = time.perf_counter()
        for number in range(50):
            self._request('GET')
            self._request('PATCH', json.dumps(
                {'data': {'a': str(number)}}).encode())
        elapsed = time.perf_counter() - started
        self.assertIs(sock, self.conn.sock, 'the connection was not kept')
        self.assertLess(elapsed, 1.0)
        self.assertEqual({'a': '49'}, json.loads(self._request('GET'))[
            'data'])

    def test_answers_are_sent_in_one_write(self) -> None:
        self._request('GET')
        peer = self.conn.sock
        # read what arrived right after the first byte: a lone header
        # segment would leave the body behind
        peer.setblocking(True)
        self.conn.request('GET', '/api/v1/namespaces/ns/configmaps/c')
        first = peer.recv(65536, socket.MSG_PEEK)
        self.assertIn(b'\r\n\r\n{', first)
        self.conn.getresponse().read()


class KubectlTest(testtools.TestCase):
    """kubectl, an independent client, against the stand-in."""

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.kubeconfig = self.kube.write_kubeconfig(self.tmp)

    def kubectl(self, *args: str) -> str:
        env = dict(os.environ, HOME=self.tmp, KUBECONFIG=self.kubeconfig)
        done = subprocess.run(
            ['kubectl', '--cache-dir', os.path.join(self.tmp, 'cache'),
             *args], capture_output=True, text=True, env=env, timeout=60,
            check=False)
        self.assertEqual(0, done.returncode, done.stderr)
        return done.stdout

    def test_get_annotate_patch(self) -> None:
        self.kube.api.create_node(_node('n1', labels={'gpu': 'amd'}))
        self.kube.api.create_namespaced_pod('default', _pod('p'))
        nodes = json.loads(self.kubectl('get', 'nodes', '-o', 'json'))
        self.assertEqual(['n1'], [n['metadata']['name']
                                  for n in nodes['items']])
        self.kubectl('annotate', 'node', 'n1', 'hami.io/mutex.lock=x')
        self.assertEqual('x', self.kube.api.read_node(
            'n1').metadata.annotations['hami.io/mutex.lock'])
        self.kubectl('patch', 'pod', 'p', '--type', 'merge', '-p',
                     '{"metadata":{"labels":{"a":"b"}}}')
        self.assertEqual({'a': 'b'}, self.kube.api.read_namespaced_pod(
            'p', 'default').metadata.labels)
        self.kubectl('patch', 'pod', 'p', '-p', json.dumps({'spec': {
            'containers': [{'name': 'main', 'image': 'alpine'}]}}))
        pod = self.kube.api.read_namespaced_pod('p', 'default')
        self.assertEqual('alpine', pod.spec.containers[0].image)
        self.assertEqual('A', pod.spec.containers[0].env[0].name)
        out = self.kubectl('get', 'pods', '--field-selector',
                           'status.phase=Pending', '-l', 'a=b', '-o',
                           'jsonpath={.items[*].metadata.name}')
        self.assertEqual('p', out.strip())
        self.kubectl('delete', 'pod', 'p', '--wait=false')
        self.assertIsNone(self.kube.server.get_object('pods', 'p',
                                                      'default'))
