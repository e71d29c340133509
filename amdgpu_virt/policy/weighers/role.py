"""Prefer GPUs that already play the role the kind needs.

Filling GPUs already configured for VFs or CU sharing keeps the number of
GPUs in use low and spares reconfiguration (a VF layout change means
drain, reconfigure, reboot).
"""

from __future__ import annotations

from amdgpu_virt.policy import base
from amdgpu_virt.policy.workload import Workload


class RoleWeigher(base.PolicyWeigher):
    name = 'role'
    multiplier_option = 'role_weight_multiplier'
    by_profile = True

    def weigh(self, workload: Workload, candidate: base.Candidate) -> float:
        """1 when all GPUs are in role, 0.5 when converted, 0 if mixed."""
        if candidate.unverified:
            return 0.0
        count = len(candidate.addresses) or 1
        ready = candidate.in_role / count
        return 0.5 + 0.5 * ready
