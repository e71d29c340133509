"""Safe role change of a Nova GPU: check it is drained, then plan steps.

A GPU used by Nova (its VFs or the whole device) may change role only when
no instance holds it. Placement is the source of truth: while any consumer
has an allocation against the GPU's provider the change is refused. The
change itself is never done at runtime (no VF unbind, no PF rebind, no
``sriov_numvfs`` write: these have hung or crashed hosts); it is a sequence
of configuration changes ending in a reboot.
"""

from __future__ import annotations

import dataclasses

from amdgpu_virt import exception
from amdgpu_virt.model import PciAddress
from amdgpu_virt.nova import naming
from amdgpu_virt.nova.placement import PlacementReader


@dataclasses.dataclass(frozen=True)
class DrainPlan:
    host: str
    gpu: PciAddress
    provider: str
    provider_found: bool
    steps: tuple[str, ...]

    def __str__(self) -> str:
        head = ['GPU %s of host %s: no allocation against provider %s%s.' % (
            self.gpu, self.host, self.provider,
            '' if self.provider_found else ' (provider not found: Nova '
            'does not report this GPU)'), 'Steps, in order:']
        return '\n'.join(head + ['  %d. %s' % (i, step) for i, step in
                                 enumerate(self.steps, 1)])


def _steps(host: str, gpu: PciAddress, provider: str) -> tuple[str, ...]:
    return (
        'Optionally stop new instances landing on the GPU until step 3: '
        '"openstack compute service set --disable %s nova-compute".' % host,
        'Stop offering the GPU in [pci] device_spec: update its role in the '
        'ledger and re-render "amdgpu-virt nova config --ledger LEDGER '
        '--host %s", install the file on %s.' % (host, host),
        'Restart nova-compute on %s.' % host,
        'Confirm provider %s is gone: run "amdgpu-virt nova drain-check '
        '--gpu %s --host %s" again (it refuses if an instance landed in the '
        'meantime: drain again).' % (provider, gpu, host),
        'Render the new GIM / vfio-pci host configuration '
        '("amdgpu-virt nova gim-config --ledger LEDGER --host %s") and '
        'install it; never unbind VFs or rebind the PF at runtime.' % host,
        'Reboot %s; then re-render the Nova config for its new state and '
        're-enable the compute service if it was disabled.' % host,
    )


def drain_check(reader: PlacementReader, host: str,
                gpu: PciAddress | str) -> DrainPlan:
    """Refuse while Placement shows an allocation against the GPU.

    :returns: the ordered steps of a safe role change.
    :raises UnsafeRoleChange: naming the GPU, the provider and every
        consumer with what it holds.
    :raises PlacementError: a Placement request failed.
    """
    address = PciAddress.parse(gpu) if isinstance(gpu, str) else gpu
    name = naming.provider_name(host, str(address))
    provider = reader.provider_by_name(name)
    if provider is not None:
        allocations = reader.provider_allocations(provider.uuid)
        if allocations:
            held = '; '.join(
                'consumer %s holds %s' % (consumer, ', '.join(
                    '%s:%d' % item for item in sorted(resources.items())))
                for consumer, resources in sorted(allocations.items()))
            raise exception.UnsafeRoleChange(
                gpu=address, reason='Placement provider %s (%s) has '
                'allocations: %s. Move or delete those instances first.' % (
                    name, provider.uuid, held))
    return DrainPlan(host=host, gpu=address, provider=name,
                     provider_found=provider is not None,
                     steps=_steps(host, address, name))
