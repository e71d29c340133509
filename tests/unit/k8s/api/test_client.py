"""amdgpu_virt.k8s.api.client.call and Backoff."""

from __future__ import annotations

import random

import testtools
import urllib3
from kubernetes.client import exceptions as k8s_exceptions

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client


def _raise(err: BaseException) -> None:
    raise err


class CallTest(testtools.TestCase):

    def test_api_errors(self) -> None:
        self.assertRaises(
            exception.KubernetesConflict, k8s_client.call, 'PATCH x',
            _raise, k8s_exceptions.ConflictException(status=409))
        self.assertRaises(
            exception.KubernetesNotFound, k8s_client.call, 'GET x',
            _raise, k8s_exceptions.NotFoundException(status=404))
        err = self.assertRaises(
            exception.KubernetesError, k8s_client.call, 'GET x', _raise,
            k8s_exceptions.ApiException(status=503, reason='Unavailable'))
        self.assertEqual('Kubernetes request GET x failed: 503 Unavailable',
                         str(err))

    def test_transport_errors(self) -> None:
        for err in (urllib3.exceptions.ProtocolError('Connection aborted'),
                    urllib3.exceptions.MaxRetryError(None, '/x', 'refused'),
                    urllib3.exceptions.ReadTimeoutError(None, '/x', 'slow'),
                    ConnectionResetError(104, 'reset'),
                    TimeoutError('timed out')):
            got = self.assertRaises(exception.KubernetesUnavailable,
                                    k8s_client.call, 'GET node n1', _raise,
                                    err)
            self.assertIn('GET node n1', str(got))
            self.assertIn(type(err).__name__, str(got))

    def test_body_read_failure_is_converted(self) -> None:
        class Response:
            @property
            def data(self) -> bytes:
                raise urllib3.exceptions.ProtocolError('IncompleteRead')

        self.assertRaises(exception.KubernetesUnavailable, k8s_client.call,
                          'GET x', lambda **kw: Response(),
                          _preload_content=False)

    def test_json_body(self) -> None:
        class Response:
            data = b'{"kind": "No'

        err = self.assertRaises(exception.KubernetesUnavailable,
                                k8s_client.json_body, 'GET x', Response())
        self.assertIn('not JSON', str(err))


class BackoffTest(testtools.TestCase):

    def test_doubles_up_to_the_cap_with_jitter_and_resets(self) -> None:
        backoff = k8s_client.Backoff(base=1.0, cap=8.0,
                                     rng=random.Random(3))
        waits = [backoff.next() for _ in range(6)]
        for wait, step in zip(waits, (1, 2, 4, 8, 8, 8), strict=True):
            self.assertTrue(step / 2 <= wait <= step, (wait, step))
        backoff.reset()
        self.assertLessEqual(backoff.next(), 1.0)

    def test_rejects_bad_bounds(self) -> None:
        self.assertRaises(ValueError, k8s_client.Backoff, base=0)
        self.assertRaises(ValueError, k8s_client.Backoff, base=2, cap=1)
