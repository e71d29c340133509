"""Events the node side records on its Node.

An Event's name is given by the caller, derived from what it reports, so
that recording the same thing twice is one object (the second create
answers 409, which the caller ignores).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client

#: where Events about Nodes go (as kubelet's)
NAMESPACE = 'default'
#: the component the node pods' events are reported by
NODE_AGENT = 'amdgpu-virt-agent'


def node_event(node: Mapping[str, Any], suffix: str, reason: str,
               kind: str, message: str, component: str,
               now: str) -> dict[str, Any]:
    """The Event ``<node>.<suffix>`` on ``node``.

    :param kind: ``Warning`` or ``Normal``.
    :param now: RFC 3339 time of the first and last occurrence.
    """
    meta = node.get('metadata') or {}
    name = str(meta.get('name', ''))
    return {
        'apiVersion': 'v1', 'kind': 'Event',
        'metadata': {'name': '%s.%s' % (name, suffix),
                     'namespace': NAMESPACE},
        'involvedObject': {'apiVersion': 'v1', 'kind': 'Node', 'name': name,
                           'uid': meta.get('uid')},
        'reason': reason, 'type': kind, 'message': message,
        'source': {'component': component, 'host': name},
        'firstTimestamp': now, 'lastTimestamp': now, 'count': 1,
        'reportingComponent': component, 'reportingInstance': name,
    }


def record(core_api: Any, body: Mapping[str, Any]) -> None:
    """Create the Event ``body`` (one of that name already there is the
    same report: the 409 is ignored).

    :raises KubernetesError: it could not be created.
    """
    with contextlib.suppress(exception.KubernetesConflict):
        k8s_client.call('CREATE event %s' % body['metadata']['name'],
                        core_api.create_namespaced_event, NAMESPACE, body,
                        _preload_content=False)
