"""Reading and writing allocation records (ConfigMaps) through the API.

The thin adapter of :mod:`amdgpu_virt.k8s.record.allocation`: a record is read
with its ``resourceVersion`` and replaced with that version as a
precondition (create when it does not exist yet), so a concurrent writer
gets ``409 Conflict`` and :meth:`RecordStore.update` reads again and
re-applies its change.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.record import allocation as allocrecord

LOG = logging.getLogger(__name__)

DEFAULT_NAMESPACE = 'amdgpu-virt'

#: the new record, or None to leave it as it is
Change = Callable[[allocrecord.Record], allocrecord.Record | None]


class RecordStore:
    """Allocation records of a namespace over a ``CoreV1Api``.

    :param core_api: the API client.
    :param namespace: the project's namespace.
    :param attempts: tries of :meth:`update` before giving up on conflicts.
    """

    def __init__(self, core_api: Any, namespace: str = DEFAULT_NAMESPACE,
                 attempts: int = 20,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = core_api
        self.namespace = namespace
        self.attempts = attempts
        self.sleep = sleep

    def _where(self, node: str) -> str:
        return '%s/%s' % (self.namespace, allocrecord.configmap_name(node))

    def read(self, node: str) -> tuple[allocrecord.Record, str | None]:
        """(the record of ``node``, its resourceVersion or None if absent).

        :raises AllocationRecordError: the ConfigMap is unreadable.
        :raises KubernetesError: the API failed.
        """
        name = allocrecord.configmap_name(node)
        try:
            response = k8s_client.call('GET configmap %s' % self._where(node),
                                       self.api.read_namespaced_config_map,
                                       name, self.namespace,
                                       _preload_content=False)
        except exception.KubernetesNotFound:
            return allocrecord.Record(node), None
        try:
            obj = json.loads(response.data)
        except ValueError as err:
            raise exception.AllocationRecordError(
                record=self._where(node), reason='answer is not JSON: %s'
                % err) from None
        if not isinstance(obj, dict):
            raise exception.AllocationRecordError(
                record=self._where(node), reason='answer is not an object')
        meta = obj.get('metadata') or {}
        data = obj.get('data') or {}
        text = data.get(allocrecord.DATA_KEY) if isinstance(data, dict) \
            else None
        if text is None:
            record = allocrecord.Record(node)
        else:
            record = allocrecord.decode(text, node, self._where(node))
        return record, str(meta.get('resourceVersion') or '') or None

    def _write(self, node: str, record: allocrecord.Record,
               version: str | None) -> None:
        name = allocrecord.configmap_name(node)
        body: dict[str, Any] = {
            'apiVersion': 'v1', 'kind': 'ConfigMap',
            'metadata': {'name': name, 'namespace': self.namespace,
                         'labels': {allocrecord.COMPONENT_LABEL:
                                    allocrecord.COMPONENT}},
            'data': {allocrecord.DATA_KEY: allocrecord.encode(record)}}
        if version is None:
            # a concurrent create answers 409 AlreadyExists: a conflict
            k8s_client.call('POST configmap %s' % self._where(node),
                            self.api.create_namespaced_config_map,
                            self.namespace, body, _preload_content=False)
            return
        body['metadata']['resourceVersion'] = version
        k8s_client.call('PUT configmap %s' % self._where(node),
                        self.api.replace_namespaced_config_map, name,
                        self.namespace, body, _preload_content=False)

    def update(self, node: str, change: Change) -> allocrecord.Record:
        """Apply ``change`` to the current record until a write wins.

        :returns: the record as written (or as it was, if unchanged).
        :raises AllocationRecordError, SharingError: from ``change``.
        :raises KubernetesError: the API failed, or conflicts went on
            for :attr:`attempts` tries.
        """
        delay = 0.005
        for _attempt in range(self.attempts):
            record, version = self.read(node)
            new = change(record)
            if new is None or new == record:
                return record
            try:
                self._write(node, new, version)
                return new
            except exception.KubernetesConflict:
                LOG.debug('record of node %s changed; retrying', node)
            self.sleep(delay * (1 + random.random()))  # noqa: S311
            delay = min(delay * 2, 0.2)
        raise exception.KubernetesError(
            request='PUT configmap %s' % self._where(node),
            reason='still conflicting after %d attempts' % self.attempts)
