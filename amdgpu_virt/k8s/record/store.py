"""Reading and writing allocation records (ConfigMaps) through the API.

The thin adapter of :mod:`amdgpu_virt.k8s.record.allocation`: a record is read
with its ``resourceVersion`` and replaced with that version as a
precondition (create when it does not exist yet), so a concurrent writer
gets ``409 Conflict`` and :meth:`RecordStore.update` reads again and
re-applies its change.

The store keeps the last version of each record it read or wrote. An
update first applies its change to that copy and writes it with that
version as the precondition: when no one else wrote the record since (a
filter books on the node the previous one booked on, as packing does),
the read is saved; when someone did, the write gets ``409`` and the
update reads the record and starts again, as without the copy. The copy
only ever saves a read before a guarded write: a change that leaves the
copy as it is, or refuses it (no room), is decided again on a fresh
read, so nothing is concluded from a copy that may be stale.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import threading
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
    :param known: records whose last version is kept, at most (the least
        recently used go first).
    """

    def __init__(self, core_api: Any, namespace: str = DEFAULT_NAMESPACE,
                 attempts: int = 20,
                 sleep: Callable[[float], None] = time.sleep,
                 known: int = 65536) -> None:
        self.api = core_api
        self.namespace = namespace
        self.attempts = attempts
        self.sleep = sleep
        self.known = max(0, known)
        #: node -> (record, resourceVersion) last read or written
        self._known: collections.OrderedDict[
            str, tuple[allocrecord.Record, str]] = collections.OrderedDict()
        self._lock = threading.Lock()
        #: reads saved by the kept versions, and writes they lost to
        #: another writer (for observability and tests)
        self.reads_saved = 0
        self.stale_writes = 0

    def _keep(self, node: str, record: allocrecord.Record,
              version: str | None) -> None:
        with self._lock:
            if version is None or not self.known:
                self._known.pop(node, None)
                return
            self._known[node] = (record, version)
            self._known.move_to_end(node)
            while len(self._known) > self.known:
                self._known.popitem(last=False)

    def _kept(self, node: str) -> tuple[allocrecord.Record, str] | None:
        with self._lock:
            return self._known.get(node)

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
        version = str(meta.get('resourceVersion') or '') or None
        self._keep(node, record, version)
        return record, version

    def _write(self, node: str, record: allocrecord.Record,
               version: str | None) -> str | None:
        """:returns: the record's new resourceVersion (None: unknown)."""
        name = allocrecord.configmap_name(node)
        body: dict[str, Any] = {
            'apiVersion': 'v1', 'kind': 'ConfigMap',
            'metadata': {'name': name, 'namespace': self.namespace,
                         'labels': {allocrecord.COMPONENT_LABEL:
                                    allocrecord.COMPONENT}},
            'data': {allocrecord.DATA_KEY: allocrecord.encode(record)}}
        if version is None:
            # a concurrent create answers 409 AlreadyExists: a conflict
            response = k8s_client.call(
                'POST configmap %s' % self._where(node),
                self.api.create_namespaced_config_map, self.namespace, body,
                _preload_content=False)
        else:
            body['metadata']['resourceVersion'] = version
            response = k8s_client.call(
                'PUT configmap %s' % self._where(node),
                self.api.replace_namespaced_config_map, name,
                self.namespace, body, _preload_content=False)
        try:
            written = json.loads(response.data)['metadata'][
                'resourceVersion']
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return written if isinstance(written, str) and written else None

    def update(self, node: str, change: Change) -> allocrecord.Record:
        """Apply ``change`` to the current record until a write wins.

        :returns: the record as written (or as it was, if unchanged).
        :raises AllocationRecordError, SharingError: from ``change``.
        :raises KubernetesError: the API failed, or conflicts went on
            for :attr:`attempts` tries.
        """
        delay = 0.005
        kept = self._kept(node)
        for _attempt in range(self.attempts):
            new: allocrecord.Record | None = None
            version: str | None
            from_kept = kept is not None
            if kept is not None:
                # the last version seen, if the change writes something
                # there; anything else is decided on a fresh read
                record, version = kept
                kept = None
                try:
                    new = change(record)
                except exception.AmdgpuVirtError:
                    new = None
                if new is None or new == record:
                    new = None
                    from_kept = False
                else:
                    self.reads_saved += 1
            if new is None:
                record, version = self.read(node)
                new = change(record)
                if new is None or new == record:
                    return record
            try:
                self._keep(node, new, self._write(node, new, version))
                return new
            except exception.KubernetesConflict:
                LOG.debug('record of node %s changed; retrying', node)
                with self._lock:
                    self._known.pop(node, None)
                if from_kept:
                    # the copy was stale: read and try again at once
                    self.stale_writes += 1
                    self.reads_saved -= 1
                    continue
            self.sleep(delay * (1 + random.random()))  # noqa: S311
            delay = min(delay * 2, 0.2)
        raise exception.KubernetesError(
            request='PUT configmap %s' % self._where(node),
            reason='still conflicting after %d attempts' % self.attempts)
