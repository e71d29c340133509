"""VMs get a dedicated GPU or a VF; pods a dedicated GPU or a CU slice."""

from __future__ import annotations

from amdgpu_virt.model import Kind
from amdgpu_virt.policy import base
from amdgpu_virt.policy.decision import Verdict
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Workload

#: what each platform can consume
KINDS = {
    Platform.VM: (Kind.DEDICATED, Kind.VF),
    Platform.POD: (Kind.DEDICATED, Kind.CU),
    Platform.ANY: (Kind.DEDICATED, Kind.VF, Kind.CU),
}
_WHY = {
    (Platform.VM, Kind.CU): 'a VM cannot use a CU mask: CU masks are '
    'environment settings of processes in a container, a VM gets PCI '
    'devices (a whole GPU by vfio-pci or an SR-IOV VF)',
    (Platform.POD, Kind.VF): 'a pod cannot use an SR-IOV VF here: VFs are '
    'handed to VMs through Nova PCI passthrough',
}


class PlatformFilter(base.PolicyFilter):
    name = 'platform'

    def check(self, workload: Workload, option: base.Option) -> Verdict:
        allowed = KINDS[workload.platform]
        if option.kind in allowed:
            return self._verdict(option, True, 'platform %s can use %s' % (
                workload.platform.value, ', '.join(k.value for k in allowed)))
        return self._verdict(option, False, _WHY[(workload.platform,
                                                  option.kind)])
