"""The same cluster and the same pods give the same decisions in every
process, whatever the hash seed of the interpreter.

Each run is a fresh interpreter (``PYTHONHASHSEED`` set apart), which
builds a seeded cluster, lists it into a packing cache that compares few
nodes per decision (so the order of the candidates matters), then places
a seeded sequence of pods, feeding each back as the watch would. The
decisions (node and GPUs of every pod) must be the same.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import testtools

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import packing

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))


def _node(name: str, gpus: int, devcore: int,
          devmem: int) -> dict[str, Any]:
    devices = [hami.DeviceInfo(
        id='%s-gpu%d' % (name, n), index=n, count=10, devmem=devmem,
        devcore=devcore, type='AMD Instinct', numa=0, health=True)
        for n in range(gpus)]
    return {'metadata': {'name': name, 'annotations': {
        hami.NODE_REGISTER: hami.encode_node_register(devices)}},
        'status': {'allocatable': {'cpu': str(12 * gpus),
                                   'memory': '%dGi' % (128 * gpus)}}}


def _cache() -> schedcache.ClusterCache:
    return schedcache.ClusterCache(mix=packing.Mix(refresh=10),
                                   candidates=4)


def _pod(rng: random.Random, number: int) -> dict[str, Any]:
    limits = {hami.RESOURCE_GPU: str(rng.choice((1, 1, 1, 2, 4)))}
    if rng.random() < 0.7:
        limits[hami.RESOURCE_GPU] = '1'
        limits[hami.RESOURCE_GPUCORES] = str(rng.choice(
            (10, 25, 32, 47, 81)))
        limits[hami.RESOURCE_GPUMEM] = str(rng.choice((1024, 8192)))
    return {'metadata': {'name': 'p%d' % number, 'namespace': 'ns',
                         'annotations': {}},
            'spec': {'containers': [{'name': 'main', 'resources': {
                'limits': limits, 'requests': {
                    'cpu': str(rng.randint(1, 12)),
                    'memory': '%dGi' % rng.randint(1, 64)}}}]}}


def decisions(seed: int = 7, nodes: int = 60, pods: int = 150,
              placed: list[dict[str, Any]] | None = None,
              listed: list[dict[str, Any]] | None = None) -> list[Any]:
    """Place ``pods`` seeded pods on ``nodes`` seeded nodes; return every
    decision as [node, [GPU uuid, ...]] (None: no fit).

    :param placed: filled with the placed pods as the watch shows them.
    :param listed: filled with the nodes as listed.
    """
    rng = random.Random(seed)
    cache = _cache()
    shapes = ((8, 304, 196608), (4, 304, 196608), (2, 104, 65536),
              (1, 104, 65536))
    # names that hash far apart, in an order of no meaning
    names = ['n%03d-%s' % (n, rng.choice('abcdefgh') * rng.randint(1, 4))
             for n in range(nodes)]
    rng.shuffle(names)
    node_objs = [_node(name, *rng.choice(shapes)) for name in names]
    if listed is not None:
        listed.extend(node_objs)
    cache.replace_nodes(node_objs)
    cache.replace_pods([], 1)
    version = 1
    result: list[Any] = []
    for number in range(pods):
        pod = _pod(rng, number)
        key = 'ns/p%d' % number
        decision = cache.decide_and_reserve(key, fit.pod_request(pod),
                                            names)
        if decision.fit is None:
            result.append(None)
            continue
        version += 1
        cache.confirm(key, version)
        pod['metadata']['resourceVersion'] = str(version)
        pod['metadata']['annotations'].update({
            hami.DEVICES_ALLOCATED: hami.encode_pod_devices(
                decision.fit.containers),
            hami.VGPU_NODE: decision.fit.node})
        pod['spec']['nodeName'] = decision.fit.node
        cache.set_pod(pod)
        if placed is not None:
            placed.append(pod)
        result.append([decision.fit.node, [
            d.uuid for c in decision.fit.containers for d in c]])
    return result


def _run(hash_seed: str) -> list[Any]:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    code = ('import json; from tests.unit.k8s.scheduler.cache.'
            'test_determinism import decisions; '
            'print(json.dumps(decisions()))')
    out = subprocess.run([sys.executable, '-c', code], cwd=_ROOT, env=env,
                         check=True, capture_output=True, text=True,
                         timeout=120)
    return json.loads(out.stdout)


class DeterminismTest(testtools.TestCase):

    def test_two_interpreters_with_other_hash_seeds_decide_alike(
            self) -> None:
        first = _run('1')
        self.assertGreater(sum(1 for d in first if d), 50)
        self.assertEqual(first, _run('2'))
        self.assertEqual(first, _run('12345'))

    def test_a_cache_listed_anew_decides_as_one_that_saw_each_change(
            self) -> None:
        # twenty alike nodes each given one alike pod, the last name first:
        # a cache that saw each change and one listed afterwards hold the
        # same state, and must choose the same node for the next pod
        names = ['x%02d' % n for n in range(20)]
        listed = [_node(name, 8, 304, 196608) for name in names]
        seen = schedcache.ClusterCache(mix=packing.Mix(), candidates=1)
        seen.replace_nodes(listed)
        seen.replace_pods([], 1)
        whole = {'metadata': {'name': 'p', 'namespace': 'ns'},
                 'spec': {'containers': [{'name': 'main', 'resources': {
                     'limits': {hami.RESOURCE_GPU: '1'}}}]}}
        request = fit.pod_request(whole)
        placed = []
        for number, name in enumerate(reversed(names)):
            key = 'ns/p%d' % number
            decision = seen.decide_and_reserve(key, request, [name])
            assert decision.fit is not None
            pod = {'metadata': {'name': 'p%d' % number, 'namespace': 'ns',
                                'resourceVersion': str(2 + number),
                                'annotations': {
                                    hami.DEVICES_ALLOCATED:
                                    hami.encode_pod_devices(
                                        decision.fit.containers),
                                    hami.VGPU_NODE: name}},
                   'spec': {'nodeName': name}}
            seen.confirm(key, 2 + number)
            seen.set_pod(pod)
            placed.append(pod)
        fresh = schedcache.ClusterCache(mix=packing.Mix(), candidates=1)
        fresh.replace_nodes(listed)
        fresh.replace_pods(placed, 100)
        one = seen.decide_and_reserve('ns/q', request, names).fit
        other = fresh.decide_and_reserve('ns/q', request, names).fit
        assert one is not None
        self.assertEqual(one, other)
