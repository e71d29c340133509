"""The webhook over HTTP, reading namespace labels from the API stand-in."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import testtools
from kubernetes import client

from amdgpu_virt.k8s.admission import webhook
from tests.functional.fixtures import kubeclient
from tests.functional.k8s import cluster


class WebhookServerTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        for name, labels in (('shared', None), ('secure', {
                'amdgpu-virt.io/tenancy': 'isolated'})):
            self.kube.api.create_namespace(client.V1Namespace(
                metadata=client.V1ObjectMeta(name=name, labels=labels)))
        self.server = webhook.make_server(
            webhook.WebhookPolicy(), namespace_labels=(
                webhook.NamespaceLabelCache(self.kube.api)))
        self.url = cluster.serve(self, self.server)

    def _post(self, body: Any, path: str = '/webhook') -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(),
            headers={'Content-Type': 'application/json'})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    @staticmethod
    def _review(namespace: str, cores: str) -> dict[str, Any]:
        pod = {'metadata': {'name': 'p'}, 'spec': {'containers': [{
            'name': 'main', 'resources': {'limits': {
                'amd.com/gpucores': cores}}}]}}
        return {'apiVersion': 'admission.k8s.io/v1',
                'kind': 'AdmissionReview',
                'request': {'uid': 'u', 'kind': {'kind': 'Pod'},
                            'namespace': namespace, 'operation': 'CREATE',
                            'object': pod}}

    def test_health(self) -> None:
        for path in ('/healthz', '/readyz'):
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                self.assertEqual(200, r.status)

    def test_isolation_follows_namespace_labels(self) -> None:
        shared = self._post(self._review('shared', '50'))['response']
        self.assertTrue(shared['allowed'])
        self.assertEqual('JSONPatch', shared['patchType'])
        secure = self._post(self._review('secure', '50'))['response']
        self.assertFalse(secure['allowed'])
        self.assertIn("namespace 'secure'", secure['status']['message'])
        self.assertTrue(self._post(self._review('secure', '100'))[
            'response']['allowed'])

    def test_unknown_namespace_fails_closed(self) -> None:
        response = self._post(self._review('ghost', '100'))['response']
        self.assertFalse(response['allowed'])
        self.assertIn("namespace 'ghost'", response['status']['message'])

    def test_malformed_review_is_400(self) -> None:
        err = self.assertRaises(urllib.error.HTTPError, self._post,
                                {'request': {'kind': {'kind': 'Pod'}}})
        self.assertEqual(400, err.code)
        self.assertIn('request.uid', json.loads(err.read())['error'])
