"""The mutating admission webhook for pods that request AMD GPUs.

:func:`review` is a pure decision on an ``AdmissionReview`` (v1) dict: it
returns the ``AdmissionReview`` response. Nothing a pod's owner writes can
make it skip a rule: HAMi's ``hami.io/webhook: ignore`` label is ignored,
and the only exemptions are namespaces the administrator lists
(``[kubernetes] webhook_exempt_namespaces``).

On CREATE, for a pod whose containers request one of the managed resources
(``amd.com/gpu``, ``amd.com/gpumem``, ``amd.com/gpucores``) or that states
its needs in ``gpu.amd.com/workload`` or per container in
``workload.gpu.amd.com/<container>`` (see
:mod:`amdgpu_virt.k8s.admission.intent` and
:mod:`amdgpu_virt.k8s.admission.stated`), it

* turns stated needs into container limits with the planner's policy
  engine (a CU slice, or whole GPUs), records each decision and its reason
  in ``gpu.amd.com/decision`` and ``gpu.amd.com/decision-reason`` (per
  container: ``decision.gpu.amd.com/<container>`` and
  ``decision-reason.gpu.amd.com/<container>``) and an Event per
  distinct decision (written off the admission path), and denies a need
  that fits no GPU of the cluster, or more GPUs than any node has, with
  the tightest reason, naming the container;
* denies privileged containers (they see every GPU), a preset
  ``spec.nodeName`` (it would bypass the extender), ``amd.com/gpucores``
  that is not an integer in 1..100, a non-integer ``amd.com/gpu`` or
  ``amd.com/gpumem``, a managed resource in requests without a limit,
  environment variables the device plugin owns (``HSA_CU_MASK``,
  ``ROC_GLOBAL_CU_MASK``, ``HIP_DEVICE_MEMORY_LIMIT*``,
  ``ROCR_VISIBLE_DEVICES``, ``LD_AUDIT``) set in ``env``, and ``envFrom``
  whose prefix could produce one of them (the ConfigMap or Secret may
  change after admission, so its keys are not trusted);
* in namespaces labelled isolated, denies anything but whole GPUs (the
  policy's tenancy rule: CU masks are not a security boundary);
* denies allocation annotations (``hami.io/amd-devices-*``,
  ``hami.io/amd-cu-allocated``, ``hami.io/vgpu-*``, ``hami.io/bind-*``) and
  the webhook's own decision annotations set by the pod's creator;
* otherwise sets ``spec.schedulerName`` and ``amd.com/gpu: 1`` where a
  container gives only ``amd.com/gpumem`` or ``amd.com/gpucores`` (HAMi
  counts a container only when ``amd.com/gpu`` is set), with an RFC 6902
  patch (made with ``jsonpatch``, base64 in the response).

On UPDATE it denies any change of those annotations (or of the
``hami.io/vgpu-node`` label) by a user who is not one of
``[kubernetes] webhook_allocation_writers`` (the project's service
accounts, as ``request.userInfo.username`` names them): a second line
behind the ValidatingAdmissionPolicy that does the same in the API
server. On any UPDATE (``pods/ephemeralcontainers`` from ``kubectl debug``
included) it denies an added ephemeral container that asks for
``amd.com/*`` or, on a GPU pod, sets the device plugin's variables or
runs privileged. Every denial names the container and the field.

What one pod makes a review do is bounded before anything is parsed
(containers, statements, their size and nesting), and a review past its
time budget (:class:`~amdgpu_virt.k8s.admission.rules.Budget`, from its
request's first byte) denies the pod, saying so.

:func:`make_server` serves it over HTTP(S) with ``/healthz`` and
``/readyz`` (ready once its helpers are: the watch of the nodes' GPU
shapes has listed them).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import http.server
import json
import logging
import ssl
import time
import typing
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import Protocol

import jsonpatch
from kubernetes import client as k8s_client_lib

from amdgpu_virt import exception
from amdgpu_virt.k8s.admission import intent as pod_intent
from amdgpu_virt.k8s.admission import rules as admission
from amdgpu_virt.k8s.admission import stated
from amdgpu_virt.k8s.admission import webhookapi
from amdgpu_virt.k8s.api import httpbody
from amdgpu_virt.k8s.api import httpserver
from amdgpu_virt.k8s.api import namespaces
from amdgpu_virt.k8s.api import tls as api_tls
from amdgpu_virt.policy import engine as policy_engine
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

#: The project's service accounts in the default release namespace.
DEFAULT_ALLOCATION_WRITERS = (
    'system:serviceaccount:amdgpu-virt:amdgpu-virt-scheduler',
    'system:serviceaccount:amdgpu-virt:amdgpu-virt-node')
NamespaceLabels = Callable[[str], Mapping[str, str]]
#: (namespace, pod name, key, message, field path): records a decision
#: as an Event of the pod (of its container at ``field path``, e.g.
#: ``spec.containers{main}``); ``key`` makes a retried request write it
#: once.
EventSink = Callable[[str, str, str, str, str | None], None]


@dataclasses.dataclass(frozen=True)
class WebhookPolicy:
    """What the webhook enforces.

    :param scheduler_name: set as ``spec.schedulerName``.
    :param managed_resources: resources that make a pod ours.
    :param isolated_label: (key, value) of isolated namespaces.
    :param exempt_namespaces: namespaces the webhook lets through untouched
        (an administrator's choice; nothing in a pod can exempt it).
    :param allocation_writers: users (``request.userInfo.username``) who
        may set or change the allocation annotations.
    """

    scheduler_name: str = 'amdgpu-virt-scheduler'
    managed_resources: tuple[str, ...] = hami.RESOURCES
    isolated_label: tuple[str, str] = ('amdgpu-virt.io/tenancy', 'isolated')
    exempt_namespaces: frozenset[str] = frozenset()
    allocation_writers: frozenset[str] = frozenset(
        DEFAULT_ALLOCATION_WRITERS)
    #: most containers (init and ephemeral included) of a pod that asks
    #: for GPUs, counted before any is looked at
    max_containers: int = 64
    #: seconds a review may take from its request's arrival; past them
    #: the pod is denied (the API server waits at most timeoutSeconds)
    review_budget: float = 5.0

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
                   isolated_label=(key, value),
                   exempt_namespaces=frozenset(
                       group.webhook_exempt_namespaces),
                   allocation_writers=frozenset(
                       group.webhook_allocation_writers),
                   max_containers=group.webhook_max_containers,
                   review_budget=group.webhook_review_budget)


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


#: Most problems a denial lists (a hostile pod may have thousands).
MAX_PROBLEMS = 20


def _problems(problems: list[str]) -> str:
    shown = problems[:MAX_PROBLEMS]
    if len(problems) > MAX_PROBLEMS:
        shown.append('and %d more problems' % (len(problems) -
                                               MAX_PROBLEMS))
    return '; '.join(shown)


def _field(container: Mapping[str, Any], field: str) -> Any:
    """``resources.<field>`` of a container (None when either is not
    there, or ``resources`` is not an object)."""
    resources = container.get('resources')
    return resources.get(field) if isinstance(resources, dict) else None


def review(admission_review: Mapping[str, Any], policy: WebhookPolicy,
           namespace_labels: Mapping[str, str] | None = None,
           intent: admission.IntentPolicy | None = None,
           events: EventSink | None = None,
           budget: admission.Budget = admission.UNBOUNDED
           ) -> dict[str, Any]:
    """Decide on one AdmissionReview.

    :param admission_review: the ``admission.k8s.io/v1`` AdmissionReview.
    :param policy: what to enforce.
    :param namespace_labels: labels of the pod's namespace (None: unknown,
        treated as not isolated).
    :param intent: the policy that turns ``gpu.amd.com/workload`` into
        resources (None: such pods are denied).
    :param events: records an intent decision (not on dry runs), one per
        distinct decision of the pod.
    :param budget: when the answer is due; a review that runs out of it
        denies the pod, saying so.
    :returns: the AdmissionReview carrying the response.
    :raises AdmissionReviewError: the review is malformed (naming the
        field).
    """
    try:
        return _review(admission_review, policy, namespace_labels, intent,
                       events, budget)
    except exception.ReviewBudgetExceeded as err:
        request = admission_review.get('request') or {}
        pod = request.get('object') or {}
        meta = (pod.get('metadata') or {}) if isinstance(pod, Mapping) \
            else {}
        message = 'pod %s/%s denied: %s; a pod this large cannot be ' \
            'judged in time (make it smaller: fewer containers, ' \
            'statements or variables)' % (
                request.get('namespace') or meta.get('namespace', ''),
                meta.get('name') or meta.get('generateName', '?'), err)
        LOG.warning('%s', message)
        return _response(str(request.get('uid', '')), False, message)


def _containers_over(pod: Mapping[str, Any], most: int) -> int | None:
    """How many containers ``pod`` has, when more than ``most`` (list
    lengths only: nothing is looked at)."""
    spec = pod.get('spec')
    if not isinstance(spec, Mapping):
        return None
    count = sum(len(items) for items in (
        spec.get(field) for field in ('initContainers', 'containers',
                                      'ephemeralContainers'))
        if isinstance(items, list))
    return count if count > most else None


def _review(admission_review: Mapping[str, Any], policy: WebhookPolicy,
            namespace_labels: Mapping[str, str] | None,
            intent: admission.IntentPolicy | None,
            events: EventSink | None,
            budget: admission.Budget) -> dict[str, Any]:
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
    operation = request.get('operation', 'CREATE')
    if kind != 'Pod' or operation not in ('CREATE', 'UPDATE'):
        return _response(uid, True)
    pod = request.get('object')
    if not isinstance(pod, Mapping):
        raise exception.AdmissionReviewError(field='request.object',
                                             reason='missing pod')
    metadata = admission.mapping(pod.get('metadata'),
                                 'request.object.metadata')
    admission.mapping(metadata.get('labels'),
                      'request.object.metadata.labels')
    annotations = admission.mapping(metadata.get('annotations'),
                           'request.object.metadata.annotations')
    namespace = request.get('namespace') or metadata.get('namespace', '')
    name = metadata.get('name') or metadata.get('generateName', '?')
    if namespace in policy.exempt_namespaces:
        LOG.debug('pod %s/%s: namespace exempt from GPU admission',
                  namespace, name)
        return _response(uid, True)
    user = admission.username(request)
    writer = user in policy.allocation_writers
    many = _containers_over(pod, policy.max_containers)
    if many is not None and admission.is_gpu_pod(pod):
        message = ('pod %s/%s denied: %d containers (init and ephemeral '
                   'ones included); a pod with AMD GPUs may have at most %d'
                   % (namespace, name, many, policy.max_containers))
        LOG.info('%s', message)
        return _response(uid, False, message)
    if operation == 'UPDATE':
        old = request.get('oldObject')
        if not isinstance(old, Mapping):
            raise exception.AdmissionReviewError(field='request.oldObject',
                                                 reason='missing pod')
        changed = [] if writer else admission.protected_changes(old, pod)
        if changed:
            message = ('pod %s/%s denied: %s: only the GPU scheduler and '
                       'device plugin may change these, not %s' % (
                           namespace, name, ', '.join(changed),
                           user or 'an unnamed user'))
            LOG.info('%s', message)
            return _response(uid, False, message)
        # kubectl debug: pods/ephemeralcontainers, or any other update
        debug = admission.ephemeral_problems(pod, old)
        if debug:
            message = 'pod %s/%s denied: %s' % (namespace, name,
                                                _problems(debug))
            LOG.info('%s', message)
            return _response(uid, False, message)
        return _response(uid, True)
    spec = admission.mapping(pod.get('spec'), 'request.object.spec')
    problems: list[str] = []
    if not writer:
        preset = ['metadata.annotations[%s]' % k
                  for k in hami.ALLOCATION_ANNOTATIONS if k in annotations]
        labels = metadata.get('labels') or {}
        preset.extend('metadata.labels[%s]' % k
                      for k in hami.ALLOCATION_LABELS if k in labels)
        if preset:
            problems.append('%s: allocation state is written by the GPU '
                            'scheduler only, not by %s' % (
                                ', '.join(preset), user or 'the creator'))
    isolated = None
    key, value = policy.isolated_label
    if namespace_labels is not None and namespace_labels.get(key) == value:
        isolated = 'namespace %r (labelled %s=%s)' % (namespace, key, value)
    problems.extend(admission.ephemeral_problems(pod, None))
    mutated = copy.deepcopy(dict(pod))
    decisions = stated.apply_intent(
        mutated, namespace, name, isolated, intent, problems,
        pod_intent.memory_rule(namespace, namespace_labels), budget)
    mspec = mutated.get('spec') or {}
    containers = admission.containers(mspec)
    managed = set(policy.managed_resources)
    wanted = {where: tuple(
        {k: v for k, v in admission.resources(c, kind).items()
         if k in managed} for kind in ('limits', 'requests'))
        for where, c in containers}
    claim = intent is not None and intent.dra and bool(decisions)
    if claim:
        # a container given a claim is a GPU container like any other
        ours = {d.claim for d in decisions}
        for where, container in containers:
            uses = _field(container, 'claims')
            for use in uses if isinstance(uses, list) else ():
                if isinstance(use, dict) and use.get('name') in ours:
                    wanted[where][0]['resourceClaim %s' % use['name']] = (
                        'resources.claims', None)
    if not problems and not claim and \
            not any(lim or req for lim, req in wanted.values()):
        return _response(uid, True)
    if spec.get('nodeName'):
        problems.append(
            'spec.nodeName: preset to %r, but pods requesting AMD GPU '
            'resources must be placed by scheduler %r' % (spec['nodeName'],
                                               policy.scheduler_name))
    for where, container in containers:
        budget.check('checking %s' % where)
        limits, requests = wanted[where]
        problems.extend(admission.container_problems(
            where, container, limits, requests, isolated))
    if problems:
        message = 'pod %s/%s denied: %s' % (namespace, name,
                                            _problems(problems))
        LOG.info('%s', message)
        return _response(uid, False, message)
    hami_pod = False
    for _where, container in containers:
        given = _field(container, 'limits')
        if not isinstance(given, dict):
            continue
        if any(r in given for r in managed):
            hami_pod = True
        if hami.RESOURCE_GPU not in given and any(
                r in given for r in hami.RESOURCES):
            given[hami.RESOURCE_GPU] = '1'
    if hami_pod:
        mutated.setdefault('spec', {})['schedulerName'] = \
            policy.scheduler_name
    if claim and intent is not None and intent.templates is not None \
            and not request.get('dryRun'):
        templates = {t['metadata']['name']: t for t in (
            pod_intent.claim_template(d.decision) for d in decisions)}
        for template_name, template in sorted(templates.items()):
            budget.check('writing ResourceClaimTemplate %s' % template_name)
            try:
                intent.templates(namespace, template)
            except exception.AmdgpuVirtError as err:
                message = ('pod %s/%s denied: ResourceClaimTemplate %s/%s '
                           'could not be written: %s' % (
                               namespace, name, namespace, template_name,
                               err))
                LOG.warning('%s', message)
                return _response(uid, False, message)
    budget.check('making the patch')
    patch = jsonpatch.make_patch(dict(pod), mutated).patch
    for event in stated.decision_events(decisions, uid):
        LOG.info('pod %s/%s: %s', namespace, name, event.message)
        if events is not None and not request.get('dryRun'):
            events(namespace, str(name), event.key, event.message,
                   event.field_path)
    if not patch:
        return _response(uid, True)
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
        if self.path == '/healthz':
            self._send(200, {'status': 'ok'})
        elif self.path == '/readyz':
            waiting = [helper.name for helper in self.server.helpers
                       if not helper.ready]
            if waiting:
                self._send(503, {'status': 'not ready: %s'
                                 % ', '.join(waiting)})
            else:
                self._send(200, {'status': 'ok'})
        else:
            self._send(404, {'error': 'no such path %s' % self.path})

    def do_POST(self) -> None:
        if self.path.split('?')[0] not in ('/webhook', '/mutate'):
            self._send(404, {'error': 'no such path %s' % self.path})
            return
        budget = admission.Budget.starting(
            getattr(self, 'received_at', time.monotonic()),
            self.server.policy.review_budget)
        try:
            body = httpbody.read_json(self)
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
            self._send(200, review(body, self.server.policy, labels,
                                   self.server.intent, self.server.events,
                                   budget))
        except (ValueError, exception.AdmissionReviewError,
                exception.HttpRequestError) as err:
            self._send(400, {'error': str(err)})
        except Exception as err:  # answer rather than drop the connection
            LOG.exception('webhook failed on %s', self.path)
            self._send(500, {'error': 'internal error: %s' % err})


@typing.runtime_checkable
class Helper(Protocol):
    """Something the webhook runs beside its server (a watch, a writer
    thread): started and stopped with it, and the webhook is ready once
    every helper is."""

    name: str

    @property
    def ready(self) -> bool:
        """Whether it is ready to serve reviews."""

    def start(self) -> Any:
        """Start its threads."""

    def stop(self) -> None:
        """Stop them."""


class _WebhookServer(httpserver.Server):
    policy: WebhookPolicy
    namespace_labels: NamespaceLabels | None
    intent: admission.IntentPolicy | None
    events: EventSink | None
    helpers: tuple[Helper, ...] = ()

    def serve_forever(self) -> None:
        """Start the helpers, serve until :meth:`shutdown`, stop them."""
        for helper in self.helpers:
            helper.start()
        try:
            super().serve_forever()
        finally:
            for helper in self.helpers:
                helper.stop()


def make_server(policy: WebhookPolicy, host: str = '127.0.0.1',
                port: int = 0,
                namespace_labels: NamespaceLabels | None = None,
                intent: admission.IntentPolicy | None = None,
                events: EventSink | None = None,
                cert_file: str | None = None,
                key_file: str | None = None,
                limits: httpserver.Limits | None = None) -> _WebhookServer:
    """An HTTP(S) server for ``POST /webhook``; call ``serve_forever``.

    :param namespace_labels: namespace name -> labels (e.g.
        :class:`NamespaceLabelCache`); None treats no namespace as
        isolated.
    :param intent: turns ``gpu.amd.com/workload`` into resources (None:
        such pods are denied).
    :param events: records intent decisions as Events.
    :param cert_file: serve HTTPS with this certificate and ``key_file``,
        reloaded when they change
        (:class:`amdgpu_virt.k8s.api.tls.TlsFiles`).
    :raises ConfigError: the certificate does not load.
    :raises OSError: the address cannot be bound.
    """
    tls = api_tls.TlsFiles(
        cert_file, key_file or cert_file,
        option='[kubernetes] webhook_cert_file/webhook_key_file') \
        if cert_file else None
    server = _WebhookServer(_Handler, host, port, limits, tls,
                            name='webhook')
    server.policy = policy
    server.namespace_labels = namespace_labels
    server.intent = intent
    server.events = events
    helpers: list[Helper] = []
    for helper in (intent.models if intent else None, events):
        if isinstance(helper, Helper):
            helpers.append(helper)
    server.helpers = tuple(helpers)
    return server


#: namespace labels, cached (kept here under its old name)
NamespaceLabelCache = namespaces.NamespaceLabelCache


def from_conf(conf: Any, core_api: Any | None = None) -> _WebhookServer:
    """The webhook server configured by the ``[kubernetes]`` options.

    Namespace labels are read through ``core_api`` (default: a client
    from ``[kubernetes] kubeconfig``).

    :raises ConfigError: naming the option at fault.
    """
    group = conf.kubernetes
    if core_api is None:
        from amdgpu_virt.k8s.api import client as k8s_client
        core_api = k8s_client.core_api(conf)
    if bool(group.webhook_cert_file) != bool(group.webhook_key_file):
        raise exception.ConfigError(
            option='[kubernetes] webhook_cert_file/webhook_key_file',
            reason='set both or neither')
    models = webhookapi.ClusterModels(core_api)
    try:
        return make_server(
            WebhookPolicy.from_conf(conf), host=group.webhook_host,
            port=group.webhook_port,
            namespace_labels=NamespaceLabelCache(core_api),
            intent=admission.IntentPolicy(
                policy_engine.Engine(conf), models,
                dra=group.webhook_dra_claims,
                templates=webhookapi.ClaimTemplates(
                    k8s_client_lib.ResourceV1Api(
                        getattr(core_api, 'api_client', None))),
                levels=models.levels,
                most=models.most,
                max_statements=group.webhook_max_statements),
            events=webhookapi.EventRecorder(
                core_api, queue_size=group.webhook_event_queue),
            cert_file=group.webhook_cert_file,
            key_file=group.webhook_key_file,
            limits=httpserver.Limits.from_conf(conf))
    except (OSError, ssl.SSLError) as err:
        raise exception.ConfigError(
            option='[kubernetes] webhook_host/webhook_port/webhook_cert_file',
            reason=str(err)) from None
