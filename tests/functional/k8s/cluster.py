"""A small cluster for end-to-end tests of the scheduling path.

The API server stand-in, nodes whose GPUs the node agent registers (from
simulated inventories), the scheduler extender service (watches, HTTP) and
the webhook, all on 127.0.0.1, reached with real clients over HTTP.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from typing import Any

import fixtures
import jsonpatch
from kubernetes import client

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt.inventory import simulate
from amdgpu_virt.k8s.admission import rules as admission
from amdgpu_virt.k8s.admission import webhook
from amdgpu_virt.k8s.admission import webhookapi
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.k8s.scheduler import service as extender
from amdgpu_virt.model import HostInventory
from amdgpu_virt.policy import engine as policy_engine
from tests.functional.fixtures import extenderproc
from tests.functional.fixtures import faultproxy
from tests.functional.fixtures import kubeclient


class HttpJson:
    """POST JSON and read JSON over one kept-alive connection per thread."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, 'conn', None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port,
                                              timeout=60)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str,
                body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers={
                    'Content-Type': 'application/json'})
                response = conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError('not reached')

    def post(self, path: str, body: Any) -> Any:
        status, data = self.request('POST', path, body)
        if status != 200:
            raise AssertionError('%s answered %d: %s' % (path, status, data))
        return json.loads(data)

    def close(self) -> None:
        conn = getattr(self._local, 'conn', None)
        if conn is not None:
            conn.close()


class Cluster(fixtures.Fixture):
    """Nodes registered by the agent, the extender and the webhook.

    :param nodes: node names.
    :param gpus: GPUs per node.
    :param overrides: ``{(group, option): value}`` for the extender.
    :param extenders: independent extender services (each with its own
        client and cache, as in processes of their own).
    :param faults: arguments of a :class:`~.faultproxy.FaultProxy` the
        extenders reach the API server through (``proxy``).
    :param processes: run each extender as an OS process of its own
        (``amdgpu-virt k8s scheduler``, see :mod:`.extenderproc`; listed
        in ``processes``, and ``services`` stays empty).
    """

    def __init__(self, nodes: tuple[str, ...], gpus: int = 2,
                 overrides: dict[tuple[str, str], Any] | None = None,
                 history: int = 100000, extenders: int = 1,
                 faults: dict[str, Any] | None = None,
                 processes: bool = False) -> None:
        super().__init__()
        self.node_names = nodes
        self.gpus = gpus
        self.overrides = overrides or {}
        self.history = history
        self.extenders = extenders
        self.faults = faults
        self.use_processes = processes

    def _setUp(self) -> None:
        self.kube = self.useFixture(kubeclient.ApiServerFixture(
            history=self.history))
        self.api = self.kube.api
        for namespace, labels in (('team', None), ('secure', {
                'amdgpu-virt.io/tenancy': 'isolated'})):
            self.api.create_namespace(client.V1Namespace(
                metadata=client.V1ObjectMeta(name=namespace,
                                             labels=labels)))
        self.inventories: dict[str, HostInventory] = {}
        self.units: dict[str, tuple[devices.GpuUnit, ...]] = {}
        for name in self.node_names:
            self.api.create_node(client.V1Node(
                metadata=client.V1ObjectMeta(name=name)))
            inventory = simulate.design_host(simulate.HostSpec(
                hostname=name, gpus=self.gpus))
            self.inventories[name] = inventory
            self.units[name] = devices.units_from_inventory(inventory)
            agent.NodeAgent(agent.KubernetesNodeStore(name, self.api),
                            self.units[name], 10).sync_once()
        conf = conf_pkg.new_conf()
        conf.set_override('port', 0, group='scheduler')
        conf.set_override('metrics_port', 0, group='scheduler')
        conf.set_override('watch_timeout', 30, group='scheduler')
        for (group, option), value in self.overrides.items():
            conf.set_override(option, value, group=group)
        self.services: list[extender.Service] = []
        self.processes: list[extenderproc.ExtenderProcess] = []
        self.https: list[HttpJson] = []
        self.proxy: faultproxy.FaultProxy | None = None
        url = self.kube.server.url
        if self.faults is not None:
            self.proxy = faultproxy.FaultProxy(url, **self.faults).start()
            self.addCleanup(self.proxy.stop)
            url = self.proxy.url
        if self.use_processes:
            directory = self.useFixture(fixtures.TempDir()).path
            # all started at once, then waited for
            self.processes = [self.useFixture(extenderproc.ExtenderProcess(
                url, directory, 'extender-%d' % number, self.overrides,
                wait=False)) for number in range(self.extenders)]
            for process in self.processes:
                self.https.append(HttpJson(*process.ready().address))
                self.addCleanup(self.https[-1].close)
        for _n in range(0 if self.use_processes else self.extenders):
            # each extender gets a client of its own, as in its own process
            config = client.Configuration(host=url)
            config.connection_pool_maxsize = 16
            if self.proxy is not None:
                config.retries = 0
            ext_client = client.ApiClient(config)
            self.addCleanup(ext_client.close)
            service = extender.Service(conf, client.CoreV1Api(ext_client))
            service.start()
            self.addCleanup(service.stop)
            host, port = service.address
            http = HttpJson(host, port)
            self.addCleanup(http.close)
            deadline = time.monotonic() + 20
            while http.request('GET', '/readyz')[0] != 200:
                if time.monotonic() > deadline:
                    raise AssertionError('extender cache never synced')
                time.sleep(0.02)
            self.services.append(service)
            self.https.append(http)
        self.service = self.services[0] if self.services else None
        self.http = self.https[0]
        models = webhookapi.ClusterModels(self.api)
        #: the webhook's decision Events (written by a thread of their
        #: own: ``flush`` before reading them)
        self.events = webhookapi.EventRecorder(self.api)
        self.webhook = webhook.make_server(
            webhook.WebhookPolicy(),
            namespace_labels=webhook.NamespaceLabelCache(self.api),
            intent=admission.IntentPolicy(
                policy_engine.Engine(conf), models, most=models.most),
            events=self.events)
        serve(self, self.webhook)
        whost, wport = self.webhook.server_address[:2]
        self.webhook_http = HttpJson(str(whost), int(wport))
        self.addCleanup(self.webhook_http.close)

    # -- the steps a pod goes through ------------------------------------

    def admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The webhook's review; :returns: the mutated pod.

        :raises AssertionError: the pod was denied (with the message).
        """
        answer = self.webhook_http.post('/webhook', {
            'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
            'request': {'uid': 'u-%s' % pod['metadata']['name'],
                        'kind': {'kind': 'Pod'}, 'operation': 'CREATE',
                        'namespace': pod['metadata']['namespace'],
                        'object': pod}})['response']
        if not answer['allowed']:
            raise AssertionError(answer['status']['message'])
        if answer.get('patch'):
            pod = jsonpatch.JsonPatch(json.loads(base64.b64decode(
                answer['patch']))).apply(pod)
        return pod

    def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Admit and create ``pod``; :returns: the stored pod."""
        pod = self.admit(pod)
        return self.kube.server.put_object('pods', pod)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        obj = self.kube.server.get_object('pods', name, namespace)
        assert obj is not None, '%s/%s is gone' % (namespace, name)
        return obj

    def filter(self, pod: dict[str, Any],
               nodes: tuple[str, ...] | None = None,
               via: int = 0) -> dict[str, Any]:
        """``/filter`` of extender number ``via``."""
        result: dict[str, Any] = self.https[via].post('/filter', {
            'Pod': pod, 'Nodes': None,
            'NodeNames': list(nodes or self.node_names)})
        return result

    def bind(self, pod: dict[str, Any], node: str,
             via: int = 0) -> dict[str, Any]:
        """``/bind`` of extender number ``via``."""
        meta = pod['metadata']
        result: dict[str, Any] = self.https[via].post('/bind', {
            'PodName': meta['name'], 'PodNamespace': meta['namespace'],
            'PodUID': meta['uid'], 'Node': node})
        return result


def book(api: Any, node: str, pod: Any, containers: Any,
         capacity: dict[str, allocrecord.Capacity],
         when: int | None = None) -> allocrecord.PodGrants:
    """Book ``containers`` (HAMi PodDevices) for ``pod`` (a dict or a
    ``V1Pod``) in the allocation record of ``node``, as the extender's
    filter does."""
    if isinstance(pod, dict):
        meta = pod['metadata']
        uid, namespace, name = meta['uid'], meta['namespace'], meta['name']
    else:
        uid, namespace, name = (pod.metadata.uid, pod.metadata.namespace,
                                pod.metadata.name)
    record = recordstore.RecordStore(api).update(
        node, lambda record: allocrecord.book(
            record, uid, namespace, name,
            int(time.time()) if when is None else when, containers,
            capacity))
    return record.pods[uid]


def serve(test: Any, server: Any) -> str:
    """Serve ``server`` in a thread until ``test`` (a TestCase or
    Fixture) cleans up; :returns: its ``http://host:port`` URL."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    test.addCleanup(thread.join, 10)
    test.addCleanup(server.server_close)
    test.addCleanup(server.shutdown)
    host, port = server.server_address[:2]
    return 'http://%s:%d' % (host, port)


def gpu_pod(name: str, containers: list[dict[str, str]],
            init: list[dict[str, str]] | None = None,
            namespace: str = 'team',
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose containers have these ``amd.com/*`` limits."""

    def container(prefix: str, n: int, limits: dict[str, str]
                  ) -> dict[str, Any]:
        return {'name': '%s%d' % (prefix, n), 'image': 'rocm',
                'resources': {'limits': dict(limits)} if limits else {}}

    spec: dict[str, Any] = {'containers': [
        container('c', n, limits) for n, limits in enumerate(containers)]}
    if init:
        spec['initContainers'] = [container('init', n, limits)
                                  for n, limits in enumerate(init)]
    return {'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': name, 'namespace': namespace,
                         'annotations': dict(annotations or {})},
            'spec': spec}
