"""The scheduler extender's Prometheus metrics.

:class:`Metrics` keeps the extender's histograms and counters in a
registry of its own, with gauges read from the
:class:`~amdgpu_virt.k8s.scheduler.cache.cluster.ClusterCache`;
:mod:`~amdgpu_virt.k8s.scheduler.core` records into it and
:mod:`~amdgpu_virt.k8s.scheduler.handler` serves it on ``/metrics``.
"""

from __future__ import annotations

import prometheus_client

from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The extender's Prometheus metrics, in a registry of their own."""

    def __init__(self, cache: schedcache.ClusterCache) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.filter_seconds = prometheus_client.Histogram(
            'amdgpu_virt_extender_filter_seconds',
            'Time to answer /filter (decision and annotation write).',
            buckets=_BUCKETS, registry=self.registry)
        self.decide_seconds = prometheus_client.Histogram(
            'amdgpu_virt_extender_decide_seconds',
            'Time of the /filter decision on the cache alone.',
            buckets=_BUCKETS, registry=self.registry)
        self.bind_seconds = prometheus_client.Histogram(
            'amdgpu_virt_extender_bind_seconds',
            'Time to answer /bind (node lock, bind phase, binding).',
            buckets=_BUCKETS, registry=self.registry)
        self.decisions = prometheus_client.Counter(
            'amdgpu_virt_extender_decisions',
            'Answers by verb and result (fit, nofit, bound, error, '
            'ignored).', ['verb', 'result'], registry=self.registry)
        nodes = prometheus_client.Gauge(
            'amdgpu_virt_extender_cache_nodes', 'Nodes in the cache.',
            registry=self.registry)
        nodes.set_function(cache.node_count)
        gpu_pods = prometheus_client.Gauge(
            'amdgpu_virt_extender_cache_pods',
            'Live pods holding AMD GPUs in the cache.',
            registry=self.registry)
        gpu_pods.set_function(cache.pod_count)
        reserved = prometheus_client.Gauge(
            'amdgpu_virt_extender_cache_reservations',
            'Filter decisions not yet seen back through the watch.',
            registry=self.registry)
        reserved.set_function(cache.reservation_count)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
