"""The role ledger as a Kubernetes ConfigMap.

The Kubernetes side reads the GPU roles from a ConfigMap (``[pool]
configmap_namespace`` / ``configmap_name``) holding the ledger YAML under
the key ``ledger.yaml``, the same text as the ledger file. Node agents
and device plugins read their own host's roles from it (:func:`k8s_gpus`,
through :mod:`amdgpu_virt.k8s.node.roles`). Writes are idempotent: nothing
is sent when the ConfigMap already holds the same ledger; a replace
carries the resourceVersion read, so a concurrent change is a conflict,
not a loss.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any


from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.model import Role

LOG = logging.getLogger(__name__)

DATA_KEY = 'ledger.yaml'
LABELS = {'app.kubernetes.io/name': 'amdgpu-virt',
          'app.kubernetes.io/component': 'ledger'}


@dataclasses.dataclass(frozen=True)
class Location:
    namespace: str
    name: str

    def __str__(self) -> str:
        return 'configmap %s/%s' % (self.namespace, self.name)

    @classmethod
    def from_conf(cls, conf: Any) -> Location:
        return cls(conf.pool.configmap_namespace, conf.pool.configmap_name)


def manifest(ledger: av_ledger.Ledger, where: Location) -> dict[str, Any]:
    """The ConfigMap object holding ``ledger``."""
    return {'apiVersion': 'v1', 'kind': 'ConfigMap',
            'metadata': {'name': where.name, 'namespace': where.namespace,
                         'labels': dict(LABELS)},
            'data': {DATA_KEY: ledger.dumps()}}


def manifest_text(ledger: av_ledger.Ledger, where: Location) -> str:
    """:func:`manifest` as YAML, for ``kubectl apply -f``."""
    return yamlutil.dump(manifest(ledger, where))


def _read_raw(core_api: Any, where: Location) -> dict[str, Any] | None:
    try:
        response = k8s_client.call(
            'GET %s' % where, core_api.read_namespaced_config_map,
            where.name, where.namespace, _preload_content=False)
    except exception.KubernetesNotFound:
        return None
    result: dict[str, Any] = json.loads(response.data)
    return result


def read(core_api: Any, where: Location) -> av_ledger.Ledger | None:
    """The ledger the ConfigMap holds, or None when there is none.

    :raises PlanError: the ConfigMap holds an invalid ledger (naming it).
    :raises KubernetesError: the ConfigMap cannot be read.
    """
    body = _read_raw(core_api, where)
    if body is None:
        return None
    text = (body.get('data') or {}).get(DATA_KEY)
    if text is None:
        raise exception.PlanError(source=str(where),
                                  reason='no data key %s' % DATA_KEY)
    return av_ledger.from_dict(yamlutil.load(text, '%s %s' % (where,
                                                              DATA_KEY)),
                               source='%s %s' % (where, DATA_KEY))


def write(core_api: Any, ledger: av_ledger.Ledger, where: Location) -> bool:
    """Make the ConfigMap hold ``ledger``.

    :returns: True when a request changed it (created or replaced); False
        when it already held the same text (no write request is made).
    :raises KubernetesConflict: the ConfigMap changed meanwhile.
    :raises KubernetesError: any other failure.
    """
    wanted = manifest(ledger, where)
    current = _read_raw(core_api, where)
    if current is None:
        k8s_client.call('CREATE %s' % where,
                        core_api.create_namespaced_config_map, where.namespace,
                        wanted, _preload_content=False)
        LOG.debug('Created %s', where)
        return True
    if (current.get('data') or {}).get(DATA_KEY) == wanted['data'][DATA_KEY]:
        return False
    body = dict(current)
    body['data'] = dict(current.get('data') or {}, **wanted['data'])
    k8s_client.call('REPLACE %s' % where,
                    core_api.replace_namespaced_config_map, where.name,
                    where.namespace, body, _preload_content=False)
    LOG.debug('Updated %s', where)
    return True


def host_roles(ledger: av_ledger.Ledger | None, host: str
               ) -> tuple[av_ledger.GpuAssignment, ...]:
    """The roles of ``host``'s GPUs (none without a ledger)."""
    return ledger.for_host(host) if ledger is not None else ()


def k8s_gpus(ledger: av_ledger.Ledger | None, host: str
             ) -> tuple[str, ...]:
    """PCI addresses of ``host``'s GPUs that Kubernetes may offer.

    For :func:`amdgpu_virt.k8s.node.devices.units_from_inventory` (``gpus``):
    a node agent offers exactly these.
    """
    return tuple(str(a.address) for a in host_roles(ledger, host)
                 if a.role in (Role.K8S_SHARED, Role.K8S_DEDICATED))


def node_gpus(core_api: Any, where: Location, host: str
              ) -> tuple[str, ...] | None:
    """What the node agent of ``host`` may offer, read from the ConfigMap.

    :returns: PCI addresses of the node's ``k8s-*`` GPUs; None when there
        is no ledger ConfigMap (a node agent then keeps its last good
        ledger, see :mod:`amdgpu_virt.k8s.node.roles`).
    :raises PlanError: the ConfigMap holds an invalid ledger.
    :raises KubernetesError: it cannot be read.
    """
    ledger = read(core_api, where)
    if ledger is None:
        return None
    return k8s_gpus(ledger, host)
