"""The cluster and the workload of ``gpushare.py``: nodes, GPUs, host CPU
and memory, seeded task lists, and the accounting every policy shares.

Node shapes come in presets (:data:`PRESETS`): the GPU mix of the FGD
study's cluster (1, 2, 4 and 8 GPUs of MI300X and MI210, HAMi limits: CUs,
memory and 10 slots per GPU) with a CPU-per-GPU ratio and host memory per
GPU of each preset. Workloads (:data:`MIXES`):

* ``trace``: the shape of the production trace the FGD method replays
  (Weng et al., USENIX ATC '23): 13 % of tasks ask no GPU at all, shares
  are mostly large (81 %, 47 % and 32 % of a GPU the most common sizes),
  whole-GPU tasks ask a median of about 11 host cores per GPU;
* ``small``: this benchmark's first workload (heavy on small shares, no
  task without a GPU).
"""

from __future__ import annotations

import dataclasses
import random

from amdgpu_virt.sharing import hami

MODELS = {
    'MI300X': dict(devcore=304, devmem=196608, count=10),
    'MI210': dict(devcore=104, devmem=65536, count=10),
}
#: (weight, GPUs, model) of the node kinds
NODE_KINDS = ((30, 8, 'MI300X'), (20, 4, 'MI300X'), (10, 4, 'MI210'),
              (20, 2, 'MI210'), (20, 1, 'MI210'))


@dataclasses.dataclass(frozen=True)
class Preset:
    """Node shapes and a workload.

    :ivar cpu_per_gpu: host cores per GPU.
    :ivar mem_per_gpu: host memory per GPU, GiB.
    :ivar mix: the workload, a key of :data:`MIXES`.
    """

    name: str
    cpu_per_gpu: int
    mem_per_gpu: int
    mix: str
    about: str


PRESETS = {p.name: p for p in (
    Preset('cpu-tight', 12, 128, 'trace',
           'CPU binds: 12 cores per GPU (96 on 8-GPU nodes), 128 GiB per '
           'GPU'),
    Preset('today', 16, 256, 'trace',
           '16 cores and 256 GiB per GPU (128 cores on 8-GPU nodes)'),
    Preset('small-shares', 16, 256, 'small',
           'the first workload of this benchmark: small shares, no task '
           'without a GPU'),
)}


@dataclasses.dataclass(frozen=True)
class Mix:
    """A workload's sizes.

    :ivar gpuless: fraction of tasks asking no GPU.
    :ivar shares: fraction of GPU tasks asking a share of one GPU.
    :ivar share_sizes: percent of a GPU -> weight.
    :ivar wholes: whole GPUs -> weight.
    :ivar share_cpu: host cores of a whole GPU's worth of share.
    :ivar whole_cpu: median host cores per whole GPU.
    :ivar gpuless_cpu: host cores -> weight, of tasks without GPU.
    """

    gpuless: float
    shares: float
    share_sizes: dict[int, int]
    wholes: dict[int, int]
    share_cpu: float
    whole_cpu: float
    gpuless_cpu: dict[int, int]


MIXES = {
    'trace': Mix(0.13, 0.43,
                 {81: 28, 47: 20, 32: 16, 25: 6, 50: 6, 60: 5, 20: 5,
                  10: 6, 5: 4, 70: 4},
                 {1: 84, 2: 8, 4: 5, 8: 3}, 12.0, 11.0,
                 {1: 10, 2: 15, 4: 25, 8: 25, 16: 15, 32: 10}),
    'small': Mix(0.0, 0.78,
                 {5: 15, 10: 20, 12: 5, 20: 12, 25: 15, 30: 5, 40: 6,
                  50: 12, 60: 3, 75: 4, 80: 3},
                 {1: 55, 2: 15, 4: 18, 8: 12}, 12.0, 10.0, {1: 1}),
}
LOADS = tuple(x / 100 for x in range(60, 135, 5))


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    gpus: int          # 0: no GPU
    percent: int       # 100 with mem 0: whole GPUs
    mem: int           # MiB per GPU (0: whole)
    cpu: int           # cores
    host: int          # GiB

    @property
    def whole(self) -> bool:
        return self.gpus > 0 and self.percent == 100 and not self.mem

    @property
    def gpuless(self) -> bool:
        return not self.gpus

    @property
    def demand(self) -> float:
        """GPUs asked."""
        return self.gpus if self.whole else self.percent / 100 * self.gpus


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

    def room(self, task: Task) -> bool:
        """The host has the CPU and memory (kube-scheduler's check)."""
        return self.cpu >= task.cpu and self.host >= task.host

    def hosts(self, task: Task) -> bool:
        if not self.room(task):
            return False
        if task.gpuless:
            return True
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


def make_cluster(nodes: int, seed: int, preset: Preset) -> list[Node]:
    rng = random.Random(seed)
    weights = [k[0] for k in NODE_KINDS]
    result = []
    for n in range(nodes):
        _w, gpus, model = rng.choices(NODE_KINDS, weights)[0]
        result.append(Node('node-%05d' % n, gpus, model,
                           gpus * preset.cpu_per_gpu,
                           gpus * preset.mem_per_gpu))
    return result


def make_tasks(cluster: list[Node], seed: int, mix: Mix,
               load: float = 1.3) -> list[Task]:
    """Tasks until ``load`` times the GPUs have been asked (tasks without
    a GPU come in between, in their share of all tasks)."""
    rng = random.Random(seed * 7919 + 1)
    total = sum(len(n.gpus) for n in cluster)
    asked = 0.0
    tasks = []
    shares = list(mix.share_sizes)
    share_w = list(mix.share_sizes.values())
    wholes = list(mix.wholes)
    whole_w = list(mix.wholes.values())
    bare = list(mix.gpuless_cpu)
    bare_w = list(mix.gpuless_cpu.values())
    while asked < load * total:
        name = 't%05d' % len(tasks)
        draw = rng.random()
        if draw < mix.gpuless:
            cpu = rng.choices(bare, bare_w)[0]
            tasks.append(Task(name, 0, 0, 0, cpu,
                              max(2, cpu * rng.randint(2, 8))))
            continue
        if rng.random() < mix.shares:
            percent = rng.choices(shares, share_w)[0]
            mem = max(1024, int(percent / 100 * 65536 *
                                rng.uniform(0.5, 2.0)) // 1024 * 1024)
            cpu = min(16, max(1, round(percent / 100 * mix.share_cpu *
                                       rng.uniform(0.5, 1.5))))
            task = Task(name, 1, percent, min(mem, 65536), cpu,
                        max(4, cpu * rng.randint(4, 10)))
        else:
            gpus = rng.choices(wholes, whole_w)[0]
            # at most what an empty node of that many GPUs has in every
            # preset (12 cores per GPU): a task that no node could ever
            # hold says nothing of a policy
            cpu = min(12 * gpus, max(1, round(
                gpus * mix.whole_cpu * rng.uniform(0.6, 1.4))))
            task = Task(name, gpus, 100, 0, cpu,
                        max(8, cpu * rng.randint(4, 10)))
        asked += task.demand
        tasks.append(task)
    return tasks


# --- the cluster's accounting, the same for every policy ---------------------

Choice = tuple[Node, list[Gpu]]


def apply(choice: Choice, task: Task) -> float:
    """Place ``task``; returns the GPU capacity it asked (in GPUs: the
    FGD study's allocation measure, the same whichever GPU model takes a
    share, although a model's CUs round a percent down differently)."""
    node, gpus = choice
    if node.cpu < task.cpu or node.host < task.host:
        raise AssertionError('%s over-committed the host of %s'
                             % (task, node.name))
    node.cpu -= task.cpu
    node.host -= task.host
    for gpu in gpus:
        cus, mem = gpu.need(task)
        if gpu.slots >= gpu.count or gpu.cus < cus or gpu.mem < mem:
            raise AssertionError('%s over-committed %s' % (task, gpu.uuid))
        gpu.cus -= cus
        gpu.mem -= mem
        gpu.slots += 1
    if gpus:
        node.refresh()
    return task.demand if gpus else 0.0


def stranded(cluster: list[Node], tasks: list[Task]) -> tuple[int, float]:
    """(idle GPUs, free GPU capacity in GPUs) on nodes whose host has too
    little CPU or memory left for the smallest GPU task of ``tasks``."""
    gpu_tasks = [t for t in tasks if not t.gpuless]
    if not gpu_tasks:
        return 0, 0.0
    cpu = min(t.cpu for t in gpu_tasks)
    host = min(t.host for t in gpu_tasks)
    idle = 0
    free = 0.0
    for node in cluster:
        if node.cpu < cpu or node.host < host:
            idle += node.idle
            free += node.free
    return idle, free
