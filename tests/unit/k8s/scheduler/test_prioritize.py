"""``/prioritize`` for pods that ask no AMD GPU: kept off the CPU and
memory that GPUs need, in the chosen namespaces only."""

from __future__ import annotations

from typing import Any
from unittest import mock

import testtools

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.scheduler import core
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.sharing import packing
from tests.unit.k8s.scheduler.cache.test_hosts import _node
from tests.unit.k8s.scheduler.cache.test_hosts import _pod


def _args(namespace: str, cpu: str, names: list[str]) -> dict[str, Any]:
    pod = _pod('web', cpu, '8Gi')
    pod['metadata']['namespace'] = namespace
    return {'Pod': pod, 'NodeNames': names}


class GpulessPrioritizeTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        cache = schedcache.ClusterCache(mix=packing.Mix(refresh=1))
        cache.replace_nodes([_node('gpu', 8, '96', '1Ti'),
                             _node('roomy', 8, '512', '4Ti'),
                             _node('cpu', 0, '96', '1Ti')])
        cache.replace_pods([], 1)
        # recent GPU pods ask 11 cores per GPU
        for number in range(20):
            cache.decide_and_reserve('ns/w%d' % number, fit.pod_request(
                _pod('w', '11', '64Gi', limits={'amd.com/gpu': '1'})),
                ['roomy'])
        self.extender = core.Extender(cache, mock.Mock(),
                                      gpuless_namespaces=['batch'])

    def _scores(self, args: dict[str, Any]) -> dict[str, int]:
        return {s['Host']: s['Score']
                for s in self.extender.prioritize(args)}

    def test_pods_of_the_chosen_namespaces_keep_off_gpu_hosts(self) -> None:
        names = ['gpu', 'roomy', 'cpu', 'unknown']
        # 40 cores beside 8 idle GPUs that need 88: the GPU node loses
        # capacity, the roomy one (512 cores) and the CPU-only one none
        self.assertEqual({'gpu': 0, 'roomy': 10, 'cpu': 10, 'unknown': 10},
                         self._scores(_args('batch', '40', names)))
        # a small pod strands nothing anywhere: no preference
        self.assertEqual({'gpu': 10, 'roomy': 10, 'cpu': 10, 'unknown': 10},
                         self._scores(_args('batch', '1', names)))

    def test_other_namespaces_get_no_preference(self) -> None:
        self.assertEqual({'gpu': 0, 'cpu': 0},
                         self._scores(_args('team', '40', ['gpu', 'cpu'])))
        self.extender.gpuless_namespaces = frozenset({'*'})
        self.assertEqual({'gpu': 0, 'cpu': 10},
                         self._scores(_args('team', '40', ['gpu', 'cpu'])))

    def test_unreadable_requests_get_no_preference(self) -> None:
        args = _args('batch', 'lots', ['gpu', 'cpu'])
        self.assertEqual({'gpu': 0, 'cpu': 0}, self._scores(args))
