"""What the admission webhook reads from and writes to the API: the GPU
shapes the cluster registers, and Events recording its decisions."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.admission import intent as pod_intent
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.model import GpuModel
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)


class EventRecorder:
    """Records intent decisions as Events of the pod (``GpuPlacement``),
    one per container that states its needs.

    The Event name is derived from the admission request's uid (and the
    container), so a retried request writes it once. Failures are
    logged, never raised: the pod's annotation carries the same reason.
    """

    reason = 'GpuPlacement'

    def __init__(self, core_api: Any, component: str = 'amdgpu-virt-webhook'
                 ) -> None:
        self.api = core_api
        self.component = component

    def __call__(self, namespace: str, pod: str, uid: str,
                 message: str, field_path: str | None = None) -> None:
        """:param uid: the admission request's uid (with the container's
            name when a request records several decisions).
        :param field_path: the container the decision is for
            (``spec.containers{name}``, as kubelet names containers in
            Events)."""
        digest = hashlib.sha256(uid.encode()).hexdigest()[:16]
        base = (pod.rstrip('-.') or 'pod')[:200]
        now = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
        name = '%s.%s' % (base, digest)
        involved = {'apiVersion': 'v1', 'kind': 'Pod',
                    'namespace': namespace, 'name': pod}
        if field_path:
            involved['fieldPath'] = field_path
        body = {'apiVersion': 'v1', 'kind': 'Event',
                'metadata': {'name': name, 'namespace': namespace},
                'involvedObject': involved,
                'reason': self.reason, 'message': message[:1024],
                'type': 'Normal', 'source': {'component': self.component},
                'firstTimestamp': now, 'lastTimestamp': now, 'count': 1,
                'reportingComponent': self.component}
        try:
            k8s_client.call('POST event %s/%s' % (namespace, name),
                            self.api.create_namespaced_event, namespace, body,
                            _preload_content=False)
        except exception.KubernetesConflict:
            pass   # the same request, retried
        except exception.AmdgpuVirtError as err:
            LOG.warning('pod %s/%s: decision Event not written: %s',
                        namespace, pod, err)


class ClusterModels:
    """The GPU shapes the cluster's nodes register, cached for ``ttl``."""

    def __init__(self, core_api: Any, ttl: float = 30.0) -> None:
        self.api = core_api
        self.ttl = ttl
        self._lock = threading.Lock()
        self._at = -ttl
        self._models: tuple[GpuModel, ...] = ()
        self._levels: dict[str, frozenset[enforcement.Level]] = {}

    def levels(self) -> dict[str, frozenset[enforcement.Level]]:
        """Model name -> memory enforcement levels its GPUs register (as
        read with the models)."""
        self()
        with self._lock:
            return self._levels

    def __call__(self) -> tuple[GpuModel, ...]:
        now = time.monotonic()
        with self._lock:
            if now - self._at < self.ttl:
                return self._models
        response = k8s_client.call('LIST nodes', self.api.list_node,
                                   _preload_content=False)
        devices: list[hami.DeviceInfo] = []
        for node in json.loads(response.data).get('items') or []:
            value = ((node.get('metadata') or {}).get('annotations')
                     or {}).get(hami.NODE_REGISTER)
            if not value:
                continue
            try:
                infos = hami.decode_node_register(value)
            except exception.HamiProtocolError as err:
                LOG.warning('node %s: %s', (node.get('metadata') or {}).get(
                    'name'), err)
                continue
            devices.extend(i for i in infos
                           if fit.usable_device(i) is None)
        models = pod_intent.models_from_registrations(devices)
        levels = pod_intent.levels_from_registrations(devices)
        with self._lock:
            self._at = now
            self._models = models
            self._levels = levels
        return models


def _value(text: Any) -> Any:
    try:
        return quantity.value(text)
    except exception.InvalidQuantity:
        return text


def _values(spec: Any) -> Any:
    """A template's ``spec`` with its quantities as values."""
    if not isinstance(spec, dict):
        return spec
    return quantity.map_fields(spec, tuple(
        ('spec',) + p for p in quantity.CLAIM_SPEC_PATHS), _value)


class ClaimTemplates:
    """Makes sure a ResourceClaimTemplate exists, through a
    ``ResourceV1Api`` (the DRA path of stated needs).

    The name is derived from the content, so an existing template of that
    name is reused; one whose spec differs (someone else wrote it) is
    refused rather than trusted. Quantities are compared by value: the API
    server stores them in its own form.
    """

    def __init__(self, resource_api: Any) -> None:
        self.api = resource_api

    def __call__(self, namespace: str, template: dict[str, Any]) -> None:
        name = template['metadata']['name']
        what = 'ResourceClaimTemplate %s/%s' % (namespace, name)
        try:
            k8s_client.call('POST %s' % what,
                            self.api.create_namespaced_resource_claim_template,
                            namespace, template, _preload_content=False)
            return
        except exception.KubernetesConflict:
            pass   # it exists: it must be ours
        response = k8s_client.call(
            'GET %s' % what, self.api.read_namespaced_resource_claim_template,
            name, namespace, _preload_content=False)
        found = json.loads(response.data).get('spec')
        if _values(found) != _values(template['spec']):
            raise exception.KubernetesError(
                request='GET %s' % what,
                reason='it exists with another spec (%s), not the one this '
                'webhook writes; remove it' % json.dumps(found,
                                                         sort_keys=True))
