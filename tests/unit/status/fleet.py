"""A small live fleet for the status tests (pure: no cloud)."""

from __future__ import annotations

from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.inventory import simulate
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.policy import planner
from amdgpu_virt.policy import running
from amdgpu_virt.pool import crossaudit
from amdgpu_virt.pool.observed import NodeFacts
from amdgpu_virt.pool.observed import SideObservation
from amdgpu_virt.status import view
from tests.unit.policy import utils

GPU0 = '0000:05:00.0'
GPU1 = '0000:25:00.0'
GPU2 = '0000:45:00.0'


def hosts():
    return [simulate.design_host(simulate.HostSpec('gim', gpus=2,
                                                   mode='gim-cpx')),
            simulate.design_host(simulate.HostSpec('bm', gpus=3))]


def ledger():
    gpu = PciAddress.parse
    return av_ledger.build([
        av_ledger.GpuAssignment('gim', gpu(GPU0), Role.NOVA_VF, 'MI300X',
                                vf_count=8),
        av_ledger.GpuAssignment('gim', gpu(GPU1), Role.NOVA_VF, 'MI300X',
                                vf_count=8),
        av_ledger.GpuAssignment('bm', gpu(GPU0), Role.K8S_SHARED, 'MI300X'),
        av_ledger.GpuAssignment('bm', gpu(GPU1), Role.K8S_DEDICATED,
                                'MI300X'),
        av_ledger.GpuAssignment('bm', gpu(GPU2), Role.IDLE, 'MI300X')])


HOLDINGS = (
    running.Holding('instance/vm-a', running.NOVA, 'gim', GPU0, vfs=3),
    running.Holding('instance/vm-b', running.NOVA, 'gim', GPU0, vfs=1),
    running.Holding('pod/team/infer', running.KUBERNETES, 'bm', GPU0,
                    compute_units=76, memory_mib=8192),
    running.Holding('pod/team/small', running.KUBERNETES, 'bm', GPU0,
                    compute_units=38, memory_mib=4096),
    running.Holding('claim/team/train', running.KUBERNETES, 'bm', GPU1,
                    whole=True),
)


def plan(holdings=HOLDINGS):
    found = hosts()
    live = running.placements(utils.conf(), found, ledger(), holdings)
    return planner.plan(utils.conf(), found, [], live.ledger,
                        live.placements)


def observations(extra=()):
    gpu = PciAddress.parse
    return [
        SideObservation('nova', 'gim', gpu(GPU0), capacity=8,
                        consumers=('vm-a', 'vm-b'), detail='gim_0000:05'),
        SideObservation('nova', 'gim', gpu(GPU1), capacity=8,
                        detail='gim_0000:25'),
        SideObservation('k8s', 'bm', gpu(GPU0), capacity=10,
                        consumers=('team/infer', 'team/small')),
        SideObservation('k8s', 'bm', gpu(GPU1), offered=False,
                        consumers=('team/train',)),
        *extra]


def status(facts=None, extra=(), holdings=HOLDINGS, warnings=()):
    made = plan(holdings)
    audit = crossaudit.audit(ledger(), hosts(), observations(extra))
    facts = facts if facts is not None else {
        ('bm', PciAddress.parse(GPU0)): NodeFacts('healthy', '',
                                                  'kernel+hook'),
        ('bm', PciAddress.parse(GPU1)): NodeFacts(
            'unhealthy', 'RAS: 3 uncorrectable (UMC)', 'kernel+hook')}
    return made, view.build(made, audit, facts, warnings, ('nova', 'k8s'),
                            'ledger.yaml')
