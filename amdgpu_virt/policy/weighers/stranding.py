"""Prefer the kind that strands the least capacity.

A 24 GB job on a whole 192 GB GPU strands 7/8 of it; on a VF it strands
what the VF has beyond the request; a CU slice is cut to measure.
"""

from __future__ import annotations

from amdgpu_virt.policy import base
from amdgpu_virt.policy.workload import Workload


class StrandingWeigher(base.PolicyWeigher):
    name = 'stranding'
    multiplier_option = 'stranding_weight_multiplier'
    by_profile = True

    def weigh(self, workload: Workload, candidate: base.Candidate) -> float:
        """1 - the share of the granted unit the workload leaves unused."""
        model = candidate.model
        total_cus = model.compute_units or 1
        vram = model.vram_mib or 1
        granted = max(candidate.unit_cus / total_cus,
                      candidate.unit_mib / vram)
        if granted <= 0:
            return 0.0
        used = workload.fraction_on(model)
        return 1.0 - max(0.0, granted - used)
