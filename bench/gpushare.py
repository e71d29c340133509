"""Benchmark: placement policies on a GPU-sharing workload, side by side.

A seeded workload in the shape of the production traces studied by Weng et
al. ("Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23): most tasks ask a share of
one GPU (``amd.com/gpucores`` percent from a heavy-tailed mix of small
shares, and ``amd.com/gpumem``), the rest 1, 2, 4 or 8 whole GPUs; every
task also asks host CPU and memory. The cluster has heterogeneous nodes of
1, 2, 4 and 8 GPUs (MI300X and MI210, HAMi limits: CUs, memory and 10
slots per GPU). Tasks arrive one after the other until 130 % of the GPU
capacity has been asked; nothing departs; a task that fits nowhere is
rejected (no queue).

Policies, all on the same sequence and under the same limits (CPU, host
memory, GPU slots, CUs, GPU memory):

* ``hami``: HAMi's defaults, the busiest node that fits (node binpack)
  and the least used GPU on it (GPU spread): first fit down the ranking;
* ``best-fit``: the node left with the least resources (free GPUs plus
  free CPU, as fractions), and on it the tightest GPU;
* ``dot-product``: the node whose free (GPU, CPU, memory) vector has the
  smallest dot product with the task's demand (Tetris-style alignment, as
  the FGD paper's baseline), tightest GPU on it;
* ``fgd``: fragmentation gradient descent written from the paper: the
  fragmentation of a node for a task type is the free GPU capacity that
  type cannot use (all of it when the node cannot host the type, its CPU
  included; for a share, the GPUs with less free than the share; for
  whole GPUs, the partly used GPUs), weighted by the type's share of the
  workload (known in advance, as in the paper); the placement that least
  increases it wins;
* ``ours``: the extender itself (``ClusterCache.decide_and_reserve`` with
  its fragmentation score, on HAMi registrations and pod annotations),
  given the nodes that pass the CPU and memory check as kube-scheduler
  would, and fed the placed pods back as the watch does.

Prints per policy: GPU capacity allocated at the first rejection, at 100 %
and at 130 % offered load; the unallocated capacity at 60 % to 130 %;
tasks rejected; decision time p50/p99/max once 90 % has been offered, and
as a ratio to ``hami`` in the same run.

Usage::

    python bench/gpushare.py [--nodes 1200] [--seed 1] [--policies ...]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import _timing

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

MODELS = {
    'MI300X': dict(devcore=304, devmem=196608, count=10),
    'MI210': dict(devcore=104, devmem=65536, count=10),
}
#: (weight, GPUs, model, CPU cores, host GiB)
NODE_TYPES = ((30, 8, 'MI300X', 128, 2048), (20, 4, 'MI300X', 64, 1024),
              (10, 4, 'MI210', 64, 512), (20, 2, 'MI210', 32, 256),
              (20, 1, 'MI210', 16, 128))
SHARES = {5: 15, 10: 20, 12: 5, 20: 12, 25: 15, 30: 5, 40: 6, 50: 12,
          60: 3, 75: 4, 80: 3}
WHOLES = {1: 55, 2: 15, 4: 18, 8: 12}
SHARE_FRACTION = 0.78
LOADS = tuple(x / 100 for x in range(60, 135, 5))
NEAR_FULL = 0.9


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    gpus: int
    percent: int       # 100 with mem 0: whole GPUs
    mem: int           # MiB per GPU (0: whole)
    cpu: int           # cores
    host: int          # GiB

    @property
    def whole(self) -> bool:
        return self.percent == 100 and not self.mem


class Gpu:
    __slots__ = ('node', 'index', 'uuid', 'devcore', 'devmem', 'count',
                 'cus', 'mem', 'slots')

    def __init__(self, node: Node, index: int, model: str) -> None:
        spec = MODELS[model]
        self.node = node
        self.index = index
        self.uuid = '%s-gpu%d' % (node.name, index)
        self.devcore = spec['devcore']
        self.devmem = spec['devmem']
        self.count = spec['count']
        self.cus = self.devcore          # free
        self.mem = self.devmem
        self.slots = 0                   # used

    @property
    def idle(self) -> bool:
        return not self.slots

    @property
    def free(self) -> float:
        return self.cus / self.devcore

    def need(self, task: Task) -> tuple[int, int]:
        if task.whole:
            return self.devcore, self.devmem
        return (hami.percent_to_cus(task.percent, self.devcore),
                task.mem)

    def fits(self, task: Task) -> bool:
        if task.whole:
            return self.idle
        cus, mem = self.need(task)
        return self.slots < self.count and self.cus >= cus and \
            self.mem >= mem


class Node:
    def __init__(self, name: str, gpus: int, model: str, cpu: int,
                 host: int) -> None:
        self.name = name
        self.model = model
        self.cpu_total = cpu
        self.host_total = host
        self.cpu = cpu
        self.host = host
        self.gpus = [Gpu(self, n, model) for n in range(gpus)]
        self.refresh()

    def refresh(self) -> None:
        """Summaries kept for speed: usage, free GPUs, idle GPUs, most
        free CUs (fraction) on a GPU with a slot."""
        self.use = self.usage()
        self.free = self.free_gpus()
        self.idle = sum(1 for g in self.gpus if g.idle)
        self.best = max((g.free for g in self.gpus if g.slots < g.count),
                        default=0.0)

    def hosts(self, task: Task) -> bool:
        if self.cpu < task.cpu or self.host < task.host:
            return False
        if task.whole:
            return self.idle >= task.gpus
        return self.best >= task.percent / 100 - 0.01

    def fitting(self, task: Task) -> list[Gpu]:
        return [g for g in self.gpus if g.fits(task)]

    def usage(self) -> float:
        return sum(g.slots / g.count + 1 - g.free + 1 - g.mem / g.devmem
                   for g in self.gpus) / (3 * len(self.gpus))

    def free_gpus(self) -> float:
        return sum(g.free for g in self.gpus)


def make_cluster(nodes: int, seed: int) -> list[Node]:
    rng = random.Random(seed)
    weights = [t[0] for t in NODE_TYPES]
    result = []
    for n in range(nodes):
        _w, gpus, model, cpu, host = rng.choices(NODE_TYPES, weights)[0]
        result.append(Node('node-%05d' % n, gpus, model, cpu, host))
    return result


def make_tasks(cluster: list[Node], seed: int, load: float = 1.3
               ) -> list[Task]:
    """Tasks until ``load`` times the GPUs have been asked."""
    rng = random.Random(seed * 7919 + 1)
    total = sum(len(n.gpus) for n in cluster)
    asked = 0.0
    tasks = []
    shares = list(SHARES)
    share_w = list(SHARES.values())
    wholes = list(WHOLES)
    whole_w = list(WHOLES.values())
    while asked < load * total:
        name = 't%05d' % len(tasks)
        if rng.random() < SHARE_FRACTION:
            percent = rng.choices(shares, share_w)[0]
            mem = max(1024, int(percent / 100 * 65536 *
                                rng.uniform(0.5, 2.0)) // 1024 * 1024)
            cpu = min(16, max(1, round(percent / 100 * 12 *
                                       rng.uniform(0.3, 1.7))))
            task = Task(name, 1, percent, min(mem, 65536), cpu,
                        max(4, cpu * rng.randint(4, 12)))
            asked += percent / 100
        else:
            gpus = rng.choices(wholes, whole_w)[0]
            cpu = min(16 * gpus, max(1, round(gpus * 10 *
                                             rng.uniform(0.3, 1.7))))
            task = Task(name, gpus, 100, 0, cpu,
                        max(8, cpu * rng.randint(4, 12)))
            asked += gpus
        tasks.append(task)
    return tasks


def demand(task: Task) -> float:
    return task.gpus if task.whole else task.percent / 100


# --- the cluster's accounting, the same for every policy ---------------------

Choice = tuple[Node, list[Gpu]]


def apply(choice: Choice, task: Task) -> float:
    """Place ``task``; returns the GPU capacity it got (in GPUs)."""
    node, gpus = choice
    node.cpu -= task.cpu
    node.host -= task.host
    got = 0.0
    for gpu in gpus:
        cus, mem = gpu.need(task)
        if gpu.slots >= gpu.count or gpu.cus < cus or gpu.mem < mem:
            raise AssertionError('%s over-committed %s' % (task, gpu.uuid))
        gpu.cus -= cus
        gpu.mem -= mem
        gpu.slots += 1
        got += cus / gpu.devcore
    node.refresh()
    return got


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

    def _left(self, node: Node, task: Task) -> float:
        return (node.free - demand(task)) / len(node.gpus) + \
            (node.cpu - task.cpu) / node.cpu_total

    def choose(self, task: Task) -> Choice | None:
        best = None
        for node in self.cluster:
            if not node.hosts(task):
                continue
            gpus = _take(node, task, _tight(task))
            if gpus is None:
                continue
            key = (self._left(node, task),
                   sum(g.cus - g.need(task)[0] for g in gpus), node.name)
            if best is None or key < best[0]:
                best = (key, node, gpus)
        return None if best is None else (best[1], best[2])


class DotProduct(BestFit):
    name = 'dot-product'

    def choose(self, task: Task) -> Choice | None:
        best = None
        for node in self.cluster:
            if not node.hosts(task):
                continue
            gpus = _take(node, task, _tight(task))
            if gpus is None:
                continue
            size = len(node.gpus)
            dot = (node.free / size) * (demand(task) / size) + \
                (node.cpu / node.cpu_total) * (task.cpu / node.cpu_total) + \
                (node.host / node.host_total) * (task.host /
                                                 node.host_total)
            key = (dot, node.name)
            if best is None or key < best[0]:
                best = (key, node, gpus)
        return None if best is None else (best[1], best[2])


class Fgd:
    """Fragmentation gradient descent (Weng et al., ATC '23), from the
    paper: GPU compute and CPU, the workload's type distribution."""

    name = 'fgd'

    def __init__(self, cluster: list[Node], tasks: list[Task]) -> None:
        self.cluster = cluster
        counts = collections.Counter((demand(t), t.cpu) for t in tasks)
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


class Ours:
    """The extender's own decision on its own cache."""

    name = 'ours'

    def __init__(self, cluster: list[Node], tasks: list[Task],
                 candidates: int = 256) -> None:
        self.cluster = cluster
        self.by_uuid = {g.uuid: g for n in cluster for g in n.gpus}
        self.by_name = {n.name: n for n in cluster}
        self.cache = schedcache.ClusterCache(mix=packing.Mix(),
                                             candidates=candidates)
        objs = []
        for node in cluster:
            devices = [hami.DeviceInfo(
                id=g.uuid, index=g.index, numa=g.index // 4,
                type='AMD Instinct %s' % node.model, health=True,
                devicevendor='amd', **MODELS[node.model])
                for g in node.gpus]
            objs.append({'metadata': {'name': node.name, 'annotations': {
                hami.NODE_REGISTER: hami.encode_node_register(devices)}}})
        self.cache.replace_nodes(objs)
        self.cache.replace_pods([], 1)
        self.version = 1
        #: times the decision alone when set (see run)
        self.clock: _timing.DecisionClock | None = None

    @staticmethod
    def pod(task: Task) -> dict[str, Any]:
        limits = {hami.RESOURCE_GPU: str(task.gpus)}
        if not task.whole:
            limits[hami.RESOURCE_GPUCORES] = str(task.percent)
            limits[hami.RESOURCE_GPUMEM] = str(task.mem)
        return {'metadata': {'name': task.name, 'namespace': 'bench',
                             'annotations': {}},
                'spec': {'containers': [{'name': 'main', 'resources': {
                    'limits': limits}}]}}

    def choose(self, task: Task) -> Choice | None:
        names = [n.name for n in self.cluster if n.hosts(task)]
        pod = self.pod(task)
        request = fit.pod_request(pod)
        key = 'bench/' + task.name
        if self.clock is not None:
            self.clock.start()
        decision = self.cache.decide_and_reserve(key, request, names)
        if self.clock is not None:
            self.clock.stop()
        if decision.fit is None:
            return None
        # the annotation write returns a version; the watch shows the pod
        self.version += 1
        value = hami.encode_pod_devices(decision.fit.containers)
        self.cache.confirm(key, self.version)
        pod['metadata'].update(resourceVersion=str(self.version))
        pod['metadata']['annotations'].update({
            hami.DEVICES_ALLOCATED: value,
            hami.VGPU_NODE: decision.fit.node})
        pod['spec']['nodeName'] = decision.fit.node
        self.cache.set_pod(pod)
        gpus = [self.by_uuid[d.uuid] for d in decision.fit.containers[0]]
        return self.by_name[decision.fit.node], gpus


POLICIES: dict[str, Any] = {p.name: p for p in (Hami, BestFit, DotProduct,
                                                Fgd, Ours)}


@dataclasses.dataclass
class Outcome:
    name: str
    at_first_reject: float | None = None
    allocated: dict[float, float] = dataclasses.field(default_factory=dict)
    rejected: int = 0
    placed: int = 0
    clock: _timing.DecisionClock = dataclasses.field(
        default_factory=_timing.DecisionClock)


def run(name: str, nodes: int, seed: int, tasks: list[Task] | None = None,
        **options: Any) -> Outcome:
    cluster = make_cluster(nodes, seed)
    tasks = tasks or make_tasks(cluster, seed)
    total = sum(len(n.gpus) for n in cluster)
    policy = POLICIES[name](cluster, tasks, **options)
    outcome = Outcome(name)
    offered = allocated = 0.0
    marks = list(LOADS)
    inside = name == 'ours'   # times its decision, not the bench's work
    for task in tasks:
        offered += demand(task) / total
        timed = offered >= NEAR_FULL
        if inside:
            policy.clock = outcome.clock if timed else None
        elif timed:
            outcome.clock.start()
        choice = policy.choose(task)
        if timed and not inside:
            outcome.clock.stop()
        if choice is None:
            outcome.rejected += 1
            if outcome.at_first_reject is None:
                outcome.at_first_reject = allocated / total
        else:
            allocated += apply(choice, task)
            outcome.placed += 1
            if hasattr(policy, 'placed'):
                policy.placed(choice[0])
        while marks and offered >= marks[0] - 1e-9:
            outcome.allocated[marks.pop(0)] = allocated / total
    for mark in marks:
        outcome.allocated[mark] = allocated / total
    outcome.clock.close()
    return outcome


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--nodes', type=int, default=1200)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--policies', default=','.join(POLICIES),
                        help='comma-separated, of %s' % ', '.join(POLICIES))
    parser.add_argument('--candidates', type=int, default=256,
                        help='ours: nodes that fit compared per decision '
                             '([scheduler] packing_candidates)')
    args = parser.parse_args(argv)
    cluster = make_cluster(args.nodes, args.seed)
    tasks = make_tasks(cluster, args.seed)
    gpus = sum(len(n.gpus) for n in cluster)
    shares = sum(1 for t in tasks if not t.whole)
    print('%d nodes, %d GPUs; %d tasks (%d shares of one GPU, %d of whole '
          'GPUs) asking %.0f GPUs; seed %d' % (
              len(cluster), gpus, len(tasks), shares, len(tasks) - shares,
              sum(demand(t) for t in tasks), args.seed), flush=True)
    outcomes = []
    for name in args.policies.split(','):
        started = time.perf_counter()
        options = {'candidates': args.candidates} if name == 'ours' else {}
        outcome = run(name, args.nodes, args.seed, tasks, **options)
        outcomes.append(outcome)
        print('  %-11s done in %.1f s' % (name, time.perf_counter()
                                          - started), flush=True)
    print()
    print('GPU capacity allocated (%% of %d GPUs)' % gpus)
    print('%-11s %9s %7s %7s %9s' % ('policy', '1st rej.', '100 %',
                                     '130 %', 'rejected'))
    for o in outcomes:
        print('%-11s %8.2f%% %6.2f%% %6.2f%% %9d' % (
            o.name, 100 * (o.at_first_reject or 0), 100 * o.allocated[1.0],
            100 * o.allocated[1.3], o.rejected))
    print()
    print('Unallocated GPU capacity (%) by offered load')
    print('%-11s ' % 'policy' + ' '.join('%5d' % round(x * 100)
                                         for x in LOADS))
    for o in outcomes:
        print('%-11s ' % o.name + ' '.join(
            '%5.2f' % (100 * (1 - o.allocated[x])) for x in LOADS))
    print()
    base = next((o for o in outcomes if o.name == 'hami'), None)
    print('Decision time once %d %% was offered, ms (%s)'
          % (round(NEAR_FULL * 100), _timing.LEGEND))
    print(_timing.header('policy'))
    for o in outcomes:
        print(_timing.row(o.name, o.clock))
    if base is not None:
        print('Ratio to hami:')
        for o in outcomes:
            if o is not base:
                print('%-11s %s' % (o.name, _timing.ratio(o.clock,
                                                          base.clock)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
