"""Namespace labels, read through the API and cached for a while.

Namespace labels are set by administrators (a pod's owner cannot set
them), so components use them for rules a pod must not escape: the
webhook's tenancy rule, the extender's memory enforcement requirement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from amdgpu_virt.k8s.api import client as k8s_client


class NamespaceLabelCache:
    """Namespace labels read through a ``CoreV1Api``, cached for ``ttl``
    seconds.

    :raises KubernetesError: (when called) the namespace cannot be read;
        callers fail closed.
    """

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
        what = 'GET namespace %s' % namespace
        body = k8s_client.json_body(what, k8s_client.call(
            what, self.api.read_namespace, namespace,
            _preload_content=False))
        labels = (body.get('metadata') or {}).get('labels') or {}
        result = {str(k): str(v) for k, v in labels.items()} \
            if isinstance(labels, dict) else {}
        with self._lock:
            self._cache[namespace] = (now, result)
        return result
