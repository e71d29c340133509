"""A stand-in of kube-scheduler's default profile, for tasks without a GPU.

Written from kube-scheduler's source (``pkg/scheduler/schedule_one.go``
and ``pkg/scheduler/framework/plugins/noderesources``):

* filter ``NodeResourcesFit``: the node's free CPU and memory hold the
  request;
* only the first ``numFeasibleNodesToFind`` feasible nodes are scored,
  searched from where the previous pod's search stopped (with the default
  ``percentageOfNodesToScore`` 0: ``50 - nodes / 125`` percent, at least
  5 % and at least 100 nodes);
* score ``NodeResourcesFit`` (weight 1): ``LeastAllocated`` (the default)
  or ``MostAllocated`` over CPU and memory (weights 1 and 1), integer
  arithmetic as in Go: ``(allocatable - requested) * 100 / allocatable``
  per resource, averaged; a resource the pod does not ask and that is an
  extended resource (``amd.com/gpu``) is left out of the score, so
  weighing ``amd.com/gpu`` changes nothing for a pod without GPUs;
* score ``NodeResourcesBalancedAllocation`` (weight 1):
  ``(1 - |cpu fraction - memory fraction| / 2) * 100``;
* optionally an extender's ``/prioritize`` (scores 0-10, times its weight
  and 10, as kube-scheduler scales them);
* the best total wins, ties drawn at random (``selectHost``).

Other plugins of the default profile (taints, affinity, topology spread,
image locality) score these tasks alike on every node.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from _gpushare_model import Node
from _gpushare_model import Task

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
#: the default profile's adaptive sample
MIN_FEASIBLE = 100
MIN_PERCENTAGE = 5

#: task, node names -> extender score 0..10 per name
Prioritize = Callable[[Task, list[str]], dict[str, int]]


def feasible_to_find(nodes: int, percentage: int = 0) -> int:
    if nodes < MIN_FEASIBLE:
        return nodes
    if percentage == 0:
        percentage = max(MIN_PERCENTAGE, 50 - nodes // 125)
    return max(MIN_FEASIBLE, nodes * percentage // 100)


class DefaultScheduler:
    """Places tasks without a GPU as a stock kube-scheduler would.

    :param strategy: ``least`` (LeastAllocated) or ``most``
        (MostAllocated).
    :param prioritize: an extender's scores and its weight.
    """

    def __init__(self, cluster: list[Node], seed: int,
                 strategy: str = 'least', percentage: int = 0,
                 prioritize: tuple[Prioritize, int] | None = None) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed * 31 + 7)
        self.strategy = strategy
        self.prioritize = prioritize
        self.to_find = feasible_to_find(len(cluster), percentage)
        self.start = 0

    def _fit_score(self, node: Node, task: Task) -> int:
        total = 0
        for allocatable, requested in (
                (node.cpu_total * 1000,
                 (node.cpu_total - node.cpu + task.cpu) * 1000),
                (node.host_total << 30,
                 (node.host_total - node.host + task.host) << 30)):
            if requested > allocatable or not allocatable:
                continue
            if self.strategy == 'least':
                total += (allocatable - requested) * MAX_NODE_SCORE // \
                    allocatable
            else:
                total += requested * MAX_NODE_SCORE // allocatable
        return total // 2

    @staticmethod
    def _balance(node: Node, task: Task) -> int:
        cpu = min(1.0, (node.cpu_total - node.cpu + task.cpu)
                  / node.cpu_total)
        mem = min(1.0, (node.host_total - node.host + task.host)
                  / node.host_total)
        return int((1 - abs(cpu - mem) / 2) * MAX_NODE_SCORE)

    def feasible(self, task: Task) -> list[Node]:
        """The nodes kube-scheduler scores, searched from where it
        stopped last."""
        found: list[Node] = []
        count = len(self.cluster)
        processed = 0
        for step in range(count):
            node = self.cluster[(self.start + step) % count]
            processed += 1
            if node.room(task):
                found.append(node)
                if len(found) >= self.to_find:
                    break
        self.start = (self.start + processed) % count
        return found

    def choose(self, task: Task) -> Node | None:
        nodes = self.feasible(task)
        if not nodes:
            return None
        extra: dict[str, int] = {}
        weight = 0
        if self.prioritize is not None:
            func, weight = self.prioritize
            extra = func(task, [n.name for n in nodes])
        best: list[Node] = []
        top = -1
        for node in nodes:
            score = self._fit_score(node, task) + self._balance(node, task) \
                + extra.get(node.name, 0) * weight * (
                    MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
            if score > top:
                top, best = score, [node]
            elif score == top:
                best.append(node)
        return best[0] if len(best) == 1 else self.rng.choice(best)


def options() -> dict[str, dict[str, Any]]:
    """The placements of tasks without GPU this benchmark measures, by
    name: ``stock`` (the default profile), ``most-allocated`` (its
    ``NodeResourcesFit`` scoring MostAllocated), ``extender`` (the stock
    profile plus the project's ``/prioritize`` at weight 5)."""
    return {'stock': dict(strategy='least'),
            'most-allocated': dict(strategy='most'),
            'extender': dict(strategy='least', weight=5)}
