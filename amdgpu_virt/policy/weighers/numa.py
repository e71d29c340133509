"""Prefer placements whose GPUs share one NUMA node."""

from __future__ import annotations

from amdgpu_virt.policy import base
from amdgpu_virt.policy.workload import Workload


class NumaWeigher(base.PolicyWeigher):
    name = 'numa'
    multiplier_option = 'numa_weight_multiplier'
    by_profile = True

    def weigh(self, workload: Workload, candidate: base.Candidate) -> float:
        """1 / the number of distinct NUMA nodes of the GPUs."""
        nodes = set(candidate.numa_nodes)
        return 1.0 / max(1, len(nodes))
