"""Which node and GPUs a pod gets: the scheduler extender's decision.

Pure functions over plain pod dicts and HAMi registrations, with HAMi's
semantics:

* a container asks for ``amd.com/gpu`` GPUs (1 when only ``gpumem`` or
  ``gpucores`` is given), ``amd.com/gpumem`` MiB on each (0 or absent: the
  whole card's memory) and ``amd.com/gpucores`` percent of each GPU's CUs
  (absent: 100); ``gpucores: 100`` without ``gpumem`` is a whole GPU. Only
  container limits count, as in HAMi (Kubernetes requires a limit equal to
  the request for extended resources); ``amd.com/gpu: 0`` asks for none;
* a GPU takes a container while it has a free slot (``count`` of the
  registration), the CUs (``percent_to_cus``) and the memory, passes the
  pod's ``amd.com/use-gputype``, ``nouse-gputype``, ``use-gpu-uuid`` and
  ``nouse-gpu-uuid`` annotations and is healthy; a slice also needs the
  memory enforcement the pod's namespace requires (its registered
  ``custominfo.memoryEnforcement``, see
  :mod:`amdgpu_virt.sharing.enforcement`);
* among the GPUs that fit, those whose free CUs hold the request in one
  range (the CU allocator's view of the node, see :func:`build_view`) come
  first, then ``hami.io/gpu-scheduler-policy`` (``binpack``: the busiest
  GPU, ``spread``: the idlest; ``numa`` also keeps a container's GPUs on
  one NUMA node; ``topology-aware`` and ``mutex`` order as ``spread``),
  then the smallest free range that holds the request, then GPU index;
* among nodes, ``hami.io/node-scheduler-policy`` picks the busiest
  (``binpack``) or idlest (``spread``) node that fits, by the usage before
  the pod (ties: node name), so a decision looks at as few nodes as it
  needs;
* with a fragmentation score (:mod:`amdgpu_virt.sharing.packing`, passed
  by the cache for ``binpack`` pods), the GPUs that fit are ranked by how
  little the placement grows the node's expected fragmentation, unless
  the pod names its GPU policy.

The request is decoded in :mod:`~amdgpu_virt.k8s.fit.request`, the
node's view built in :mod:`~amdgpu_virt.k8s.fit.view` (both re-exported
here); this module takes the decision.

"Does not fit" is a readable reason string, never an exception; the
filter's :class:`Decision` carries a :class:`FitCode` (kube-scheduler's
status codes) and gives every node's reason as a coded :class:`NodeReason`.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import operator
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.fit.request import ContainerRequest
from amdgpu_virt.k8s.fit.request import MANAGED_RESOURCES
from amdgpu_virt.k8s.fit.request import pod_request
from amdgpu_virt.k8s.fit.request import PodRequest
from amdgpu_virt.k8s.fit.view import build_view
from amdgpu_virt.k8s.fit.view import GpuState
from amdgpu_virt.k8s.fit.view import NodeView
from amdgpu_virt.k8s.fit.view import PodUsage
from amdgpu_virt.k8s.fit.view import usable_device
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

__all__ = [
    'MANAGED_RESOURCES', 'ContainerRequest', 'Decision', 'FitCode',
    'GpuState', 'NodeFit', 'NodeReason', 'NodeView', 'PodRequest',
    'PodUsage', 'Reasons', 'build_view', 'chosen_decision', 'decide',
    'decide_in_order', 'fit_node', 'packed_gpu_cost', 'placement_usage',
    'never_fits', 'pod_request', 'quick_reject', 'usable_device',
]


# --- the decision ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NodeFit:
    """A pod placed on a node: the GPUs of each container."""

    node: str
    containers: hami.PodDevices


@dataclasses.dataclass
class _Tentative:
    slots: int
    cores: int
    mem: int
    free_mask: int


def _smallest_run(free: int, count: int) -> int | None:
    """Length of the smallest run of ``free`` holding ``count`` bits."""
    best = None
    for _start, length in allocator.runs(free):
        if length >= count and (best is None or length < best):
            best = length
            if length == count:
                break
    return best


def _gpu_problem(gpu: GpuState, state: _Tentative, want: ContainerRequest,
                 request: PodRequest, cus: int, mem: int) -> str | None:
    info = gpu.info
    kind = info.type.lower()
    if request.use_types and not any(t in kind for t in request.use_types):
        return 'type not in %s' % hami.USE_GPUTYPE
    if request.nouse_types and any(t in kind for t in request.nouse_types):
        return 'type in %s' % hami.NOUSE_GPUTYPE
    uuid = info.id.lower()
    if request.use_uuids and uuid not in request.use_uuids:
        return 'not in %s' % hami.USE_GPU_UUID
    if uuid in request.nouse_uuids:
        return 'in %s' % hami.NOUSE_GPU_UUID
    refusal = request.memory_refusal(info, want)
    if refusal:
        return refusal
    if not info.health:
        return 'unhealthy'
    if mem > info.devmem:
        return 'too little memory (%d MiB, %d asked)' % (info.devmem, mem)
    if state.slots >= info.count:
        return 'all %d slots taken' % info.count
    if want.exclusive and state.slots:
        return 'in use (a whole GPU was asked)'
    if info.devmem - state.mem < mem:
        return 'too little free memory (%d MiB asked)' % mem
    if info.devcore - state.cores < cus or state.free_mask.bit_count() < cus:
        return 'too few free CUs (%d asked)' % cus
    return None


def _tentative_free(info: hami.DeviceInfo,
                    state: _Tentative) -> packing.GpuFree:
    cores = max(0, min(info.devcore - state.cores,
                       state.free_mask.bit_count()))
    return packing.GpuFree(
        round(cores / info.devcore, 4),
        round(max(0, info.devmem - state.mem) / info.devmem, 4),
        state.slots < info.count,
        not (state.slots or state.cores or state.mem)
        and cores >= info.devcore, max(0, info.devmem - state.mem))


def packed_gpu_cost(score: packing.Score, view: NodeView,
                    info: hami.DeviceInfo, state: _Tentative, cus: int,
                    mem: int) -> tuple[float, float]:
    """(fragmentation added, free CUs left) when ``cus`` CUs and ``mem``
    MiB of GPU ``info`` (now at ``state``) go to one more consumer: the
    lower the better (the second: the tightest fit first)."""
    free = _tentative_free(info, state)
    cost = packing.share_cost(
        score, free, cus / info.devcore, mem / info.devmem,
        state.slots + 1 < info.count, view.idle_gpus, view.partial_free,
        mem)
    return round(cost, 9), free.cus - cus / info.devcore


def fit_node(view: NodeView, request: PodRequest,
             strategy: allocator.CuStrategy | None = None,
             score: packing.Score | None = None) -> NodeFit | str:
    """Place every container of ``request`` on ``view``'s GPUs.

    :param score: rank the GPUs that fit by the fragmentation the
        placement adds (see :func:`packed_gpu_cost`) rather than by the
        pod's GPU policy.
    :returns: the placement, or why the node does not fit.
    """
    if view.problem:
        return view.problem
    if not view.gpus:
        return 'no AMD GPU registered in %s' % hami.NODE_REGISTER
    strategy = strategy or allocator.BestFitStrategy()
    tentative = {gpu.info.id: _Tentative(gpu.used_slots, gpu.used_cores,
                                         gpu.used_mem, gpu.free_mask)
                 for gpu in view.gpus}
    placed: list[tuple[hami.ContainerDevice, ...]] = []
    binpack = request.gpu_policy == 'binpack'
    for want in request.containers:
        if not want.nums:
            placed.append(())
            continue
        if want.nums > len(view.gpus):
            return 'container %r asks for %d GPUs, the node has %d' % (
                want.name, want.nums, len(view.gpus))
        candidates = []
        problems = collections.Counter[str]()
        for gpu in view.gpus:
            info = gpu.info
            state = tentative[info.id]
            try:
                cus = hami.percent_to_cus(want.percent, info.devcore,
                                          gpu.unit)
            except exception.HamiProtocolError as err:
                problems[str(err)] += 1
                continue
            mem = want.mem or info.devmem
            if want.exclusive:
                cus = info.devcore
            problem = _gpu_problem(gpu, state, want, request, cus, mem)
            if problem:
                problems[problem] += 1
                continue
            run = _smallest_run(state.free_mask, cus)
            usage = (state.slots / info.count + state.cores / info.devcore
                     + state.mem / info.devmem)
            rank: Any
            if score is not None:
                rank = packed_gpu_cost(score, view, info, state, cus, mem)
            else:
                rank = -usage if binpack else usage
            key = (run is None, rank, run or 0, info.index, info.id)
            candidates.append((key, gpu, cus, mem))
        if len(candidates) < want.nums:
            return 'container %r (%s): %d of %d GPUs fit%s' % (
                want.name, want.describe(), len(candidates), len(view.gpus),
                (': ' + ', '.join('%d %s' % (n, p) for p, n in sorted(
                    problems.items(), key=lambda i: (-i[1], i[0]))))
                if problems else '')
        candidates.sort(key=lambda c: c[0])
        if request.gpu_policy == 'numa' and want.nums > 1:
            groups: dict[int, list[Any]] = collections.defaultdict(list)
            for candidate in candidates:
                groups[candidate[1].info.numa].append(candidate)
            fitting = [g for g in groups.values() if len(g) >= want.nums]
            if not fitting:
                return 'container %r (%s): no NUMA node has %d GPUs that ' \
                    'fit (%s numa)' % (want.name, want.describe(),
                                       want.nums, hami.GPU_SCHEDULER_POLICY)
            candidates = min(fitting, key=lambda g: g[0][0])
        chosen = []
        for _key, gpu, cus, mem in candidates[:want.nums]:
            info = gpu.info
            state = tentative[info.id]
            state.slots += 1
            state.cores += cus
            state.mem += mem
            if cus >= info.devcore:
                state.free_mask = 0
            else:
                taken = strategy.choose(state.free_mask, info.devcore,
                                        cus, gpu.unit)
                state.free_mask &= ~(taken or 0)
            chosen.append(hami.ContainerDevice(info.id, info.type, mem, cus))
        placed.append(tuple(chosen))
    return NodeFit(view.name, tuple(placed))


def quick_reject(view: NodeView, request: PodRequest) -> str | None:
    """Why ``view`` certainly cannot take ``request``, from its summary
    (a cheap test before :func:`fit_node`), or None."""
    if view.problem:
        return view.problem
    for want in request.containers:
        if not want.nums:
            continue
        if want.nums > view.open_gpus or want.mem > view.max_free_mem or \
                view.max_free_cores <= 0:
            return 'container %r (%s): %d GPUs have a free slot, at most ' \
                '%d CUs and %d MiB are free on one GPU' % (
                    want.name, want.describe(), view.open_gpus,
                    view.max_free_cores, view.max_free_mem)
    return None


def placement_usage(view: NodeView, placement: NodeFit) -> float:
    """The node's usage (0..1) once ``placement`` is on it."""
    if not view.gpus:
        return 0.0
    add_slots = collections.Counter[str]()
    add_cores = collections.Counter[str]()
    add_mem = collections.Counter[str]()
    for container in placement.containers:
        for used in container:
            add_slots[used.uuid] += 1
            add_cores[used.uuid] += used.usedcores
            add_mem[used.uuid] += used.usedmem
    total = 0.0
    for gpu in view.gpus:
        info = gpu.info
        uuid = info.id
        total += (gpu.used_slots + add_slots[uuid]) / info.count + \
            (gpu.used_cores + add_cores[uuid]) / info.devcore + \
            (gpu.used_mem + add_mem[uuid]) / info.devmem
    return total / (3 * len(view.gpus))


class FitCode(str, enum.Enum):
    """Outcome codes, as kube-scheduler's framework names them."""

    #: placed on a node
    SUCCESS = 'Success'
    #: fits no node now, some node may take it later (busy now)
    UNSCHEDULABLE = 'Unschedulable'
    #: no node can ever take it as registered
    UNRESOLVABLE = 'UnschedulableAndUnresolvable'


@dataclasses.dataclass(frozen=True)
class NodeReason:
    """Why one node was not chosen, with its code."""

    node: str
    code: FitCode
    reason: str


class Reasons(Mapping[str, str]):
    """node -> why it was not chosen, for thousands of nodes: the
    ``specific`` reasons, and ``default`` (a text, or a function of the
    node name) for every other name of ``names`` outside ``exclude``,
    made only when read.
    """

    def __init__(self, names: Iterable[str], specific: Mapping[str, str],
                 default: str | Callable[[str], str],
                 exclude: Iterable[str] = ()) -> None:
        self._names = names
        self._set: set[str] | frozenset[str] | None = \
            names if isinstance(names, (set, frozenset)) else None
        self._specific = specific
        self._default = default
        self._exclude = set(exclude)

    def _known(self) -> set[str] | frozenset[str]:
        if self._set is None:
            self._set = set(self._names)
        return self._set

    def __getitem__(self, name: str) -> str:
        if name in self._exclude or name not in self._known():
            raise KeyError(name)
        reason = self._specific.get(name)
        if reason is not None:
            return reason
        if isinstance(self._default, str):
            return self._default
        return self._default(name)

    def __iter__(self) -> Iterator[str]:
        seen = set(self._exclude)
        for name in self._names:
            if name not in seen:
                seen.add(name)
                yield name

    def __len__(self) -> int:
        return sum(1 for _name in self)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The filter's answer for one pod.

    :ivar fit: the chosen node and GPUs, or None.
    :ivar failed: node -> why it was not chosen (nodes worth retrying
        later: busy now).
    :ivar unresolvable: node -> why it can never take the pod as
        registered (no AMD GPU, too few GPUs, too little memory).
    """

    fit: NodeFit | None
    failed: Mapping[str, str]
    unresolvable: Mapping[str, str]

    @property
    def code(self) -> FitCode:
        """SUCCESS with a fit; else UNSCHEDULABLE while some node is only
        busy, UNRESOLVABLE when none can ever take the pod."""
        if self.fit is not None:
            return FitCode.SUCCESS
        return FitCode.UNSCHEDULABLE if self.failed else \
            FitCode.UNRESOLVABLE

    def reasons(self) -> tuple[NodeReason, ...]:
        """Every node not chosen, coded, sorted by node name."""
        coded = [NodeReason(n, FitCode.UNSCHEDULABLE, r)
                 for n, r in self.failed.items()]
        coded += [NodeReason(n, FitCode.UNRESOLVABLE, r)
                  for n, r in self.unresolvable.items()]
        return tuple(sorted(coded, key=lambda r: (r.node, r.code.value)))


def never_fits(view: NodeView, request: PodRequest) -> str | None:
    """Why ``request`` can never fit on the node of ``view`` (too few
    GPUs, none large enough), or None when it might."""
    if not view.gpus and not view.problem:
        return 'no AMD GPU registered in %s' % hami.NODE_REGISTER
    for want in request.containers:
        if view.problem or not want.nums:
            continue
        if want.nums > len(view.gpus):
            return 'container %r asks for %d GPUs, the node has %d' % (
                want.name, want.nums, len(view.gpus))
        big = sum(1 for gpu in view.gpus if gpu.info.devmem >= want.mem)
        if big < want.nums:
            return 'container %r asks for %d MiB on %d GPU(s), the node ' \
                'has %d GPU(s) with that much memory (largest: %d MiB)' % (
                    want.name, want.mem, want.nums, big,
                    max(gpu.info.devmem for gpu in view.gpus))
    return None


def decide(views: Sequence[NodeView], request: PodRequest,
           unknown: Iterable[str] = (),
           strategy: allocator.CuStrategy | None = None) -> Decision:
    """Choose one node for ``request`` among ``views`` (see
    :func:`decide_in_order`; this one sorts the views itself).

    :param unknown: node names the extender knows nothing about.
    """
    rank = operator.attrgetter('rank_spread' if request.node_policy ==
                               'spread' else 'rank_binpack')
    return decide_in_order(
        sorted(views, key=rank), [v.name for v in views], request, unknown,
        strategy, [v.name for v in views if not v.gpus and not v.problem])


def decide_in_order(ordered: Iterable[NodeView], names: Iterable[str],
                    request: PodRequest, unknown: Iterable[str] = (),
                    strategy: allocator.CuStrategy | None = None,
                    without_gpus: Iterable[str] = ()) -> Decision:
    """Choose one node for ``request``: the first of ``ordered`` that fits.

    :param ordered: the candidate nodes in the order of the pod's node
        policy (busiest first for binpack, idlest first for spread, then
        by name); consumed only up to the first node that fits.
    :param names: the names of all candidate nodes.
    :param unknown: node names the extender knows nothing about.
    :param without_gpus: names of nodes that register no AMD GPU.
    """
    failed: dict[str, str] = {}
    unresolvable = dict.fromkeys(
        unknown, 'node unknown to the extender (no such node, or the cache '
        'is not up to date yet)')
    chosen: NodeFit | None = None
    for view in ordered:
        never = never_fits(view, request)
        if never:
            unresolvable[view.name] = never
            continue
        result: NodeFit | str | None = quick_reject(view, request)
        if result is None:
            result = fit_node(view, request, strategy)
        if isinstance(result, NodeFit):
            chosen = result
            break
        failed[view.name] = result
    if chosen is None:
        return Decision(None, failed, unresolvable)
    return chosen_decision(
        chosen, names, failed, unresolvable, without_gpus,
        'node %s was chosen (%s %s)' % (
            chosen.node, hami.NODE_SCHEDULER_POLICY, request.node_policy))


def chosen_decision(chosen: NodeFit, names: Iterable[str],
                    failed: Mapping[str, str],
                    unresolvable: dict[str, str], without_gpus: Iterable[str],
                    reason: str) -> Decision:
    """The decision for ``chosen``: every other node of ``names`` failed
    with its known reason or ``reason``; nodes without AMD GPUs are
    unresolvable."""
    known = names if isinstance(names, (set, frozenset)) else set(names)
    none = 'no AMD GPU registered in %s' % hami.NODE_REGISTER
    for name in without_gpus:
        if name in known and name not in unresolvable and \
                name != chosen.node:
            unresolvable[name] = none
    return Decision(chosen, Reasons(known, failed, reason,
                                    [chosen.node, *unresolvable]),
                    unresolvable)
