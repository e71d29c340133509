"""Multi-GPU workloads that need peer-to-peer DMA get dedicated GPUs.

IOMMU isolation blocks GPU P2P DMA between SR-IOV VFs; XGMI peer access is
available to whole GPUs of one host only.
"""

from __future__ import annotations

from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Workload


class P2pFilter(base.PolicyFilter):
    name = 'p2p'

    def check(self, workload: Workload, option: base.Option) -> Verdict:
        if not workload.p2p:
            return self._verdict(option, True, 'no peer-to-peer DMA needed')
        if workload.gpus == 1:
            return self._verdict(option, True, 'p2p asked for, but one GPU '
                                 'has no peer to reach')
        if option.kind is Kind.DEDICATED:
            return self._verdict(option, True, '%d whole GPUs of one host '
                                 'reach each other over XGMI'
                                 % workload.gpus)
        if option.kind is Kind.VF:
            return self._verdict(option, False, 'needs P2P between %d GPUs, '
                                 'and IOMMU isolation blocks P2P DMA between '
                                 'VFs' % workload.gpus)
        return self._verdict(option, False, 'needs P2P between %d GPUs; '
                             'only whole dedicated GPUs are given for P2P '
                             'jobs' % workload.gpus)
