"""Memory enforcement of a GPU's slices: the vocabulary (pure).

A slice of a shared GPU gets a VRAM limit; what enforces it is the GPU's
*level*:

``kernel``
    the node's kernel caps the slice's VRAM through the ``dmem`` cgroup
    controller (Linux 6.14+, cgroup v2): every process of the container,
    whatever it is linked with, is bound;
``hook``
    the ``LD_AUDIT`` memory-limit library enforces
    ``HIP_DEVICE_MEMORY_LIMIT_<i>`` in processes that load it (dynamically
    linked glibc programs);
``kernel+hook``
    both (the hook also makes ``hipMemGetInfo`` report the slice, so
    engines that size themselves see it);
``none``
    nothing: a slice's memory limit is advisory.

The levels are ordered ``none`` < ``hook`` < ``kernel`` < ``kernel+hook``:
only the kernel binds every process. A :class:`Requirement` says which
levels are enough for a GPU to offer slices (``[kubernetes]
memory_enforcement``) or for a namespace's pods (the namespace label
:data:`NAMESPACE_LABEL`).

Where the level is published: the node registration's ``custominfo``
(:data:`CUSTOMINFO_KEY`), the node label :data:`NODE_LABEL` (the weakest
level of the node's GPUs, in label-safe form: ``kernel-hook`` for
``kernel+hook``) and the DRA devices' attribute :data:`DRA_ATTRIBUTE`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

#: custominfo key of a registered GPU (``hami.io/node-amd-register``)
CUSTOMINFO_KEY = 'memoryEnforcement'
#: node label: the weakest level among the node's GPUs that offer slices
NODE_LABEL = 'amdgpu-virt.io/memory-enforcement'
#: string attribute of the DRA driver's devices
DRA_ATTRIBUTE = 'memoryEnforcement'
#: namespace label (set by administrators; pods cannot set it) whose
#: value is a :class:`Requirement` the namespace's slices must meet
NAMESPACE_LABEL = 'gpu.amd.com/memory-enforcement'


class Level(str, enum.Enum):
    """What enforces a slice's VRAM limit on one GPU."""

    __hash__ = str.__hash__

    KERNEL = 'kernel'
    HOOK = 'hook'
    KERNEL_HOOK = 'kernel+hook'
    NONE = 'none'

    @classmethod
    def of(cls, kernel: bool, hook: bool) -> Level:
        if kernel:
            return cls.KERNEL_HOOK if hook else cls.KERNEL
        return cls.HOOK if hook else cls.NONE

    @property
    def kernel(self) -> bool:
        return self in (Level.KERNEL, Level.KERNEL_HOOK)

    @property
    def hook(self) -> bool:
        return self in (Level.HOOK, Level.KERNEL_HOOK)

    @property
    def rank(self) -> int:
        """0 (none) .. 3 (kernel+hook): only the kernel binds every
        process, so ``kernel`` outranks ``hook``."""
        return _RANK[self]

    @property
    def label(self) -> str:
        """The label-safe text (``kernel-hook`` for ``kernel+hook``)."""
        return self.value.replace('+', '-')

    @classmethod
    def from_text(cls, text: Any) -> Level | None:
        """The level ``text`` names (its value or label form), or None."""
        if not isinstance(text, str):
            return None
        return _BY_TEXT.get(text)


_RANK = {Level.NONE: 0, Level.HOOK: 1, Level.KERNEL: 2,
         Level.KERNEL_HOOK: 3}
_BY_TEXT = {**{level.value: level for level in Level},
            **{level.label: level for level in Level}}


def weakest(levels: Iterable[Level]) -> Level | None:
    """The lowest-ranked of ``levels`` (None when there is none)."""
    return min(levels, key=lambda level: level.rank, default=None)


class Requirement(str, enum.Enum):
    """Which levels are enough (option and namespace-label values)."""

    __hash__ = str.__hash__

    KERNEL_OR_HOOK = 'kernel-or-hook'
    KERNEL = 'kernel'
    HOOK = 'hook'
    KERNEL_AND_HOOK = 'kernel-and-hook'
    NONE = 'none'

    def met_by(self, level: Level | None) -> bool:
        """Whether a GPU at ``level`` (None: unknown) meets it."""
        if self is Requirement.NONE:
            return True
        if level is None:
            return False
        if self is Requirement.KERNEL:
            return level.kernel
        if self is Requirement.HOOK:
            return level.hook
        if self is Requirement.KERNEL_AND_HOOK:
            return level is Level.KERNEL_HOOK
        return level is not Level.NONE

    def describe(self) -> str:
        return _WORDS[self]

    @classmethod
    def from_text(cls, text: Any) -> Requirement | None:
        if not isinstance(text, str):
            return None
        try:
            return cls(text)
        except ValueError:
            return None


_WORDS = {
    Requirement.KERNEL_OR_HOOK: 'the kernel (dmem cgroup) or the LD_AUDIT '
                                'hook',
    Requirement.KERNEL: 'the kernel (dmem cgroup)',
    Requirement.HOOK: 'the LD_AUDIT hook',
    Requirement.KERNEL_AND_HOOK: 'both the kernel (dmem cgroup) and the '
                                 'LD_AUDIT hook',
    Requirement.NONE: 'nothing (limits are advisory)',
}


def registered_level(custominfo: Mapping[str, Any]) -> Level | None:
    """The level a registered GPU's ``custominfo`` states (None: it
    states none, or an unknown one; treated as the weakest)."""
    return Level.from_text(custominfo.get(CUSTOMINFO_KEY))


def namespace_requirement(labels: Mapping[str, Any] | None
                          ) -> tuple[Requirement | None, str | None]:
    """(what a namespace's labels require, the problem with the label).

    :returns: ``(None, None)`` without the label; ``(requirement,
        None)`` for a known value; ``(None, why)`` for a value that is no
        requirement (the caller fails closed, naming it).
    """
    if not labels or NAMESPACE_LABEL not in labels:
        return None, None
    value = labels.get(NAMESPACE_LABEL)
    wanted = Requirement.from_text(value)
    if wanted is None:
        return None, 'namespace label %s=%.64r is not one of %s' % (
            NAMESPACE_LABEL, value, ', '.join(r.value for r in Requirement))
    return wanted, None


def refusal(requirement: Requirement, level: Level | None,
            why: str) -> str | None:
    """Why a GPU at ``level`` may not take a slice that ``requirement``
    (stated by ``why``, e.g. the namespace label) governs; None when it
    may."""
    if requirement.met_by(level):
        return None
    return 'memory enforcement %s, but %s requires %s' % (
        level.value if level is not None else 'unknown', why,
        requirement.describe())
