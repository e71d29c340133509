"""The extender's in-memory view of the cluster's AMD GPUs.

:class:`ClusterCache` holds what the filter needs from nodes (their
``hami.io/node-amd-register``) and pods (their
``hami.io/amd-devices-allocated`` and ``hami.io/amd-cu-allocated``), fed
object by object (:meth:`ClusterCache.set_node`, :meth:`set_pod`, ...) by
:class:`Watcher` threads that list once and then watch from the list's
resourceVersion, listing again on ``410 Gone``. A decision is taken on the
cache, never on a fresh list.

What a filter decides is *reserved* in the cache at once, under the same
lock as the decision, so that concurrent requests cannot give the same
CUs twice before the watch shows the pod's new annotations. A reservation
ends when the watch delivers the pod at or after the version that the
annotation write returned, when the pod is deleted, or when the write
failed.

Bad annotations written by someone else never stop the cache: a device
that cannot be read is left out of its node; a node whose registration
cannot be read at all offers nothing; a live pod whose allocation cannot
be read makes its node take nothing more until it is fixed or gone (fail
closed: its usage is unknown). Each is logged once per change.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import json
import logging
import operator
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import fit
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami

LOG = logging.getLogger(__name__)

DONE_PHASES = ('Succeeded', 'Failed')


@dataclasses.dataclass(frozen=True)
class NodeEntry:
    """What a node registers: its usable AMD devices, or why none."""

    name: str
    devices: tuple[hami.DeviceInfo, ...]
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class PodEntry:
    """A live pod holding (or about to hold) AMD GPUs of a node."""

    key: str
    node: str
    devices: hami.PodDevices
    cu_masks: Mapping[str, int] | None = None
    problem: str | None = None
    resource_version: int | None = None
    value: str = ''


@dataclasses.dataclass
class _Reservation:
    node: str | None
    devices: hami.PodDevices
    value: str
    #: resourceVersion the annotation write returned (None: in flight)
    resource_version: int | None = None


def _rv(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get('metadata') or {}).get('resourceVersion')
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get('metadata') or {}
    return '%s/%s' % (meta.get('namespace', ''), meta.get('name', ''))


def decode_node(obj: Mapping[str, Any],
                resource: str = hami.RESOURCE_GPU) -> NodeEntry:
    """A node's usable AMD devices; never raises on bad annotations."""
    meta = obj.get('metadata') or {}
    name = str(meta.get('name', ''))
    annotations = meta.get('annotations') or {}
    value = annotations.get(hami.NODE_REGISTER) \
        if isinstance(annotations, Mapping) else None
    if not isinstance(value, str):
        return NodeEntry(name, ())
    capacity = ((obj.get('status') or {}).get('capacity') or {}).get(
        resource)
    if capacity is not None and str(capacity) == '0':
        return NodeEntry(name, (), 'node reports %s capacity 0 (device '
                         'plugin down or every GPU unhealthy)' % resource)
    try:
        devices = hami.decode_node_register(value)
    except exception.HamiProtocolError as err:
        salvaged = _salvage(name, value)
        if salvaged is None:
            LOG.warning('node %s: %s unreadable, offering nothing: %s',
                        name, hami.NODE_REGISTER, err)
            return NodeEntry(name, (), 'unreadable %s: %s' % (
                hami.NODE_REGISTER, err))
        devices = salvaged
    usable = []
    seen: set[str] = set()
    for device in devices:
        if not device.is_amd:
            continue
        problem = fit.usable_device(device)
        if problem is None and device.id.lower() in seen:
            problem = 'registered twice'
        if problem:
            LOG.warning('node %s: device %r of %s skipped: %s', name,
                        device.id, hami.NODE_REGISTER, problem)
            continue
        seen.add(device.id.lower())
        usable.append(device)
    return NodeEntry(name, tuple(usable))


def _salvage(name: str, value: str) -> tuple[hami.DeviceInfo, ...] | None:
    """The readable entries of a JSON registration with bad ones."""
    try:
        entries = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(entries, list):
        return None
    devices: list[hami.DeviceInfo] = []
    for number, entry in enumerate(entries):
        try:
            devices.extend(hami.decode_node_register(json.dumps([entry])))
        except (exception.HamiProtocolError, TypeError, ValueError) as bad:
            LOG.warning('node %s: device %d of %s skipped: %s', name,
                        number, hami.NODE_REGISTER, bad)
    return tuple(devices)


def decode_pod(obj: Mapping[str, Any]) -> PodEntry | None:
    """The GPUs a live pod holds, or None when it holds none.

    A bad allocation annotation gives an entry with ``problem`` set (its
    node then takes nothing more); it never raises.
    """
    meta = obj.get('metadata') or {}
    annotations = meta.get('annotations') or {}
    if not isinstance(annotations, Mapping):
        return None
    key_name = hami.DEVICES_ALLOCATED
    value = annotations.get(key_name)
    if value is None:
        key_name = hami.DEVICES_TO_ALLOCATE
        value = annotations.get(key_name)
    if value is None:
        return None
    spec = obj.get('spec') or {}
    node = spec.get('nodeName') or annotations.get(hami.VGPU_NODE)
    if not node or (obj.get('status') or {}).get('phase') in DONE_PHASES:
        return None
    key = pod_key(obj)
    rv = _rv(obj)
    try:
        if not isinstance(value, str):
            raise exception.HamiProtocolError(key=key_name, value=value,
                                              reason='not a string')
        devices = hami.decode_pod_devices(value, key_name)
        masks = None
        cu_value = annotations.get(hami.CU_ALLOCATED)
        if cu_value:
            masks = hami.decode_cu_allocated(str(cu_value))
    except exception.HamiProtocolError as err:
        LOG.warning('pod %s: %s; node %s takes no more GPU pods until it '
                    'is fixed or gone', key, err, node)
        return PodEntry(key, str(node), (), None,
                        'pod %s carries an unreadable annotation (%s); '
                        'nothing more is placed on this node until it is '
                        'fixed or gone' % (key, err), rv, '')
    return PodEntry(key, str(node), devices, masks, None, rv, value)


class ClusterCache:
    """Nodes, pods and reservations, guarded by one lock.

    :param strategy: the device plugin's CU strategy (for the CU view).
    """

    def __init__(self, strategy: allocator.CuStrategy | None = None,
                 resource: str = hami.RESOURCE_GPU) -> None:
        self.strategy = strategy or allocator.BestFitStrategy()
        self.resource = resource
        self.lock = threading.RLock()
        self._nodes: dict[str, NodeEntry] = {}
        self._pods: dict[str, PodEntry] = {}
        self._reserved: dict[str, _Reservation] = {}
        #: node -> keys of pods whose effective placement is there
        self._by_node: dict[str, set[str]] = {}
        self._placed: dict[str, str] = {}
        #: a view per known node; those in ``_dirty`` are out of date
        self._views: dict[str, fit.NodeView] = {}
        self._dirty: set[str] = set()
        #: (rank, name) of every view, sorted, for each node policy
        self._by_binpack: list[tuple[float, str]] = []
        self._by_spread: list[tuple[float, str]] = []
        #: nodes that register no AMD GPU (and have no problem)
        self._without_gpus: set[str] = set()
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()

    # -- state ----------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.nodes_synced.is_set() and self.pods_synced.is_set()

    def node_count(self) -> int:
        with self.lock:
            return len(self._nodes)

    def pod_count(self) -> int:
        with self.lock:
            return len(self._pods)

    def reservation_count(self) -> int:
        with self.lock:
            return len(self._reserved)

    def _effective(self, key: str
                   ) -> tuple[str | None, hami.PodDevices, Any, str | None]:
        reservation = self._reserved.get(key)
        if reservation is not None:
            return reservation.node, reservation.devices, None, None
        entry = self._pods.get(key)
        if entry is None:
            return None, (), None, None
        return entry.node, entry.devices, entry.cu_masks, entry.problem

    def _refresh(self, key: str) -> None:
        """Move ``key`` to the node of its effective placement."""
        old = self._placed.pop(key, None)
        if old is not None:
            self._by_node.get(old, set()).discard(key)
            self._dirty.add(old)
        node = self._effective(key)[0]
        if node is not None:
            self._placed[key] = node
            self._by_node.setdefault(node, set()).add(key)
            self._dirty.add(node)

    # -- feeding --------------------------------------------------------

    def set_node(self, obj: Mapping[str, Any]) -> None:
        entry = decode_node(obj, self.resource)
        with self.lock:
            if self._nodes.get(entry.name) != entry:
                self._nodes[entry.name] = entry
                self._dirty.add(entry.name)

    def delete_node(self, name: str) -> None:
        with self.lock:
            self._nodes.pop(name, None)
            self._dirty.add(name)

    def replace_nodes(self, objs: Iterable[Mapping[str, Any]]) -> None:
        entries = [decode_node(obj, self.resource) for obj in objs]
        with self.lock:
            self._nodes = {entry.name: entry for entry in entries}
            self._views.clear()
            self._dirty = set(self._nodes)
            self.nodes_synced.set()

    def set_pod(self, obj: Mapping[str, Any]) -> None:
        entry = decode_pod(obj)
        key = pod_key(obj)
        with self.lock:
            if entry is None:
                if self._pods.pop(key, None) is None and \
                        key not in self._reserved:
                    return
            else:
                self._pods[key] = entry
            self._settle(key, _rv(obj), entry)
            self._refresh(key)

    def _settle(self, key: str, rv: int | None,
                entry: PodEntry | None) -> None:
        """End the reservation of ``key`` once the watch caught up."""
        reservation = self._reserved.get(key)
        if reservation is None or reservation.resource_version is None:
            return
        if rv is not None and rv >= reservation.resource_version or \
                rv is None and entry is not None and \
                entry.value == reservation.value:
            del self._reserved[key]

    def delete_pod(self, obj: Mapping[str, Any]) -> None:
        key = pod_key(obj)
        with self.lock:
            self._pods.pop(key, None)
            self._reserved.pop(key, None)
            self._refresh(key)

    def replace_pods(self, objs: Iterable[Mapping[str, Any]],
                     list_rv: int | None = None) -> None:
        """A fresh list: every pod entry is replaced; reservations the
        list already shows end."""
        pairs = [(pod_key(obj), _rv(obj), decode_pod(obj)) for obj in objs]
        with self.lock:
            self._pods = {key: entry for key, _rv_, entry in pairs
                          if entry is not None}
            listed = {key for key, _rv_, _entry in pairs}
            for key, reservation in list(self._reserved.items()):
                if reservation.resource_version is not None and (
                        key not in listed or list_rv is not None and
                        reservation.resource_version <= list_rv):
                    del self._reserved[key]
            self._by_node.clear()
            self._placed.clear()
            self._dirty = set(self._nodes)
            for key in set(self._pods) | set(self._reserved):
                self._refresh(key)
            self.pods_synced.set()

    # -- views and decisions --------------------------------------------

    def _sync_views(self) -> None:
        """Rebuild the views of the nodes that changed, and keep the nodes
        ranked by both node policies (lock held)."""
        full = len(self._dirty) * 4 > len(self._views)
        for name in self._dirty:
            old = self._views.pop(name, None)
            if old is not None and not full:
                for ranks, key in ((self._by_binpack, old.rank_binpack),
                                   (self._by_spread, old.rank_spread)):
                    index = bisect.bisect_left(ranks, key)
                    if index < len(ranks) and ranks[index] == key:
                        del ranks[index]
            entry = self._nodes.get(name)
            if entry is None:
                self._without_gpus.discard(name)
                continue
            view = self._build(entry)
            self._views[name] = view
            if not full:
                bisect.insort(self._by_binpack, view.rank_binpack)
                bisect.insort(self._by_spread, view.rank_spread)
            if view.gpus or view.problem:
                self._without_gpus.discard(name)
            else:
                self._without_gpus.add(name)
        self._dirty.clear()
        if full:
            self._by_binpack = sorted(v.rank_binpack
                                      for v in self._views.values())
            self._by_spread = sorted(v.rank_spread
                                     for v in self._views.values())

    def view(self, name: str) -> fit.NodeView | None:
        """The node's view, or None when the node is unknown."""
        with self.lock:
            if self._dirty:
                self._sync_views()
            return self._views.get(name)

    def _build(self, entry: NodeEntry) -> fit.NodeView:
        problem = entry.problem
        usages: list[fit.PodUsage] = []
        for key in sorted(self._by_node.get(entry.name, ())):
            _node, devices, masks, pod_problem = self._effective(key)
            if pod_problem and not problem:
                problem = pod_problem
            usages.append((key, devices, masks))
        return fit.build_view(entry.name, entry.devices, usages,
                              self.strategy, problem)

    def views(self, names: Iterable[str]
              ) -> tuple[list[fit.NodeView], list[str]]:
        """(views of the known nodes, names of unknown ones)."""
        names = list(names)
        with self.lock:
            if self._dirty:
                self._sync_views()
            cached = self._views
            if len(names) > 1:
                try:
                    return list(operator.itemgetter(*names)(cached)), []
                except KeyError:
                    pass
            known: list[fit.NodeView] = []
            unknown: list[str] = []
            for name in names:
                view = cached.get(name)
                if view is None:
                    unknown.append(name)
                else:
                    known.append(view)
            return known, unknown

    def decide_and_reserve(self, key: str, request: fit.PodRequest,
                           names: Sequence[str]) -> fit.Decision:
        """Decide for pod ``key`` and reserve the result at once.

        What the pod held from an earlier decision does not count against
        it. Without a fit, nothing changes.
        """
        with self.lock:
            previous = self._reserved.get(key)
            self._reserved[key] = _Reservation(None, (), '')
            self._refresh(key)
            decision = self._decide(request, names)
            if decision.fit is None:
                if previous is None:
                    del self._reserved[key]
                else:
                    self._reserved[key] = previous
            else:
                self._reserved[key] = _Reservation(
                    decision.fit.node, decision.fit.containers,
                    hami.encode_pod_devices(decision.fit.containers))
            self._refresh(key)
            return decision

    def _decide(self, request: fit.PodRequest,
                names: Sequence[str]) -> fit.Decision:
        """:func:`fit.decide_in_order` over the ranked nodes (lock held)."""
        if self._dirty:
            self._sync_views()
        wanted = set(names)
        unknown = wanted - self._views.keys()
        known = wanted - unknown if unknown else wanted
        ranks = self._by_spread if request.node_policy == 'spread' \
            else self._by_binpack
        views = self._views
        ordered = (views[name] for _rank, name in ranks if name in known)
        return fit.decide_in_order(ordered, known, request, unknown,
                                   self.strategy, self._without_gpus)

    def confirm(self, key: str, resource_version: int | None) -> None:
        """The annotations of ``key`` were written at this version."""
        with self.lock:
            reservation = self._reserved.get(key)
            if reservation is None:
                return
            reservation.resource_version = resource_version
            entry = self._pods.get(key)
            if entry is not None and resource_version is not None and \
                    entry.resource_version is not None and \
                    entry.resource_version >= resource_version:
                del self._reserved[key]
                self._refresh(key)

    def cancel(self, key: str) -> None:
        """Forget the reservation of ``key`` (its write failed)."""
        with self.lock:
            if self._reserved.pop(key, None) is not None:
                self._refresh(key)

    def placement(self, key: str) -> str | None:
        """The node pod ``key`` holds GPUs on (reserved or seen)."""
        with self.lock:
            return self._placed.get(key)


# --- feeding the cache from the API ----------------------------------------

ListFunc = Callable[..., Any]


class Watcher:
    """List once, then watch from the list's version; list again on 410.

    :param name: what is watched (for logs), e.g. ``pods``.
    :param list_func: a ``CoreV1Api`` list method (called with
        ``_preload_content=False``; with ``watch=True`` for the stream).
    :param on_list: called with the listed items and the list's version.
    :param on_event: called with (type, object) of each event.
    :param timeout: seconds a watch request lasts before it is renewed.
    :param after_list: called after each list has been applied.
    """

    def __init__(self, name: str, list_func: ListFunc,
                 on_list: Callable[[list[dict[str, Any]], int | None], None],
                 on_event: Callable[[str, dict[str, Any]], None],
                 timeout: int = 300, backoff: float = 1.0,
                 after_list: Callable[[], None] | None = None) -> None:
        self.name = name
        self.list_func = list_func
        self.on_list = on_list
        self.on_event = on_event
        self.timeout = timeout
        self.backoff = backoff
        self.after_list = after_list
        self.stopping = threading.Event()
        #: lists done (1 after start; more after 410 Gone)
        self.lists = 0
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='watch-%s' % self.name)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        response = self._response
        if response is not None:
            try:
                # shutdown() unblocks a read in progress (urllib3 2.3+)
                getattr(response, 'shutdown', response.close)()
            except Exception:  # closing a half-read stream may fail
                LOG.debug('closing the %s watch failed', self.name,
                          exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _list(self) -> str:
        response = self.list_func(_preload_content=False)
        data = json.loads(response.data)
        version = (data.get('metadata') or {}).get('resourceVersion') or ''
        try:
            rv: int | None = int(version)
        except ValueError:
            rv = None
        self.on_list(list(data.get('items') or []), rv)
        self.lists += 1
        if self.after_list is not None:
            self.after_list()
        LOG.info('Listed %d %s at version %s', len(data.get('items') or []),
                 self.name, version)
        return str(version)

    def _run(self) -> None:
        from kubernetes.watch import watch as k8s_watch

        version = ''
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self._list()
                response = self.list_func(
                    watch=True, resource_version=version,
                    timeout_seconds=self.timeout,
                    allow_watch_bookmarks=True, _preload_content=False)
                self._response = response
                try:
                    for line in k8s_watch.iter_resp_lines(response):
                        if self.stopping.is_set():
                            break
                        if not line:
                            continue
                        event = json.loads(line)
                        kind = event.get('type')
                        obj = event.get('object') or {}
                        if kind == 'ERROR':
                            LOG.info('%s watch at %s ended: %s', self.name,
                                     version, obj.get('message'))
                            if obj.get('code') == 410:
                                version = ''
                            break
                        new = (obj.get('metadata') or {}).get(
                            'resourceVersion')
                        if kind != 'BOOKMARK':
                            self.on_event(str(kind), obj)
                        if new:
                            version = str(new)
                finally:
                    self._response = None
                    response.release_conn()
            except Exception as err:  # keep watching whatever happened
                if self.stopping.is_set():
                    return
                LOG.warning('%s watch failed (%s); retrying', self.name, err)
                self.stopping.wait(self.backoff)


def pod_event(cache: ClusterCache) -> Callable[[str, dict[str, Any]], None]:
    def apply(kind: str, obj: dict[str, Any]) -> None:
        if kind == 'DELETED':
            cache.delete_pod(obj)
        else:
            cache.set_pod(obj)
    return apply


def node_event(cache: ClusterCache) -> Callable[[str, dict[str, Any]], None]:
    def apply(kind: str, obj: dict[str, Any]) -> None:
        if kind == 'DELETED':
            cache.delete_node(str((obj.get('metadata') or {}).get('name')))
        else:
            cache.set_node(obj)
    return apply


def _settle_memory() -> None:
    """After a list: what was loaded is long-lived; keep it out of the
    cyclic garbage collector's full passes, which would otherwise pause
    decisions for tens of milliseconds on a large cluster."""
    gc.collect()
    gc.freeze()


def watchers(cache: ClusterCache, core_api: Any,
             timeout: int = 300) -> tuple[Watcher, Watcher]:
    """The node and pod watchers that feed ``cache`` (not started)."""
    return (
        Watcher('nodes', core_api.list_node,
                lambda items, _rv: cache.replace_nodes(items),
                node_event(cache), timeout, after_list=_settle_memory),
        Watcher('pods', core_api.list_pod_for_all_namespaces,
                cache.replace_pods, pod_event(cache), timeout,
                after_list=_settle_memory))
