"""Keep interference-sensitive workloads off shared GPUs."""

from __future__ import annotations

from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.workload import Workload

_CU_SCORE = {'low': 1.0, 'medium': 0.5, 'high': 0.0}


class InterferenceWeigher(base.PolicyWeigher):
    name = 'interference'
    multiplier_option = 'interference_weight_multiplier'
    by_profile = True

    def weigh(self, workload: Workload, candidate: base.Candidate) -> float:
        """1 for a dedicated GPU or a VF; lower for a CU slice."""
        if candidate.kind is Kind.CU:
            return _CU_SCORE[workload.sensitivity.value]
        return 1.0
