"""Isolated tenants never get a CU slice.

CU masks are cooperative: memory capacity, HBM bandwidth and the L2/MALL
caches stay shared, and the mask is a setting of the process itself. They
are not a boundary between mutually untrusted tenants.
"""

from __future__ import annotations

from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload


def cu_slice_refusal(tenancy: Tenancy) -> str | None:
    """Why a workload of ``tenancy`` may not get a CU slice (None: it may).

    The one statement of the tenancy rule: the planner (through
    :class:`IsolationFilter`), the admission webhook (for pods asking for
    raw ``amd.com/gpucores`` or ``amd.com/gpumem``) and its intent
    translation all ask it.
    """
    if tenancy is Tenancy.ISOLATED:
        return ('tenancy is isolated, and CU masks are not a security '
                'boundary (memory, HBM bandwidth and caches stay shared)')
    return None


class IsolationFilter(base.PolicyFilter):
    name = 'isolation'

    def check(self, workload: Workload, option: base.Option) -> Verdict:
        if option.kind is not Kind.CU:
            what = ('own VRAM slice and IOMMU group'
                    if option.kind is Kind.VF else 'the whole device')
            return self._verdict(option, True, 'isolates in hardware (%s)'
                                 % what)
        refusal = cu_slice_refusal(workload.tenancy)
        if refusal is not None:
            return self._verdict(option, False, refusal)
        return self._verdict(option, True, 'tenancy is trusted: cooperative '
                             'sharing is acceptable')
