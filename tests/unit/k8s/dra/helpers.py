"""Hosts and ledgers for the DRA tests."""

from __future__ import annotations

from amdgpu_virt import ledger
from amdgpu_virt import model
from amdgpu_virt.inventory import simulate

DRIVER = 'gpu.amd.com'


def host(kind: str) -> model.HostInventory:
    return simulate.design_host(simulate.KINDS[kind])


def full_cpx_host() -> model.HostInventory:
    """8 x MI300X CPX with all 64 partitions.

    The simulated CPX host shows 63: the last partition gets no DRM minor
    (the 63-partition quirk of real hosts). This one has the 64th back.
    """
    inv = host('mi300x-cpx-nps4')
    last = inv.gpus[-1]
    prev = last.partitions[-1]
    extra = model.replace(prev, index=prev.index + 1,
                          kfd_node=(prev.kfd_node or 0) + 1,
                          render_minor=(prev.render_minor or 0) + 1,
                          card_minor=(prev.card_minor or 0) + 1,
                          unique_id='%016x' % (int(prev.unique_id, 16) + 1))
    gpus = inv.gpus[:-1] + (model.replace(
        last, partitions=last.partitions + (extra,)),)
    return model.replace(inv, gpus=gpus)


def roles(inv: model.HostInventory, node: str, *role_list: model.Role,
          ) -> ledger.Ledger:
    """A ledger giving GPU i of ``inv`` the i-th role."""
    return ledger.Ledger(tuple(
        ledger.GpuAssignment(node, gpu.address, role, gpu.model.name,
                             vf_count=8 if role is model.Role.NOVA_VF
                             else None)
        for gpu, role in zip(inv.gpus, role_list, strict=False)))
