"""How this node enforces the memory limits of slices, GPU by GPU.

The vocabulary (:class:`Level`, :class:`Requirement`, the label and
attribute names) is :mod:`amdgpu_virt.sharing.enforcement`, re-exported
here. :func:`assess` judges each GPU from what the kernel offers (the
dmem controller and the GPU's VRAM region, :mod:`.dmem`) and from the
LD_AUDIT library (:mod:`.memhook`); :func:`share_count` decides with
``[kubernetes] memory_enforcement`` whether the node offers slices at
all: a node whose GPUs do not all meet it offers whole GPUs only, as one
without the library did before, and says why. :func:`publish` labels the
Node with the weakest level and, when slices are refused, records a
Warning Event naming each GPU's reasons.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import events
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.k8s.node import memhook
from amdgpu_virt.sharing.enforcement import CUSTOMINFO_KEY
from amdgpu_virt.sharing.enforcement import DRA_ATTRIBUTE
from amdgpu_virt.sharing.enforcement import Level
from amdgpu_virt.sharing.enforcement import NAMESPACE_LABEL
from amdgpu_virt.sharing.enforcement import NODE_LABEL
from amdgpu_virt.sharing.enforcement import Requirement
from amdgpu_virt.sharing.enforcement import weakest

LOG = logging.getLogger(__name__)

__all__ = ['CUSTOMINFO_KEY', 'DRA_ATTRIBUTE', 'EVENT_REASON', 'Level',
           'NAMESPACE_LABEL', 'NODE_LABEL', 'NodeEnforcement',
           'Requirement', 'assess', 'from_conf', 'publish', 'share_count']

EVENT_REASON = 'MemoryEnforcementInsufficient'


@dataclasses.dataclass(frozen=True)
class NodeEnforcement:
    """Each GPU's level, and why it is not stronger.

    :ivar levels: PCI address -> level.
    :ivar kernel_reasons: PCI address -> why the kernel does not cap it
        ('' when it does).
    :ivar hook: the LD_AUDIT library's verdict (None: not checked).
    """

    requirement: Requirement
    levels: Mapping[str, Level]
    kernel_reasons: Mapping[str, str]
    hook: memhook.HookStatus | None = None
    dmem: dmem.NodeDmem | None = None

    @property
    def offers_slices(self) -> bool:
        """Every GPU meets the requirement."""
        return all(self.requirement.met_by(level)
                   for level in self.levels.values())

    @property
    def kernel(self) -> bool:
        """The kernel caps at least one GPU (PreStart caps are needed)."""
        return any(level.kernel for level in self.levels.values())

    def weakest(self) -> Level | None:
        return weakest(self.levels.values())

    def why(self, address: str) -> str:
        """Why GPU ``address`` is at its level, in one sentence."""
        level = self.levels[address]
        parts = []
        if not level.kernel:
            parts.append('no kernel cap: %s' % (
                self.kernel_reasons.get(address) or 'not checked'))
        if not level.hook:
            parts.append('no LD_AUDIT hook: %s' % (
                self.hook.reason if self.hook is not None
                else 'not checked'))
        return '%s %s%s' % (address, level.value,
                            ' (%s)' % '; '.join(parts) if parts else '')

    def refusal(self) -> str:
        """Why the node offers no slices ('' when it does)."""
        short = [a for a, level in sorted(self.levels.items())
                 if not self.requirement.met_by(level)]
        if not short:
            return ''
        return ('[kubernetes] memory_enforcement = %s needs %s for slices, '
                'and %s' % (self.requirement.value,
                            self.requirement.describe(),
                            '; '.join(self.why(a) for a in short)))


def assess(requirement: Requirement, addresses: Iterable[str],
           node: dmem.NodeDmem | None,
           hook: memhook.HookStatus | None) -> NodeEnforcement:
    """Each GPU's level (pure).

    :param node: what the kernel offers (None: not checked).
    :param hook: the library's verdict (None: not checked, no hook).
    """
    levels: dict[str, Level] = {}
    reasons: dict[str, str] = {}
    for address in sorted(set(addresses)):
        reason = node.gpu_reason(address) if node is not None \
            else 'not checked'
        reasons[address] = reason
        levels[address] = Level.of(not reason,
                                   hook is not None and hook.usable)
    return NodeEnforcement(requirement, levels, reasons, hook, node)


def _kernel(conf: Any) -> dmem.NodeDmem:
    """The dmem controller as the pods' cgroups see it."""
    group = conf.kubernetes
    fs = cgroups.CgroupFs(group.cgroup_root)
    node = dmem.probe(fs)
    if not node.available:
        return node
    try:
        cgroups.detect_driver(
            fs, cgroups.driver_setting(group.cgroup_driver),
            cgroups.kubelet_root_parts(group.kubelet_cgroup_root))
    except exception.CgroupError as err:
        return dmem.NodeDmem(False, str(err), node.capacity)
    return node


def from_conf(conf: Any, addresses: Iterable[str]) -> NodeEnforcement:
    """The levels of the GPUs ``addresses`` on this node."""
    group = conf.kubernetes
    return assess(Requirement(group.memory_enforcement), addresses,
                  _kernel(conf), memhook.check(group.vgpu_library))


def share_count(conf: Any, addresses: Iterable[str]
                ) -> tuple[int, NodeEnforcement | None]:
    """The device plugin slots per GPU this node may offer.

    ``[kubernetes] share_count``, or 1 (whole GPUs only) when the GPUs
    would be shared (allocation_mode ``hami`` and share_count > 1) and
    not every GPU meets ``[kubernetes] memory_enforcement``. The
    assessment is None when nothing is shared.
    """
    group = conf.kubernetes
    if group.allocation_mode != 'hami' or group.share_count <= 1:
        return group.share_count, None
    judged = from_conf(conf, addresses)
    if judged.offers_slices:
        LOG.info('memory enforcement %s; sharing each GPU among up to %d '
                 'pods', ', '.join(judged.why(a) for a in judged.levels),
                 group.share_count)
        return group.share_count, judged
    LOG.warning('%s; offering whole GPUs only (1 slot per GPU instead of '
                '%d)', judged.refusal(), group.share_count)
    return 1, judged


def label_value(judged: NodeEnforcement) -> str | None:
    weakest_level = judged.weakest()
    return weakest_level.label if weakest_level is not None else None


def report(store: Any, core_api: Any, judged: NodeEnforcement,
           share: int, now: str) -> None:
    """Label the Node with the weakest level and, when the node offers
    no slices because of it, record a Warning Event.

    :raises KubernetesError: the node could not be read or labelled.
    """
    node = store.read()
    value = label_value(judged)
    if ((node.get('metadata') or {}).get('labels') or {}).get(
            NODE_LABEL) != value:
        store.label(node, {NODE_LABEL: value})
    refusal = judged.refusal()
    if not refusal:
        return
    events.record(core_api, memhook.node_event(
        node, EVENT_REASON, 'memory-enforcement', '%s; this node offers '
        'whole GPUs only (%d slot per GPU)' % (refusal, share), now))


def publish(node_agent: Any) -> None:
    """:func:`report` for a node agent made by ``agent.from_conf`` (its
    ``enforcement``); a failure to publish is logged, never fatal."""
    memhook.publish_with(node_agent, getattr(node_agent, 'enforcement',
                                             None),
                         report, 'memory enforcement')
