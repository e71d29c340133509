"""The placement policies of ``gpushare.py``, all on the same accounting
(:mod:`_gpushare_model`).

* ``hami``: HAMi's defaults, the busiest node that fits (node binpack)
  and the least used GPU on it (GPU spread): first fit down the ranking;
* ``best-fit``: the node left with the least resources (free GPUs plus
  free CPU, as fractions), and on it the tightest GPU;
* ``dot-product``: the node whose free (GPU, CPU, memory) vector has the
  smallest dot product with the task's demand (Tetris-style alignment, as
  the FGD paper's baseline), tightest GPU on it;
* ``fgd``: fragmentation gradient descent written from the paper (GPU
  compute and CPU, the workload's type distribution known in advance);
* ``plain``: the extender with ``[scheduler] packing = false`` (HAMi's
  order on its cache);
* ``ours``: the extender itself (``ClusterCache.decide_and_reserve`` with
  its fragmentation score, host included), given the nodes whose host can
  hold the task as kube-scheduler would, and fed every placed pod (tasks
  without GPU too) as its watch is;
* ``ours-gpu-only``: the same without the score's host term (the request
  mix told no host demand): what the score was before it saw the host.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable
from typing import Any

import _timing
from _gpushare_model import Choice
from _gpushare_model import Gpu
from _gpushare_model import MODELS
from _gpushare_model import Node
from _gpushare_model import Task

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.fit import host as fithost
from amdgpu_virt.k8s.scheduler import core
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing


def _take(node: Node, task: Task, order: Callable[[Gpu], Any]
          ) -> list[Gpu] | None:
    fitting = node.fitting(task)
    if len(fitting) < task.gpus:
        return None
    return sorted(fitting, key=order)[:task.gpus]


def _tight(task: Task) -> Callable[[Gpu], Any]:
    return lambda g: (g.cus - g.need(task)[0], g.index)


class Hami:
    name = 'hami'

    def __init__(self, cluster: list[Node], tasks: list[Task]) -> None:
        self.cluster = cluster
        self.ranked = sorted((-n.use, n.name, n) for n in cluster)
        self.keys = {n.name: (-n.use, n.name, n) for n in cluster}

    def placed(self, node: Node) -> None:
        old = self.keys[node.name]
        del self.ranked[bisect.bisect_left(self.ranked, old[:2])]
        new = (-node.use, node.name, node)
        self.keys[node.name] = new
        bisect.insort(self.ranked, new)

    def choose(self, task: Task) -> Choice | None:
        for _use, _name, node in self.ranked:
            if not node.hosts(task):
                continue
            gpus = _take(node, task, lambda g: (
                g.slots / g.count + 1 - g.free + 1 - g.mem / g.devmem,
                g.index))
            if gpus:
                return node, gpus
        return None


class BestFit:
    name = 'best-fit'

    def __init__(self, cluster: list[Node], tasks: list[Task]) -> None:
        self.cluster = cluster

    def _key(self, node: Node, task: Task, gpus: list[Gpu]) -> tuple:
        """Smaller is better: the least left on the node, then on the
        GPUs."""
        left = (node.free - task.demand) / len(node.gpus) + \
            (node.cpu - task.cpu) / node.cpu_total
        return (left, sum(g.cus - g.need(task)[0] for g in gpus),
                node.name)

    def choose(self, task: Task) -> Choice | None:
        best = None
        for node in self.cluster:
            if not node.hosts(task):
                continue
            gpus = _take(node, task, _tight(task))
            if gpus is None:
                continue
            key = self._key(node, task, gpus)
            if best is None or key < best[0]:
                best = (key, node, gpus)
        return None if best is None else (best[1], best[2])


class DotProduct(BestFit):
    name = 'dot-product'

    def _key(self, node: Node, task: Task, gpus: list[Gpu]) -> tuple:
        """Smaller is better: the dot product of what is free and what
        is asked (GPU, CPU, memory)."""
        size = len(node.gpus)
        dot = (node.free / size) * (task.demand / size) + \
            (node.cpu / node.cpu_total) * (task.cpu / node.cpu_total) + \
            (node.host / node.host_total) * (task.host / node.host_total)
        return (dot, node.name)


class Fgd:
    """Fragmentation gradient descent (Weng et al., ATC '23), from the
    paper: GPU compute and CPU, the workload's type distribution."""

    name = 'fgd'

    def __init__(self, cluster: list[Node], tasks: list[Task]) -> None:
        self.cluster = cluster
        counts = collections.Counter((t.demand, t.cpu) for t in tasks
                                     if not t.gpuless)
        total = sum(counts.values())
        #: (CPU, GPU demand, popularity), by CPU
        self.types = sorted((cpu, d, n / total)
                            for (d, cpu), n in counts.items())
        self.cpus = [t[0] for t in self.types]
        self._memo: dict[Any, float] = {}

    def fragment(self, cpu: int, frees: tuple[float, ...]) -> float:
        key = (cpu, frees)
        value = self._memo.get(key)
        if value is not None:
            return value
        total = sum(frees)
        idle = sum(1 for f in frees if f >= 1.0 - 1e-9)
        partial = total - idle
        value = 0.0
        hosted = bisect.bisect_right(self.cpus, cpu)
        for _cpu, d, share in self.types[:hosted]:
            if d < 1:
                value += share * sum(f for f in frees if f < d - 1e-9)
            elif idle >= d:
                value += share * partial
            else:
                value += share * total
        value += sum(t[2] for t in self.types[hosted:]) * total
        if len(self._memo) > 1 << 18:
            self._memo.clear()
        self._memo[key] = value
        return value

    def choose(self, task: Task) -> Choice | None:
        best = None
        for node in self.cluster:
            if not node.hosts(task):
                continue
            fitting = node.fitting(task)
            if len(fitting) < task.gpus:
                continue
            frees = [g.free for g in node.gpus]
            before = self.fragment(node.cpu, tuple(sorted(frees)))
            if task.whole:
                options = [sorted(fitting, key=lambda g: g.index)
                           [:task.gpus]]
            else:
                seen = set()
                options = []
                for gpu in fitting:
                    if gpu.cus not in seen:
                        seen.add(gpu.cus)
                        options.append([gpu])
            for gpus in options:
                after = list(frees)
                for gpu in gpus:
                    after[gpu.index] -= gpu.need(task)[0] / gpu.devcore
                delta = self.fragment(node.cpu - task.cpu,
                                      tuple(sorted(after))) - before
                key = (round(delta, 9), sum(after), node.name,
                       gpus[0].index)
                if best is None or key < best[0]:
                    best = (key, node, gpus)
        return None if best is None else (best[1], best[2])


def pod(task: Task) -> dict[str, Any]:
    """The task as the pod kube-scheduler would send (and the watch
    show), without placement."""
    limits: dict[str, str] = {}
    if task.gpus:
        limits[hami.RESOURCE_GPU] = str(task.gpus)
    if task.gpus and not task.whole:
        limits[hami.RESOURCE_GPUCORES] = str(task.percent)
        limits[hami.RESOURCE_GPUMEM] = str(task.mem)
    return {'metadata': {'name': task.name, 'namespace': 'bench',
                         'annotations': {}},
            'spec': {'containers': [{'name': 'main', 'resources': {
                'limits': limits, 'requests': {
                    'cpu': str(task.cpu), 'memory': '%dGi' % task.host}}}]}}


class Mirror:
    """An extender cache that sees the cluster as the watch shows it:
    every node's registration and allocatable, every placed pod.

    :param mix: the fragmentation score's mix (None: packing off).
    :param learn: record each GPU task it is shown in the mix (as the
        extender's filter would have: for another policy's placements).
    """

    def __init__(self, cluster: list[Node], mix: packing.Mix | None,
                 candidates: int = 256, learn: bool = False) -> None:
        self.learn = learn
        self.cluster = cluster
        self.by_uuid = {g.uuid: g for n in cluster for g in n.gpus}
        self.by_name = {n.name: n for n in cluster}
        self.cache = schedcache.ClusterCache(mix=mix, candidates=candidates)
        objs = []
        for node in cluster:
            devices = [hami.DeviceInfo(
                id=g.uuid, index=g.index, numa=g.index // 4,
                type='AMD Instinct %s' % node.model, health=True,
                devicevendor='amd', **MODELS[node.model])
                for g in node.gpus]
            objs.append({'metadata': {'name': node.name, 'annotations': {
                hami.NODE_REGISTER: hami.encode_node_register(devices)}},
                'status': {'allocatable': {
                    'cpu': str(node.cpu_total),
                    'memory': '%dGi' % node.host_total}}})
        self.cache.replace_nodes(objs)
        self.cache.replace_pods([], 1)
        self.version = 1

    def seen(self, task: Task, node: Node, gpus: list[Gpu],
             devices: hami.PodDevices | None = None) -> None:
        """The watch shows ``task`` placed (its annotations written)."""
        self.version += 1
        obj = pod(task)
        obj['metadata']['resourceVersion'] = str(self.version)
        obj['spec']['nodeName'] = node.name
        mix = self.cache.mix
        if gpus and self.learn and mix is not None:
            request = fit.pod_request(obj)
            host = request.host or fithost.NOTHING
            mix.record(request.shapes(self.cache.reference_mem),
                       (host.cpu, host.memory))
        if gpus:
            if devices is None:
                devices = (tuple(hami.ContainerDevice(
                    g.uuid, 'AMD Instinct %s' % node.model,
                    g.need(task)[1], g.need(task)[0]) for g in gpus),)
            obj['metadata']['annotations'].update({
                hami.DEVICES_ALLOCATED: hami.encode_pod_devices(devices),
                hami.VGPU_NODE: node.name})
        self.cache.set_pod(obj)

    def prioritize(self, task: Task, names: list[str]) -> dict[str, int]:
        """The extender's ``/prioritize`` scores for a task without
        GPU."""
        request = fit.pod_request(pod(task))
        return core.gpuless_scores(self.cache.stranding(names,
                                                        request.host))


class Ours(Mirror):
    """The extender's own decision on its own cache."""

    name = 'ours'
    packing = True

    def __init__(self, cluster: list[Node], tasks: list[Task],
                 candidates: int = 256) -> None:
        super().__init__(cluster, packing.Mix() if self.packing else None,
                         candidates)
        #: times the decision alone when set
        self.clock: _timing.DecisionClock | None = None

    def choose(self, task: Task) -> Choice | None:
        names = [n.name for n in self.cluster if n.room(task)]
        request = fit.pod_request(pod(task))
        key = 'bench/' + task.name
        if self.clock is not None:
            self.clock.start()
        decision = self.cache.decide_and_reserve(key, request, names)
        if self.clock is not None:
            self.clock.stop()
        if decision.fit is None:
            return None
        gpus = [self.by_uuid[d.uuid] for d in decision.fit.containers[0]]
        node = self.by_name[decision.fit.node]
        # the annotation write returns a version; the watch shows the pod
        self.cache.confirm(key, self.version + 1)
        self.seen(task, node, gpus, decision.fit.containers)
        return node, gpus


class Plain(Ours):
    """The extender with ``[scheduler] packing = false``."""

    name = 'plain'
    packing = False


class GpuOnly(Ours):
    """The extender's score without its host term (what it was before):
    the request mix is told no host demand."""

    name = 'ours-gpu-only'

    def __init__(self, cluster: list[Node], tasks: list[Task],
                 candidates: int = 256) -> None:
        super().__init__(cluster, tasks, candidates)
        mix = self.cache.mix
        assert mix is not None
        record = mix.record
        mix.record = lambda shapes, host=None: record(  # type: ignore
            shapes, None)


POLICIES: dict[str, Any] = {p.name: p for p in (
    Hami, BestFit, DotProduct, Fgd, Plain, Ours, GpuOnly)}
