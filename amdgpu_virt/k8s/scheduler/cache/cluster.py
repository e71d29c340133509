"""The extender's in-memory view of the cluster's AMD GPUs.

:class:`ClusterCache` holds what the filter needs from nodes (their
``hami.io/node-amd-register``) and pods (their
``hami.io/amd-devices-allocated`` and ``hami.io/amd-cu-allocated``), fed
object by object (:meth:`ClusterCache.set_node`, :meth:`set_pod`, ...) by
the watchers of :mod:`amdgpu_virt.k8s.scheduler.cache.watching`. A
decision is taken on the cache, never on a fresh list.

What a filter decides is *reserved* in the cache at once, under the same
lock as the decision, so that concurrent requests cannot give the same
CUs twice before the watch shows the pod's new annotations. A reservation
ends when the watch delivers the pod at or after the version that the
annotation write returned, when the pod is deleted, or when the write
failed.

Each node's view carries a summary (free CUs, free memory and free slots
per GPU, idle GPUs) and the node sits in the bucketed indexes of
:mod:`amdgpu_virt.k8s.scheduler.cache.index`, kept as views change. With a
:class:`~amdgpu_virt.sharing.packing.Mix` (the fragmentation score), a
``binpack`` pod is only tried on nodes whose bucket can hold it, tightest
first, and placed where the expected fragmentation grows least among the
first ``candidates`` nodes that fit: a decision does not rescan the
cluster.

The cache also counts the hosts beside the GPUs
(:mod:`amdgpu_virt.k8s.scheduler.cache.hosts`): every node's allocatable
CPU and memory and what every live pod asks of its node, whatever its
scheduler. A decision never over-commits a host it knows, and the
fragmentation score counts the GPU capacity a host can no longer feed.

Bad annotations written by someone else never stop the cache (see
:mod:`amdgpu_virt.k8s.fit.entry`): a live pod whose allocation cannot be
read makes its node take nothing more until it is fixed or gone (fail
closed: its usage is unknown). Each is logged once per change.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import operator
import threading
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.fit import entry as cacheentry
from amdgpu_virt.k8s.fit import host as fithost
from amdgpu_virt.k8s.scheduler.cache import hosts as cachehosts
from amdgpu_virt.k8s.scheduler.cache import index as cacheindex
from amdgpu_virt.k8s.scheduler.cache import pack as cachepack
from amdgpu_virt.k8s.scheduler.cache import views as cacheviews
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

LOG = logging.getLogger(__name__)

# the entries, their decoders and the index buckets, where they were first
# declared (importers of this module keep working)
DONE_PHASES = cacheentry.DONE_PHASES
NodeEntry = cacheentry.NodeEntry
PodEntry = cacheentry.PodEntry
decode_node = cacheentry.decode_node
decode_pod = cacheentry.decode_pod
decode_host = cacheentry.decode_host
pod_key = cacheentry.pod_key
_rv = cacheentry._rv
BUCKETS = cacheindex.BUCKETS
share_bucket = cacheindex.share_bucket
idle_bucket = cacheindex.idle_bucket
free_bucket = cacheindex.free_bucket
buckets_of = cacheindex.buckets_of
_UNKNOWN = cacheindex.UNKNOWN



@dataclasses.dataclass
class _Reservation:
    node: str | None
    devices: hami.PodDevices
    value: str
    #: resourceVersion the annotation write returned (None: in flight)
    resource_version: int | None = None
    #: what the pod asks of the node's host
    host: fithost.HostAmount | None = None



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
        self._packer = None if mix is None else cachepack.Packer(
            mix, self.candidates, self.strategy)
        self._viewer = cacheviews.ViewBuilder(self.strategy)
        #: the views' buckets, shapes and problems
        self.index = cacheindex.NodeIndex()
        #: allocatable and requested CPU and memory per node
        self.hosts = cachehosts.HostLedger()
        #: the last candidate names and what they resolved to
        self._names: Sequence[str] | None = None
        self._wanted: tuple[set[str], set[str]] = (set(), set())
        self.lock = threading.RLock()
        self._nodes: dict[str, NodeEntry] = {}
        #: what each node's last event gave the decoder (see set_node)
        self._node_inputs: dict[str, tuple[Any, ...]] = {}
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
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()

    # -- state ----------------------------------------------------------

    @property
    def reference_mem(self) -> int:
        """Most memory of one GPU seen (request memory as a fraction)."""
        return self.index.reference_mem

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
            _drop(self._by_node, old, key)
            self._dirty.add(old)
        node = self._effective(key)[0]
        if node is not None:
            self._placed[key] = node
            self._by_node.setdefault(node, set()).add(key)
            self._dirty.add(node)
        self._host_place(key, node)

    def _host_place(self, key: str, node: str | None) -> None:
        """Count the host request of ``key`` where its GPUs are: its
        reservation's, or the one the API shows."""
        reservation = self._reserved.get(key)
        if node is None:
            self.hosts.place(key, None)
        elif reservation is not None and reservation.node is not None:
            self.hosts.place(key, node, reservation.host)
        else:
            self.hosts.place(key, node, shown=True)

    # -- feeding --------------------------------------------------------

    def set_node(self, obj: Mapping[str, Any]) -> None:
        inputs = cacheentry.node_inputs(obj, self.resource)
        name = inputs[0]
        with self.lock:
            if name in self._nodes and self._node_inputs.get(name) == inputs:
                return   # its lock or labels changed, not what we read
        entry = decode_node(obj, self.resource)
        with self.lock:
            self._node_inputs[entry.name] = inputs
            self.hosts.set_allocatable(entry.name, entry.allocatable)
            if self._nodes.get(entry.name) != entry:
                self._nodes[entry.name] = entry
                self._dirty.add(entry.name)

    def delete_node(self, name: str) -> None:
        with self.lock:
            self._node_inputs.pop(name, None)
            self.hosts.drop_node(name)
            self._nodes.pop(name, None)
            self._dirty.add(name)

    def replace_nodes(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of nodes (API objects)."""
        self.load_nodes([decode_node(obj, self.resource) for obj in objs])

    def load_nodes(self, entries: Iterable[NodeEntry]) -> None:
        """A fresh list of nodes, decoded (see
        :func:`.cachelist.node_page`); the views are built at once when
        the pods are listed too."""
        with self.lock:
            self._nodes = {entry.name: entry for entry in entries}
            self._node_inputs.clear()
            self.hosts.load_nodes((entry.name, entry.allocatable)
                                  for entry in self._nodes.values())
            self._views.clear()
            self.index.clear()
            self._names = None
            self._dirty = set(self._nodes)
            self.nodes_synced.set()
            self._prime()

    def set_pod(self, obj: Mapping[str, Any]) -> None:
        entry = decode_pod(obj)
        key = pod_key(obj)
        host = decode_host(obj)
        with self.lock:
            self.hosts.set_pod(key, host)
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
            self.hosts.set_pod(key, None)
            self._pods.pop(key, None)
            self._reserved.pop(key, None)
            self._refresh(key)

    def replace_pods(self, objs: Iterable[Mapping[str, Any]],
                     list_rv: int | None = None) -> None:
        """A fresh list of pods (API objects): every pod entry is
        replaced; reservations the list already shows end."""
        self.load_pods(((pod_key(obj), decode_pod(obj), decode_host(obj))
                        for obj in objs), list_rv)

    def load_pods(self, listing: Iterable[tuple[
            str, PodEntry | None, cacheentry.HostUse | None]],
                  list_rv: int | None = None) -> None:
        """A fresh list of pods, decoded: (key, entry or None, host use or
        None) of every listed pod (see :func:`.cachelist.pod_page`). The
        views are built at once when the nodes are listed too."""
        pods: dict[str, PodEntry] = {}
        #: listed pods that hold no GPU (the others are in ``pods``)
        others: set[str] = set()
        #: every placement afresh (what _refresh does, key by key), the
        #: listed ones first
        placed: dict[str, str] = {}
        by_node: dict[str, set[str]] = {}
        #: what every live pod asks of its host
        uses: dict[str, cacheentry.HostUse] = {}
        for key, entry, use in listing:
            if use is not None:
                uses[key] = use
            elif key in uses:
                del uses[key]
            if entry is None:
                others.add(key)
                continue
            earlier = pods.get(key)
            if earlier is not None:
                # listed twice (no API server does): the last one counts
                _drop(by_node, earlier.node, key)
            pods[key] = entry
            node = entry.node
            placed[key] = node
            keys = by_node.get(node)
            if keys is None:
                by_node[node] = {key}
            else:
                keys.add(key)
        with self.lock:
            self._pods = pods
            reserved = self._reserved
            for key, reservation in list(reserved.items()):
                if reservation.resource_version is not None and (
                        key not in pods and key not in others or
                        list_rv is not None and
                        reservation.resource_version <= list_rv):
                    del reserved[key]
            # a reservation still held places its pod where it says
            for key, reservation in reserved.items():
                listed = pods.get(key)
                if listed is not None:
                    del placed[key]
                    _drop(by_node, listed.node, key)
                if reservation.node is not None:
                    placed[key] = reservation.node
                    by_node.setdefault(reservation.node, set()).add(key)
            self._placed = placed
            self._by_node = by_node
            self.hosts.load_pods(uses.items(), (
                (key, node) + self._host_of(key)
                for key, node in placed.items()))
            self._dirty = set(self._nodes)
            self._dirty.update(by_node)
            self.pods_synced.set()
            self._prime()

    def _host_of(self, key: str) -> tuple[fithost.HostAmount | None, bool]:
        """(request, whether the API's counts) of placed pod ``key``."""
        reservation = self._reserved.get(key)
        if reservation is not None and reservation.node is not None:
            return reservation.host, False
        return None, True

    def _prime(self) -> None:
        """Build every view once both lists are in (lock held), so the
        first decision does not, and a list that pauses the collector
        pauses it for the views too."""
        if self.nodes_synced.is_set() and self.pods_synced.is_set():
            self._sync_views()

    # -- views and decisions --------------------------------------------

    def _sync_views(self) -> None:
        """Rebuild the views of the nodes that changed, and keep the nodes
        ranked by both node policies (lock held)."""
        full = len(self._dirty) * 4 > len(self._views)
        if self._dirty - self._views.keys() or \
                self._dirty - self._nodes.keys():
            self._names = None   # the known nodes change
        # in name order: the indexes keep names sorted, and a whole
        # cluster given in order only appends
        for name in sorted(self._dirty):
            self.index.remove(name, name not in self._nodes)
            old = self._views.pop(name, None)
            if old is not None and not full:
                for ranks, key in ((self._by_binpack, old.rank_binpack),
                                   (self._by_spread, old.rank_spread)):
                    index = bisect.bisect_left(ranks, key)
                    if index < len(ranks) and ranks[index] == key:
                        del ranks[index]
            entry = self._nodes.get(name)
            if entry is None:
                continue
            view = self._build(entry)
            self._views[name] = view
            self.index.add(view)
            if not full:
                bisect.insort(self._by_binpack, view.rank_binpack)
                bisect.insort(self._by_spread, view.rank_spread)
        self._dirty.clear()
        if full:
            self._by_binpack = sorted(v.rank_binpack
                                      for v in self._views.values())
            self._by_spread = sorted(v.rank_spread
                                     for v in self._views.values())

    def index_snapshot(self) -> dict[str, tuple[int, int, int]]:
        """name -> (share bucket, idle bucket, free bucket) of every node
        in the indexes, read back from them (for checks against a
        recomputation, see :func:`buckets_of`)."""
        with self.lock:
            if self._dirty:
                self._sync_views()
            return self.index.snapshot()

    def view(self, name: str) -> fit.NodeView | None:
        """The node's view, or None when the node is unknown."""
        with self.lock:
            if self._dirty:
                self._sync_views()
            return self._views.get(name)

    def _build(self, entry: NodeEntry) -> fit.NodeView:
        problem = entry.problem
        usages: list[fit.PodUsage] = []
        reserved = self._reserved
        pods = self._pods
        # what _effective gives, key by key
        for key in sorted(self._by_node.get(entry.name, ())):
            reservation = reserved.get(key)
            if reservation is not None:
                usages.append((key, reservation.devices, None))
                continue
            pod = pods.get(key)
            if pod is None:
                usages.append((key, (), None))
                continue
            if pod.problem and not problem:
                problem = pod.problem
            usages.append((key, pod.devices, pod.cu_masks))
        if self._viewer.strategy is not self.strategy:
            self._viewer = cacheviews.ViewBuilder(self.strategy)
        return self._viewer.build(entry.name, entry.devices, usages,
                                  problem)

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
                host = request.host
                self.mix.record(request.shapes(self.reference_mem),
                                None if host is None
                                else (host.cpu, host.memory))
            decision = self._decide(request, names)
            if decision.fit is None:
                if previous is None:
                    del self._reserved[key]
                else:
                    self._reserved[key] = previous
            else:
                self._reserved[key] = _Reservation(
                    decision.fit.node, decision.fit.containers,
                    hami.encode_pod_devices(decision.fit.containers),
                    host=request.host)
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
        unresolvable = self.index.unresolvable(request, known, unknown,
                                                 self._views)
        if self._packer is not None and request.node_policy == 'binpack':
            return self._packer.decide(request, known, unresolvable,
                                       self.index, self._views,
                                       self.hosts.free)
        ranks = self._by_spread if request.node_policy == 'spread' \
            else self._by_binpack
        views = self._views
        if self.index.candidate_count(request) * 8 < len(ranks):
            rank = operator.attrgetter(
                'rank_spread' if request.node_policy == 'spread'
                else 'rank_binpack')
            ordered: Iterable[fit.NodeView] = sorted(
                (views[name] for name in self.index.candidate_names(request)
                 if name in known and name not in unresolvable), key=rank)
        else:
            # many may hold it: down the ranking, skipping by bucket
            eligible = self.index.eligible(request)
            ordered = (views[name] for _rank, name in ranks
                       if name in known and name not in unresolvable
                       and eligible(name))
        failed = self.index.closed(known)
        for view in ordered:
            result = cachepack.host_problem(
                self.hosts.free(view.name), request.host) or \
                fit.quick_reject(view, request) or fit.fit_node(
                    view, request, self.strategy)
            if isinstance(result, fit.NodeFit):
                return fit.chosen_decision(
                    result, known, failed, unresolvable, (),
                    'node %s was chosen (%s %s)' % (
                        result.node, hami.NODE_SCHEDULER_POLICY,
                        request.node_policy))
            failed[view.name] = result
        return self._no_fit(request, known, failed, unresolvable)

    def _no_fit(self, request: fit.PodRequest, known: set[str],
                failed: dict[str, str],
                unresolvable: dict[str, str]) -> fit.Decision:
        return cachepack.no_fit(self._views, request, known, failed,
                                unresolvable)

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

    def host_free(self, name: str) -> fithost.HostAmount | None:
        """What the host of node ``name`` has left for pods (None:
        unknown)."""
        with self.lock:
            return self.hosts.free(name)

    def stranding(self, names: Iterable[str],
                  asked: fithost.HostAmount | None) -> dict[str, float]:
        """name -> GPU capacity (in GPUs) that a pod asking no GPU and
        ``asked`` of the host would leave its node unable to feed, by the
        fragmentation score, for the known nodes of ``names`` (all 0
        without the score)."""
        with self.lock:
            if self._dirty:
                self._sync_views()
            views = self._views
            result = {}
            for name in names:
                view = views.get(name)
                if view is None:
                    continue
                result[name] = 0.0 if self._packer is None else \
                    self._packer.strands(view, self.hosts.free(name), asked)
            return result

    def placement(self, key: str) -> str | None:
        """The node pod ``key`` holds GPUs on (reserved or seen)."""
        with self.lock:
            return self._placed.get(key)


def _drop(by_node: dict[str, set[str]], node: str, key: str) -> None:
    """Take ``key`` out of ``node``'s pods (and the node out when it has
    none left)."""
    keys = by_node.get(node)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del by_node[node]
