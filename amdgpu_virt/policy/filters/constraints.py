"""The workload's own constraints: GPU model and NUMA node."""

from __future__ import annotations

from amdgpu_virt.model import Gpu
from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Workload


class ConstraintsFilter(base.PolicyFilter):
    name = 'constraints'

    def check(self, workload: Workload, option: base.Option) -> Verdict:
        if workload.allows_model(option.model):
            text = ('model %s is allowed' % option.model.name
                    if workload.models else 'any model')
            if workload.numa_node is not None:
                text += '; GPUs must sit on NUMA node %d' % workload.numa_node
            return self._verdict(option, True, text, per_model=True)
        return self._verdict(
            option, False, 'model %s is not among the requested %s' % (
                option.model.name, ', '.join(workload.models)),
            per_model=True)

    def gpu_refusal(self, workload: Workload, kind: Kind,
                    gpu: Gpu) -> str | None:
        if (workload.numa_node is not None
                and gpu.numa_node != workload.numa_node):
            return 'GPU %s is on NUMA node %s, not %d' % (
                gpu.address, gpu.numa_node, workload.numa_node)
        return None

    def refuses_gpus(self, workload: Workload) -> bool:
        return workload.numa_node is not None
