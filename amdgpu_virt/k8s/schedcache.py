"""The extender's in-memory view of the cluster's AMD GPUs.

:class:`ClusterCache` holds what the filter needs from nodes (their
``hami.io/node-amd-register``) and pods (their
``hami.io/amd-devices-allocated`` and ``hami.io/amd-cu-allocated``), fed
object by object (:meth:`ClusterCache.set_node`, :meth:`set_pod`, ...) by
the watchers of :mod:`amdgpu_virt.k8s.watching`. A decision is taken on
the cache, never on a fresh list.

What a filter decides is *reserved* in the cache at once, under the same
lock as the decision, so that concurrent requests cannot give the same
CUs twice before the watch shows the pod's new annotations. A reservation
ends when the watch delivers the pod at or after the version that the
annotation write returned, when the pod is deleted, or when the write
failed.

Each node's view carries a summary (free CUs, free memory and free slots
per GPU, idle GPUs) and the node sits in two bucketed indexes kept as
views change: by the most free CUs one GPU with a free slot has (in
1/:data:`BUCKETS` of a GPU) and by its idle GPUs. With a
:class:`~amdgpu_virt.sharing.packing.Mix` (the fragmentation score), a
``binpack`` pod is only tried on nodes whose bucket can hold it, tightest
first, and placed where the expected fragmentation grows least among the
first ``candidates`` nodes that fit: a decision does not rescan the
cluster.

Bad annotations written by someone else never stop the cache: a device
that cannot be read is left out of its node; a node whose registration
cannot be read at all offers nothing; a live pod whose allocation cannot
be read makes its node take nothing more until it is fixed or gone (fail
closed: its usage is unknown). Each is logged once per change.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
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
from amdgpu_virt.k8s import fitrank
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

LOG = logging.getLogger(__name__)

DONE_PHASES = ('Succeeded', 'Failed')
#: buckets of the free-CU index (one per 1/BUCKETS of a GPU)
BUCKETS = 32
_MISSING = object()
_UNKNOWN = ('node unknown to the extender (no such node, or the cache is '
            'not up to date yet)')


def share_bucket(view: fit.NodeView) -> int:
    """The free-CU bucket of ``view`` (-1: no GPU takes a share)."""
    if view.problem:
        return -1
    best = max((f.cus for f in view.frees if f.slot and f.mem > 0),
               default=0.0)
    return int(best * BUCKETS) if best > 0 else -1


def idle_bucket(view: fit.NodeView) -> int:
    """The idle-GPU bucket of ``view`` (0: none idle, or a problem)."""
    return 0 if view.problem else view.idle_gpus


def free_bucket(view: fit.NodeView) -> int:
    """Free CUs of the whole node in quarters of a GPU (the order within
    the other buckets: the tightest nodes first)."""
    return int(4 * (view.partial_free + view.idle_gpus))


def buckets_of(view: fit.NodeView) -> tuple[int, int, int]:
    """(share bucket, idle bucket, free bucket) of ``view``."""
    return share_bucket(view), idle_bucket(view), free_bucket(view)


_Index = dict[int, dict[int, dict[str, None]]]


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

    :param mix: rank ``binpack`` pods by the fragmentation score of this
        request mix (None: HAMi's order, the busiest node first).
    :param candidates: nodes that fit to compare, at most, per decision.
    """

    def __init__(self, strategy: allocator.CuStrategy | None = None,
                 resource: str = hami.RESOURCE_GPU,
                 mix: packing.Mix | None = None,
                 candidates: int = 256) -> None:
        self.strategy = strategy or allocator.BestFitStrategy()
        self.resource = resource
        self.mix = mix
        self.candidates = max(1, candidates)
        #: name -> (share bucket, idle bucket) of each indexed node
        self._bucket_of: dict[str, tuple[int, int, int]] = {}
        #: share bucket or idle GPUs -> free bucket -> node names
        self._shares: _Index = {}
        self._idle: _Index = {}
        #: (node signature, request shape) -> its best placement's cost
        self._costs = fitrank.KeyMemo()
        #: the last candidate names and what they resolved to
        self._names: Sequence[str] | None = None
        self._wanted: tuple[set[str], set[str]] = (set(), set())
        #: most memory of one GPU (request memory as a fraction), fewest
        #: CUs of one GPU
        self.reference_mem = 0
        self._min_devcore = allocator.MAX_CUS
        #: nodes by registration shape (GPU memory sizes), for the
        #: "never fits" answers
        self._shapes: dict[tuple[int, ...], dict[str, None]] = {}
        self._shape_of: dict[str, tuple[int, ...]] = {}
        #: nodes that take nothing now, and why
        self._problems: dict[str, str] = {}
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
            self._bucket_of.clear()
            self._shares.clear()
            self._idle.clear()
            self._shapes.clear()
            self._shape_of.clear()
            self._problems.clear()
            self._names = None
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
        pods: dict[str, PodEntry] = {}
        listed: set[str] = set()
        for obj in objs:
            entry = decode_pod(obj)
            if entry is None:
                listed.add(pod_key(obj))
            else:
                listed.add(entry.key)
                pods[entry.key] = entry
        with self.lock:
            self._pods = pods
            for key, reservation in list(self._reserved.items()):
                if reservation.resource_version is not None and (
                        key not in listed or list_rv is not None and
                        reservation.resource_version <= list_rv):
                    del self._reserved[key]
            # every placement afresh (what _refresh does, key by key)
            self._by_node.clear()
            self._placed.clear()
            self._dirty = set(self._nodes)
            for key in pods.keys() | self._reserved.keys():
                node = self._effective(key)[0]
                if node is not None:
                    self._placed[key] = node
                    self._by_node.setdefault(node, set()).add(key)
                    self._dirty.add(node)
            self.pods_synced.set()

    # -- views and decisions --------------------------------------------

    def _sync_views(self) -> None:
        """Rebuild the views of the nodes that changed, and keep the nodes
        ranked by both node policies (lock held)."""
        full = len(self._dirty) * 4 > len(self._views)
        if self._dirty - self._views.keys() or \
                self._dirty - self._nodes.keys():
            self._names = None   # the known nodes change
        for name in self._dirty:
            self._unindex(name)
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
            self._index(view)
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

    def _index(self, view: fit.NodeView) -> None:
        for gpu in view.gpus:
            if gpu.info.devmem > self.reference_mem:
                self.reference_mem = gpu.info.devmem
            if gpu.info.devcore < self._min_devcore:
                self._min_devcore = gpu.info.devcore
        if view.problem:
            self._problems[view.name] = view.problem
        elif view.gpus:
            shape = tuple(sorted(g.info.devmem for g in view.gpus))
            self._shape_of[view.name] = shape
            self._shapes.setdefault(shape, {})[view.name] = None
        buckets = buckets_of(view)
        self._bucket_of[view.name] = buckets
        if buckets[0] >= 0:
            self._shares.setdefault(buckets[0], {}).setdefault(
                buckets[2], {})[view.name] = None
        if buckets[1]:
            self._idle.setdefault(buckets[1], {}).setdefault(
                buckets[2], {})[view.name] = None

    def _unindex(self, name: str) -> None:
        self._problems.pop(name, None)
        shape = self._shape_of.pop(name, None)
        if shape is not None:
            group = self._shapes[shape]
            group.pop(name, None)
            if not group:
                del self._shapes[shape]
        buckets = self._bucket_of.pop(name, None)
        if buckets is None:
            return
        for index, key in ((self._shares, buckets[0]),
                           (self._idle, buckets[1])):
            row = index.get(key)
            if row is None:
                continue
            names = row[buckets[2]]
            del names[name]
            if not names:
                del row[buckets[2]]
                if not row:
                    del index[key]

    def index_snapshot(self) -> dict[str, tuple[int, int, int]]:
        """name -> (share bucket, idle bucket, free bucket) of every node
        in the indexes, read back from them (for checks against a
        recomputation, see :func:`buckets_of`)."""
        with self.lock:
            if self._dirty:
                self._sync_views()
            shares: dict[str, tuple[int, int]] = {}
            idle: dict[str, tuple[int, int]] = {}
            for index, found in ((self._shares, shares),
                                 (self._idle, idle)):
                for key, row in index.items():
                    for free, names in row.items():
                        for name in names:
                            found[name] = (key, free)
            result = {}
            for name in shares.keys() | idle.keys():
                free = (shares.get(name) or idle[name])[1]
                result[name] = (shares.get(name, (-1, 0))[0],
                                idle.get(name, (0, 0))[0], free)
            return result

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
            if self.mix is not None and request.node_policy == 'binpack':
                if self._dirty:
                    self._sync_views()
                self.mix.record(request.shapes(self.reference_mem))
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

    def _known(self, names: Sequence[str]) -> tuple[set[str], set[str]]:
        """(known, unknown) names; the last answer is kept while the
        names and the known nodes stay the same (lock held)."""
        if self._names is not None and (names is self._names or
                                        names == self._names):
            return self._wanted
        wanted = set(names)
        unknown = wanted - self._views.keys()
        known = wanted - unknown if unknown else wanted
        self._names = names
        self._wanted = (known, unknown)
        return self._wanted

    def _decide(self, request: fit.PodRequest,
                names: Sequence[str]) -> fit.Decision:
        """Only the nodes whose buckets may hold ``request`` are tried:
        the packed decision, or the first that fits in the order of the
        pod's node policy (lock held)."""
        if self._dirty:
            self._sync_views()
        known, unknown = self._known(names)
        unresolvable = self._unresolvable(request, known, unknown)
        if self.mix is not None and request.node_policy == 'binpack':
            return self._decide_packed(request, known, unresolvable)
        ranks = self._by_spread if request.node_policy == 'spread' \
            else self._by_binpack
        views = self._views
        if self._candidate_count(request) * 8 < len(ranks):
            rank = operator.attrgetter(
                'rank_spread' if request.node_policy == 'spread'
                else 'rank_binpack')
            ordered: Iterable[fit.NodeView] = sorted(
                (views[name] for name in self._candidate_names(request)
                 if name in known and name not in unresolvable), key=rank)
        else:
            # many may hold it: down the ranking, skipping by bucket
            eligible = self._eligible(request)
            ordered = (views[name] for _rank, name in ranks
                       if name in known and name not in unresolvable
                       and eligible(name))
        failed = self._closed(known)
        for view in ordered:
            result = fit.quick_reject(view, request) or fit.fit_node(
                view, request, self.strategy)
            if isinstance(result, fit.NodeFit):
                return fit.chosen_decision(
                    result, known, failed, unresolvable, (),
                    'node %s was chosen (%s %s)' % (
                        result.node, hami.NODE_SCHEDULER_POLICY,
                        request.node_policy))
            failed[view.name] = result
        return self._no_fit(request, known, failed, unresolvable)

    def _unresolvable(self, request: fit.PodRequest, known: set[str],
                      unknown: set[str]) -> dict[str, str]:
        """Known nodes that can never take ``request`` as registered, by
        registration shape, and the unknown ones."""
        result = dict.fromkeys(unknown, _UNKNOWN)
        none = 'no AMD GPU registered in %s' % hami.NODE_REGISTER
        for name in self._without_gpus:
            if name in known:
                result[name] = none
        for group in self._shapes.values():
            first = next(iter(group))
            reason = fit._never_fits(self._views[first], request)
            if reason is None:
                continue
            for name in group:
                if name in known:
                    # the reason names the node's own sizes: all alike
                    result[name] = reason
        return result

    def _closed(self, known: set[str]) -> dict[str, str]:
        """The known nodes that take nothing now, with why."""
        return {name: problem for name, problem in self._problems.items()
                if name in known}

    def _no_fit(self, request: fit.PodRequest, known: set[str],
                failed: dict[str, str],
                unresolvable: dict[str, str]) -> fit.Decision:
        return fit.Decision(None, fit.Reasons(
            known, failed, functools.partial(self._summary_reason, request),
            unresolvable), unresolvable)

    def _thresholds(self, request: fit.PodRequest) -> tuple[int, int]:
        """(idle GPUs, share bucket) a node needs to hold ``request``:
        whole GPUs by idle GPUs, else shares by the free-CU bucket."""
        idle = sum(w.nums for w in request.containers
                   if w.nums and w.exclusive)
        if idle:
            return idle, 0
        need = min((w.percent for w in request.containers if w.nums),
                   default=100)
        # percent_to_cus floors: a GPU may take 1 CU less than the percent
        return 0, max(0, int((need / 100 - 1 / max(1, self._min_devcore))
                             * BUCKETS))

    def _candidate_count(self, request: fit.PodRequest) -> int:
        idle, first = self._thresholds(request)
        if idle:
            index, low = self._idle, idle
        else:
            index, low = self._shares, first
        return sum(len(names) for key, row in index.items() if key >= low
                   for names in row.values())

    def _eligible(self, request: fit.PodRequest) -> Callable[[str], bool]:
        idle, first = self._thresholds(request)
        buckets = self._bucket_of
        if idle:
            return lambda name: name in buckets and buckets[name][1] >= idle
        return lambda name: name in buckets and buckets[name][0] >= first

    def _candidate_names(self, request: fit.PodRequest) -> Iterable[str]:
        """Nodes whose buckets may hold ``request``, tightest first."""
        idle, first = self._thresholds(request)
        if idle:
            for count in sorted(self._idle):
                if count >= idle:
                    row = self._idle[count]
                    for free in sorted(row):
                        yield from row[free]
            return
        for bucket in range(first, BUCKETS + 1):
            shares = self._shares.get(bucket)
            if shares:
                for free in sorted(shares):
                    yield from shares[free]

    def _decide_packed(self, request: fit.PodRequest, known: set[str],
                       unresolvable: dict[str, str]) -> fit.Decision:
        """The placement that grows expected fragmentation least, among
        the first nodes of the indexes that hold the request."""
        assert self.mix is not None
        score = self.mix.score
        self._costs.begin(score)
        gpu_score = score if not request.gpu_policy_set or \
            request.gpu_policy == 'binpack' else None
        want = fitrank.summary_ranked(request) if gpu_score is not None \
            else None
        shape = None if want is None else \
            (want.nums, want.percent, want.mem, want.exclusive)
        views = self._views
        failed = self._closed(known)
        found: list[tuple[Any, fit.NodeView, fit.NodeFit | None]] = []
        for name in self._candidate_names(request):
            if name not in known or name in unresolvable:
                continue
            view = views[name]
            if want is not None:
                cost = self._costs.key(view, want, shape)
                key = None if cost is None else \
                    (*cost, -view.usage, view.name)
                if key is None:
                    failed[name] = fit.quick_reject(view, request) or \
                        'container %r (%s): no GPU holds it' % (
                            want.name, want.describe())
                    continue
                found.append((key, view, None))
            else:
                result = fit.quick_reject(view, request) or fit.fit_node(
                    view, request, self.strategy, gpu_score)
                if isinstance(result, str):
                    failed[name] = result
                    continue
                found.append((fitrank.placement_key(score, view,
                                                    result.containers),
                              view, result))
            if len(found) >= self.candidates:
                break
        found.sort(key=lambda item: item[0])
        for _key, view, placement in found:
            result = placement or fit.fit_node(view, request, self.strategy,
                                               gpu_score)
            if isinstance(result, fit.NodeFit):
                return fit.chosen_decision(
                    result, known, failed, unresolvable, (),
                    'node %s was chosen (least fragmentation among the '
                    'nodes that fit)' % result.node)
            failed[view.name] = result
        return self._no_fit(request, known, failed, unresolvable)

    def _summary_reason(self, request: fit.PodRequest, name: str) -> str:
        """Why the node's summary rules ``request`` out (nodes the
        indexes skipped)."""
        view = self._views.get(name)
        if view is None:
            return _UNKNOWN
        reason = fit.quick_reject(view, request)
        if reason:
            return reason
        for want in request.containers:
            if not want.nums:
                continue
            if want.exclusive:
                if view.idle_gpus < want.nums:
                    return 'container %r (%s): in use (a whole GPU was ' \
                        'asked): %d of %d GPUs idle' % (
                            want.name, want.describe(), view.idle_gpus,
                            len(view.gpus))
                continue
            largest = max((g.usable_cores for g in view.healthy
                           if g.used_slots < g.info.count), default=0)
            return 'container %r (%s): too few free CUs or too little ' \
                'free memory (at most %d CUs on a GPU with a free slot, ' \
                '%d MiB on one GPU)' % (want.name, want.describe(),
                                        largest, view.max_free_mem)
        return 'does not fit'

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
