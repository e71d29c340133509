"""Building ``kubernetes`` API clients, and calling them.

:func:`api_client` and :func:`core_api` build clients from the
``[kubernetes]`` options. :func:`call` is the one place where what the
``kubernetes`` client and urllib3 raise becomes the project's errors: an
API answer (``ApiException``) becomes :class:`~amdgpu_virt.exception.
KubernetesConflict` (409) or :class:`~amdgpu_virt.exception.
KubernetesError`; a transport failure (connection refused or reset, a
truncated or unreadable answer, a timeout) becomes :class:`~amdgpu_virt.
exception.KubernetesUnavailable`. Daemon loops catch these and retry with
a :class:`Backoff`.
"""

from __future__ import annotations

import http.client
import json
import os
import random
from typing import Any

import urllib3
from kubernetes import client
from kubernetes import config as k8s_config
from kubernetes.client import exceptions as k8s_exceptions

from amdgpu_virt import exception

#: what a request can fail with below the HTTP answer
#: the content type of a JSON merge patch (RFC 7386)
MERGE_PATCH = 'application/merge-patch+json'

TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, http.client.HTTPException,
                    OSError)


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from ``kubeconfig``, or the in-cluster account.

    :raises ConfigError: naming ``[kubernetes] kubeconfig``.
    """
    try:
        if kubeconfig:
            configuration = client.Configuration()
            k8s_config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration)
        else:
            configuration = client.Configuration()
            k8s_config.load_incluster_config(
                client_configuration=configuration)
    except (k8s_config.ConfigException, OSError) as err:
        raise exception.ConfigError(
            option='[kubernetes] kubeconfig',
            reason='%s: %s' % (kubeconfig or '(in-cluster)', err)) from None
    return client.ApiClient(configuration)


def core_api(conf: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(conf.kubernetes.kubeconfig))


def node_name(conf: Any) -> str:
    """``[kubernetes] node_name``, else the NODE_NAME environment variable.

    :raises ConfigError: neither is set.
    """
    name = conf.kubernetes.node_name or os.environ.get('NODE_NAME')
    if not name:
        raise exception.ConfigError(
            option='[kubernetes] node_name',
            reason='not set, and the NODE_NAME environment variable is '
            'empty (set it from the downward API: spec.nodeName)')
    return name


def call(what: str, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the API; errors become ours, naming ``what`` was asked.

    With ``_preload_content=False`` the body is read here (it stays in
    ``result.data``) and the connection handed back to the pool, so that
    a truncated body fails here too.

    :raises KubernetesConflict: 409.
    :raises KubernetesNotFound: 404.
    :raises KubernetesError: any other API error.
    :raises KubernetesUnavailable: the request or its answer was lost.
    """
    try:
        result = func(*args, **kwargs)
        if kwargs.get('_preload_content') is False:
            # an unread response would hold its connection until garbage
            # collection, which then resets it
            _body = result.data
            result.release_conn()
    except k8s_exceptions.ConflictException:
        raise exception.KubernetesConflict(obj=what) from None
    except k8s_exceptions.ApiException as err:
        if err.status == 404:
            raise exception.KubernetesNotFound(request=what) from None
        raise exception.KubernetesError(
            request=what, reason='%s %s' % (err.status, err.reason),
            status=err.status) from None
    except TRANSPORT_ERRORS as err:
        raise unavailable(what, err) from None
    return result


#: API answers worth asking again: the server was busy or failed
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


def transient(err: exception.KubernetesError) -> bool:
    """Whether asking again may succeed: the request or its answer was
    lost, or the API server answered it was busy or failed (429, 5xx).
    A lost answer may hide a request that took effect: only idempotent
    requests (reads, conditional or merge writes) may be repeated."""
    return isinstance(err, exception.KubernetesUnavailable) or \
        err.kwargs.get('status') in TRANSIENT_STATUSES


def unavailable(what: str, err: BaseException
                ) -> exception.KubernetesUnavailable:
    """The error for a transport failure ``err`` of request ``what``."""
    reason = getattr(err, 'reason', None) or err
    return exception.KubernetesUnavailable(
        request=what, reason='%s: %s' % (type(err).__name__, reason))


def json_body(what: str, response: Any) -> Any:
    """The JSON document of a ``_preload_content=False`` answer.

    :raises KubernetesUnavailable: the body is not JSON (cut short).
    """
    try:
        return json.loads(response.data)
    except ValueError as err:
        raise exception.KubernetesUnavailable(
            request=what, reason='the answer is not JSON (%s)' % err
        ) from None


class Backoff:
    """Exponential backoff with jitter for daemon loops.

    :meth:`next` gives the seconds to wait after a failure: ``base``,
    then doubling up to ``cap``, each drawn in [50 %, 100 %] of the step
    so that many nodes do not retry in step; :meth:`reset` after a
    success starts again from ``base``.
    """

    def __init__(self, base: float = 0.5, cap: float = 30.0,
                 rng: random.Random | None = None) -> None:
        if base <= 0 or cap < base:
            raise ValueError('need 0 < base <= cap')
        self.base = base
        self.cap = cap
        self.failures = 0
        self._random = rng or random.Random()  # noqa: S311 (jitter only)

    def next(self) -> float:
        step = min(self.cap, self.base * 2 ** min(self.failures, 32))
        self.failures += 1
        return step * (0.5 + self._random.random() / 2)

    def reset(self) -> None:
        self.failures = 0
