"""Workloads sensitive to interference keep away from shared GPUs."""

from __future__ import annotations

from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Sensitivity
from amdgpu_virt.policy.workload import Workload


class InterferenceFilter(base.PolicyFilter):
    """No CU slice above ``[policy] cu_max_sensitivity``.

    A CU mask gives disjoint CUs, but HBM bandwidth, L2 and MALL remain
    shared with the neighbours; a VF (~96-99 % of bare-metal bandwidth) or
    a whole GPU do not share them this way.
    """

    name = 'interference'

    def check(self, workload: Workload, option: base.Option) -> Verdict:
        if option.kind is not Kind.CU:
            return self._verdict(option, True, 'no shared CUs, caches or HBM '
                                 'bandwidth with neighbours')
        limit = Sensitivity(self.conf.policy.cu_max_sensitivity)
        if workload.sensitivity.level > limit.level:
            return self._verdict(
                option, False, 'sensitivity %s is above %s, the most a CU '
                'slice accepts ([policy] cu_max_sensitivity): neighbours '
                'share HBM bandwidth and caches' % (
                    workload.sensitivity.value, limit.value))
        return self._verdict(option, True, 'sensitivity %s is within %s'
                             % (workload.sensitivity.value, limit.value))
