"""The mutating admission webhook for pods that request AMD GPUs.

:func:`review` is a pure decision on an ``AdmissionReview`` (v1) dict: it
returns the ``AdmissionReview`` response. For a pod whose containers
request one of the managed resources (``amd.com/gpu``, ``amd.com/gpumem``,
``amd.com/gpucores``) it

* denies privileged containers (they see every GPU), a preset
  ``spec.nodeName`` (it would bypass the extender), ``amd.com/gpucores``
  that is not an integer in 1..100, a non-integer ``amd.com/gpu`` or
  ``amd.com/gpumem``, and environment variables the device plugin owns
  (``HSA_CU_MASK``, ``ROC_GLOBAL_CU_MASK``, ``HIP_DEVICE_MEMORY_LIMIT*``,
  ``ROCR_VISIBLE_DEVICES``, ``LD_AUDIT``);
* in namespaces labelled isolated, denies anything but whole GPUs (CU
  masks are cooperative, not a security boundary);
* otherwise sets ``spec.schedulerName`` with an RFC 6902 patch (made with
  ``jsonpatch``, base64 in the response), as HAMi's webhook does.

Objects labelled ``hami.io/webhook: ignore`` are let through untouched.
Every denial names the container and the field.

:func:`make_server` serves it over HTTP(S) with ``/healthz`` and
``/readyz``.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import http.server
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import jsonpatch

from amdgpu_virt import exception
from amdgpu_virt.k8s import httpserver

LOG = logging.getLogger(__name__)

GPU = 'amd.com/gpu'
GPUMEM = 'amd.com/gpumem'
GPUCORES = 'amd.com/gpucores'
IGNORE_LABEL = 'hami.io/webhook'
IGNORE_VALUE = 'ignore'
#: environment the device plugin sets; a pod setting it could escape its
#: CU mask or memory limit, or see other GPUs
RESERVED_ENV = ('HSA_CU_MASK', 'ROC_GLOBAL_CU_MASK', 'ROCR_VISIBLE_DEVICES',
                'LD_AUDIT')
RESERVED_ENV_PREFIXES = ('HIP_DEVICE_MEMORY_LIMIT',)
_INTEGER = re.compile(r'^\+?[0-9]+$')

NamespaceLabels = Callable[[str], Mapping[str, str]]


@dataclasses.dataclass(frozen=True)
class WebhookPolicy:
    """What the webhook enforces.

    :param scheduler_name: set as ``spec.schedulerName``.
    :param managed_resources: resources that make a pod ours.
    :param isolated_label: (key, value) of isolated namespaces.
    """

    scheduler_name: str = 'amdgpu-virt-scheduler'
    managed_resources: tuple[str, ...] = (GPU, GPUMEM, GPUCORES)
    isolated_label: tuple[str, str] = ('amdgpu-virt.io/tenancy', 'isolated')

    @classmethod
    def from_conf(cls, conf: Any) -> WebhookPolicy:
        """From the ``[kubernetes]`` options.

        :raises ConfigError: naming ``isolated_namespace_label``.
        """
        group = conf.kubernetes
        key, sep, value = group.isolated_namespace_label.partition('=')
        if not sep or not key:
            raise exception.ConfigError(
                option='[kubernetes] isolated_namespace_label',
                reason='%r is not key=value'
                % group.isolated_namespace_label)
        return cls(scheduler_name=group.scheduler_name,
                   managed_resources=tuple(group.webhook_managed_resources),
                   isolated_label=(key, value))


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(JSON path, container) of init containers then containers."""
    found: list[tuple[str, dict[str, Any]]] = []
    for field in ('initContainers', 'containers'):
        items = spec.get(field) or []
        if isinstance(items, list):
            found.extend(('spec.%s[%d]' % (field, n), c)
                         for n, c in enumerate(items) if isinstance(c, dict))
    return found


def _resources(container: Mapping[str, Any]
               ) -> dict[str, tuple[str, Any]]:
    """resource -> (field path, value) over limits then requests."""
    found: dict[str, tuple[str, Any]] = {}
    resources = container.get('resources') or {}
    if not isinstance(resources, dict):
        return found
    for kind in ('requests', 'limits'):
        values = resources.get(kind) or {}
        if isinstance(values, dict):
            for name, value in values.items():
                found[name] = ('resources.%s[%s]' % (kind, name), value)
    return found


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    return None


def _container_problems(where: str, container: Mapping[str, Any],
                        requested: dict[str, tuple[str, Any]],
                        isolated: str | None) -> list[str]:
    name = container.get('name', '?')
    label = 'container %r (%s)' % (name, where)
    problems = []
    security = container.get('securityContext') or {}
    if requested and isinstance(security, dict) and \
            security.get('privileged') is True:
        problems.append(
            '%s: securityContext.privileged: a privileged container sees '
            'every GPU of the node, so it may not request %s'
            % (label, ', '.join(sorted(requested))))
    for resource in (GPU, GPUMEM):
        if resource in requested:
            field, value = requested[resource]
            number = _integer(value)
            if number is None or number < 0:
                problems.append('%s: %s: %r is not a non-negative integer'
                                % (label, field, value))
    cores = None
    if GPUCORES in requested:
        field, value = requested[GPUCORES]
        cores = _integer(value)
        if cores is None or not 1 <= cores <= 100:
            problems.append('%s: %s: %r is not an integer percentage in '
                            '1..100' % (label, field, value))
    if isolated is not None:
        if cores is not None and cores < 100:
            problems.append('%s: %s: %d%% of a GPU, but %s only gets '
                            'whole GPUs' % (label, requested[GPUCORES][0],
                                            cores, isolated))
        if GPUMEM in requested and _integer(requested[GPUMEM][1]) != 0:
            problems.append('%s: %s: a memory share, but %s only gets '
                            'whole GPUs' % (label, requested[GPUMEM][0],
                                            isolated))
    env = container.get('env') or []
    if isinstance(env, list):
        for n, var in enumerate(env):
            var_name = str(var.get('name', '')) if isinstance(
                var, dict) else ''
            if var_name in RESERVED_ENV or var_name.startswith(
                    RESERVED_ENV_PREFIXES):
                problems.append('%s: env[%d] (%s): set by the GPU device '
                                'plugin, a pod may not set it itself'
                                % (label, n, var_name))
    return problems


def _response(uid: str, allowed: bool, message: str | None = None,
              patch: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {'uid': uid, 'allowed': allowed}
    if not allowed:
        response['status'] = {'code': 403, 'reason': 'Forbidden',
                              'message': message or ''}
    if patch:
        response['patchType'] = 'JSONPatch'
        response['patch'] = base64.b64encode(
            json.dumps(patch).encode()).decode()
    return {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
            'response': response}


def review(admission_review: Mapping[str, Any], policy: WebhookPolicy,
           namespace_labels: Mapping[str, str] | None = None
           ) -> dict[str, Any]:
    """Decide on one AdmissionReview.

    :param admission_review: the ``admission.k8s.io/v1`` AdmissionReview.
    :param policy: what to enforce.
    :param namespace_labels: labels of the pod's namespace (None: unknown,
        treated as not isolated).
    :returns: the AdmissionReview carrying the response.
    :raises AdmissionReviewError: the review is malformed (naming the
        field).
    """
    if not isinstance(admission_review, Mapping):
        raise exception.AdmissionReviewError(field='(body)',
                                             reason='not a JSON object')
    request = admission_review.get('request')
    if not isinstance(request, Mapping):
        raise exception.AdmissionReviewError(field='request',
                                             reason='missing')
    uid = request.get('uid')
    if not isinstance(uid, str) or not uid:
        raise exception.AdmissionReviewError(field='request.uid',
                                             reason='missing')
    kind_field = request.get('kind') or {}
    kind = kind_field.get('kind') if isinstance(kind_field, Mapping) \
        else None
    pod = request.get('object')
    if kind != 'Pod' or request.get('operation', 'CREATE') != 'CREATE':
        return _response(uid, True)
    if not isinstance(pod, Mapping):
        raise exception.AdmissionReviewError(field='request.object',
                                             reason='missing pod')
    metadata = pod.get('metadata') or {}
    if not isinstance(metadata, Mapping):
        raise exception.AdmissionReviewError(
            field='request.object.metadata', reason='not an object')
    labels = metadata.get('labels') or {}
    if not isinstance(labels, Mapping):
        raise exception.AdmissionReviewError(
            field='request.object.metadata.labels', reason='not an object')
    if labels.get(IGNORE_LABEL) == IGNORE_VALUE:
        return _response(uid, True)
    spec = pod.get('spec') or {}
    if not isinstance(spec, Mapping):
        raise exception.AdmissionReviewError(field='request.object.spec',
                                             reason='not an object')
    containers = _containers(spec)
    managed = set(policy.managed_resources)
    wanted = {where: {k: v for k, v in _resources(c).items() if k in managed}
              for where, c in containers}
    if not any(wanted.values()):
        return _response(uid, True)
    namespace = request.get('namespace') or metadata.get('namespace', '')
    isolated = None
    key, value = policy.isolated_label
    if namespace_labels is not None and namespace_labels.get(key) == value:
        isolated = 'namespace %r (labelled %s=%s)' % (namespace, key, value)
    problems = []
    if spec.get('nodeName'):
        problems.append(
            'spec.nodeName: preset to %r, but pods requesting AMD GPU '
            'resources must be placed by scheduler %r' % (spec['nodeName'],
                                               policy.scheduler_name))
    for where, container in containers:
        problems.extend(_container_problems(where, container, wanted[where],
                                            isolated))
    name = metadata.get('name') or metadata.get('generateName', '?')
    if problems:
        message = 'pod %s/%s denied: %s' % (namespace, name,
                                            '; '.join(problems))
        LOG.info('%s', message)
        return _response(uid, False, message)
    if spec.get('schedulerName') == policy.scheduler_name:
        return _response(uid, True)
    mutated = copy.deepcopy(dict(pod))
    mutated.setdefault('spec', {})['schedulerName'] = policy.scheduler_name
    patch = jsonpatch.make_patch(dict(pod), mutated).patch
    LOG.info('pod %s/%s: schedulerName set to %s', namespace, name,
             policy.scheduler_name)
    return _response(uid, True, patch=patch)


# --- HTTP -------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'   # keep-alive: every answer has a length
    server: _WebhookServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        LOG.debug('webhook %s - %s', self.address_string(), format % args)

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path in ('/healthz', '/readyz'):
            self._send(200, {'status': 'ok'})
        else:
            self._send(404, {'error': 'no such path %s' % self.path})

    def do_POST(self) -> None:
        if self.path.split('?')[0] not in ('/webhook', '/mutate'):
            self._send(404, {'error': 'no such path %s' % self.path})
            return
        try:
            body = httpserver.read_json(self)
            labels = None
            request = body.get('request') if isinstance(body, dict) else None
            namespace = request.get('namespace') if isinstance(
                request, dict) else None
            if namespace and self.server.namespace_labels is not None:
                try:
                    labels = self.server.namespace_labels(namespace)
                except Exception as err:
                    # fail closed: isolation cannot be checked
                    uid = request.get('uid', '') if isinstance(
                        request, dict) else ''
                    LOG.warning('labels of namespace %s unreadable: %s',
                                namespace, err)
                    self._send(200, _response(
                        str(uid), False, 'namespace %r: labels unreadable '
                        '(%s); cannot check GPU tenancy' % (namespace, err)))
                    return
            self._send(200, review(body, self.server.policy, labels))
        except (ValueError, exception.AdmissionReviewError,
                exception.HttpRequestError) as err:
            self._send(400, {'error': str(err)})
        except Exception as err:  # answer rather than drop the connection
            LOG.exception('webhook failed on %s', self.path)
            self._send(500, {'error': 'internal error: %s' % err})


class _WebhookServer(httpserver.Server):
    policy: WebhookPolicy
    namespace_labels: NamespaceLabels | None


def make_server(policy: WebhookPolicy, host: str = '127.0.0.1',
                port: int = 0,
                namespace_labels: NamespaceLabels | None = None,
                cert_file: str | None = None,
                key_file: str | None = None,
                limits: httpserver.Limits | None = None) -> _WebhookServer:
    """An HTTP(S) server for ``POST /webhook``; call ``serve_forever``.

    :param namespace_labels: namespace name -> labels (e.g.
        :class:`NamespaceLabelCache`); None treats no namespace as
        isolated.
    :param cert_file: serve HTTPS with this certificate and ``key_file``,
        reloaded when they change (:class:`.httpserver.TlsFiles`).
    :raises ConfigError: the certificate does not load.
    :raises OSError: the address cannot be bound.
    """
    tls = httpserver.TlsFiles(
        cert_file, key_file or cert_file,
        option='[kubernetes] webhook_cert_file/webhook_key_file') \
        if cert_file else None
    server = _WebhookServer(_Handler, host, port, limits, tls,
                            name='webhook')
    server.policy = policy
    server.namespace_labels = namespace_labels
    return server


class NamespaceLabelCache:
    """Namespace labels read through a ``CoreV1Api``, cached for ``ttl``."""

    def __init__(self, core_api: Any, ttl: float = 30.0) -> None:
        self.api = core_api
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, dict[str, str]]] = {}

    def __call__(self, namespace: str) -> Mapping[str, str]:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(namespace)
            if hit is not None and now - hit[0] < self.ttl:
                return hit[1]
        labels = dict(self.api.read_namespace(namespace).metadata.labels
                      or {})
        with self._lock:
            self._cache[namespace] = (now, labels)
        return labels


def from_conf(conf: Any, core_api: Any | None = None) -> _WebhookServer:
    """The webhook server configured by the ``[kubernetes]`` options.

    Namespace labels are read through ``core_api`` (default: a client
    from ``[kubernetes] kubeconfig``).

    :raises ConfigError: naming the option at fault.
    """
    group = conf.kubernetes
    if core_api is None:
        from amdgpu_virt.k8s import client as k8s_client
        core_api = k8s_client.core_api(conf)
    if bool(group.webhook_cert_file) != bool(group.webhook_key_file):
        raise exception.ConfigError(
            option='[kubernetes] webhook_cert_file/webhook_key_file',
            reason='set both or neither')
    try:
        return make_server(
            WebhookPolicy.from_conf(conf), host=group.webhook_host,
            port=group.webhook_port,
            namespace_labels=NamespaceLabelCache(core_api),
            cert_file=group.webhook_cert_file,
            key_file=group.webhook_key_file,
            limits=httpserver.Limits.from_conf(conf))
    except (OSError, ssl.SSLError) as err:
        raise exception.ConfigError(
            option='[kubernetes] webhook_host/webhook_port/webhook_cert_file',
            reason=str(err)) from None
