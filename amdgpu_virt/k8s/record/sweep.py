"""Removing bookings of pods that are gone from the allocation records.

The extender books at filter time; a pod deleted, finished, or never
bound (its scheduler died between filter and bind) must not keep its
GPUs. :class:`Collector` removes a pod's booking as soon as the pod watch
reports it deleted or finished, sweeps every record as soon as the
extender has listed the pods (:meth:`Collector.sweep_soon`: at start, a
pod deleted while no extender ran is released at once, not an interval
later), and every ``interval`` seconds
(:func:`amdgpu_virt.k8s.record.allocation.prune`): read the records
first, then list the pods, so that a pod booked meanwhile
(always created before it is booked) is listed. A sweep also removes the
bookings of an unbound pod that are older than its current one (a filter
booked it again elsewhere and the removal of the earlier booking was
lost, say an extender killed in between), instead of leaving them until
``unbound_ttl``. The current booking is the one on the node the pod's
mirror annotation (``hami.io/vgpu-node``, written after the booking)
names, held by that node's record: the annotation only chooses among the
pod's own bookings, and a booking older than that one (by the record's
time) cannot be bound any more. A booking made since (a filter under way,
its mirror not written yet) is newer and stays, and so does every
booking when clocks disagree about which is older. Writes carry the
record's ``resourceVersion``; several extenders may collect at once.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)


def _live(items: list[Mapping[str, Any]]
          ) -> tuple[dict[str, str], dict[str, str]]:
    """(node name, ``''`` unbound, of every live pod by UID; the node the
    mirror annotation of each unbound one names)."""
    live = {}
    mirrored = {}
    for pod in items:
        meta = pod.get('metadata') or {}
        uid = meta.get('uid')
        if not isinstance(uid, str) or (pod.get('status') or {}).get(
                'phase') in allocrecord.DONE_PHASES:
            continue
        node = str((pod.get('spec') or {}).get('nodeName') or '')
        live[uid] = node
        annotations = meta.get('annotations')
        if not node and isinstance(annotations, Mapping):
            named = annotations.get(hami.VGPU_NODE)
            if isinstance(named, str) and named:
                mirrored[uid] = named
    return live, mirrored


def _newest(records: Mapping[str, allocrecord.Record],
            mirrored: Mapping[str, str]) -> dict[str, int]:
    """Per unbound pod, the time of its booking in the record (of
    ``records``, by node) of the node its mirror names, where that record
    holds it."""
    newest: dict[str, int] = {}
    for uid, node in mirrored.items():
        record = records.get(node)
        grants = record.pods.get(uid) if record is not None else None
        if grants is not None:
            newest[uid] = grants.time
    return newest


class Collector:
    """Event-driven and periodic removal of stale bookings.

    :param records: where the records are.
    :param core_api: for listing pods and records.
    :param interval: seconds between sweeps.
    :param unbound_ttl: seconds a booked pod may stay unbound.
    """

    #: seconds before a failed sweep is tried again
    RETRY = 5.0

    def __init__(self, records: recordstore.RecordStore, core_api: Any,
                 interval: float = 120.0, unbound_ttl: int = 300) -> None:
        self.records = records
        self.api = core_api
        self.interval = interval
        self.unbound_ttl = unbound_ttl
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        #: bookings removed (for observability and tests)
        self.removed = 0

    # events
    def pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Queue the removal of a deleted or finished pod's booking."""
        if kind != 'DELETED' and (obj.get('status') or {}).get(
                'phase') not in allocrecord.DONE_PHASES:
            return
        meta = obj.get('metadata') or {}
        annotations = meta.get('annotations') or {}
        uid = meta.get('uid')
        nodes = {(obj.get('spec') or {}).get('nodeName'),
                 annotations.get(hami.VGPU_NODE)
                 if isinstance(annotations, Mapping) else None}
        if not isinstance(uid, str):
            return
        for node in nodes:
            if isinstance(node, str) and node:
                self._queue.put((node, uid))

    def remove_later(self, node: str, uid: str) -> None:
        """Queue the removal of pod ``uid``'s booking on ``node`` (one
        whose removal failed elsewhere; the next sweep is the fallback)."""
        self._queue.put((node, uid))

    def sweep_soon(self) -> None:
        """Sweep now rather than at the end of the interval: the extender
        has just listed the pods (at start, or again after ``410 Gone``),
        and what it did not see meanwhile (pods deleted while it was down
        or while its watch was broken) must not keep GPUs booked for an
        interval."""
        self._wake.set()

    def remove(self, node: str, uid: str) -> None:
        record = self.records.update(
            node, lambda record: allocrecord.without(record, uid))
        if uid not in record.pods:
            self.removed += 1

    def sweep(self) -> int:
        """Prune every record once; :returns: bookings removed."""
        response = k8s_client.call(
            'LIST configmaps %s' % self.records.namespace,
            self.api.list_namespaced_config_map, self.records.namespace,
            label_selector='%s=%s' % (allocrecord.COMPONENT_LABEL,
                                      allocrecord.COMPONENT),
            _preload_content=False)
        nodes = []
        for item in json.loads(response.data).get('items') or []:
            text = (item.get('data') or {}).get(allocrecord.DATA_KEY)
            try:
                node = json.loads(text).get('node') if text else None
            except (ValueError, AttributeError):
                node = None
            if isinstance(node, str) and node:
                nodes.append(node)
        before = {}
        for node in nodes:
            before[node] = self.records.read(node)[0]
        response = k8s_client.call('LIST pods',
                                   self.api.list_pod_for_all_namespaces,
                                   _preload_content=False)
        live, mirrored = _live(json.loads(response.data).get('items') or [])
        now = int(time.time())
        newest = _newest(before, mirrored)
        removed = 0
        for node, record in before.items():
            if allocrecord.prune(record, live, now, self.unbound_ttl,
                                 newest) is record:
                continue
            new = self.records.update(node, functools.partial(
                self._prune, seen=frozenset(record.pods), live=live,
                now=now, newest=newest))
            removed += len(set(record.pods) - set(new.pods))
        self.removed += removed
        return removed

    def _prune(self, current: allocrecord.Record, seen: frozenset[str],
               live: Mapping[str, str], now: int,
               newest: Mapping[str, int]) -> allocrecord.Record:
        # what was booked after the pods were listed is kept (a booking
        # made again since the records were read is at least as new)
        known = dict(live)
        for uid in current.pods:
            if uid not in seen:
                known.setdefault(uid, '')
        return allocrecord.prune(current, known, now, self.unbound_ttl,
                                 newest)

    # threads
    def start(self) -> Collector:
        self.stopping.clear()
        for target, name in ((self._events, 'record-events'),
                             (self._sweeps, 'record-sweeps')):
            thread = threading.Thread(target=target, daemon=True, name=name)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

    def _events(self) -> None:
        while not self.stopping.is_set():
            item = self._queue.get()
            if item is None:
                return
            try:
                self.remove(*item)
            except exception.AmdgpuVirtError as err:
                LOG.warning('booking of pod uid %s on node %s not removed '
                            '(the next sweep retries): %s', item[1], item[0],
                            err)

    def _sweeps(self) -> None:
        wait = self.interval
        while True:
            self._wake.wait(wait)
            if self.stopping.is_set():
                return
            self._wake.clear()
            try:
                removed = self.sweep()
                if removed:
                    LOG.info('Removed %d stale bookings', removed)
                wait = self.interval
            except Exception as err:  # keep sweeping whatever happened
                # soon again: a sweep asked for at start may meet an API
                # server that is not answering yet
                wait = min(self.interval, self.RETRY)
                LOG.warning('record sweep failed (retried in %g s): %s',
                            wait, err)
