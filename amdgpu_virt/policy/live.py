"""The values of live running placements: what a cloud reports one
consumer holds (:class:`Holding`), what is odd about it
(:class:`LiveWarning`), and the result (:class:`Running`) of
:func:`amdgpu_virt.policy.running.placements` (pure)."""

from __future__ import annotations

import dataclasses

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import PciAddress
from amdgpu_virt.policy.decision import Decision

KUBERNETES = 'kubernetes'
NOVA = 'nova'
CLOUDS = (KUBERNETES, NOVA)
#: the prefix of the placements that keep an odd GPU occupied
HELD = 'held'


@dataclasses.dataclass(frozen=True)
class Holding:
    """What one consumer holds on one GPU, as a cloud reports it.

    :ivar consumer: the workload name of the consumer (``pod/<namespace>/
        <name>``, ``claim/<namespace>/<name>``, ``instance/<uuid>``).
    :ivar cloud: :data:`KUBERNETES` or :data:`NOVA`.
    :ivar address: the GPU's PCI address; None when it is unknown (then
        ``problem`` says why).
    :ivar whole: the whole GPU, or with ``partition`` a whole partition.
    :ivar partition: the compute partition the holding lives in (None: the
        GPU is not partitioned, or the holding is the whole GPU).
    :ivar compute_units: CUs of a slice.
    :ivar memory_mib: MiB of a slice.
    :ivar cus: the slice's CU ids in its partition, when the cloud knows
        them (else the lowest free ones are booked).
    :ivar vfs: VFs held (Nova, VF GPUs).
    :ivar what: how the cloud names the consumer, for reasons.
    :ivar problem: why what it holds cannot be read (the GPU, or every GPU
        of the host when ``address`` is None, is kept occupied).
    """

    consumer: str
    cloud: str
    host: str
    address: str | None
    whole: bool = False
    partition: int | None = None
    compute_units: int = 0
    memory_mib: int = 0
    cus: tuple[int, ...] | None = None
    vfs: int = 0
    what: str = ''
    problem: str | None = None

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise ValueError('cloud %r is not one of %s' % (
                self.cloud, ', '.join(CLOUDS)))
        if self.address is not None:
            try:
                object.__setattr__(self, 'address',
                                   str(PciAddress.parse(self.address)))
            except exception.InvalidPciAddress:
                object.__setattr__(self, 'problem', self.problem or (
                    'GPU %r is not a PCI address' % self.address[:64]))
                object.__setattr__(self, 'address', None)

    @property
    def label(self) -> str:
        return self.what or self.consumer


@dataclasses.dataclass(frozen=True, order=True)
class LiveWarning:
    """Something odd in the live state, naming the consumer and the GPU."""

    host: str
    gpu: str
    consumer: str
    message: str

    def __str__(self) -> str:
        return '%s on %s%s: %s' % (
            self.consumer, self.host,
            ' GPU %s' % self.gpu if self.gpu else '', self.message)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Running:
    """Running placements, the ledger they need, and the warnings.

    :ivar ledger: the given ledger plus a role for every GPU that runs a
        consumer but had none (None when there was no ledger and nothing
        runs).
    """

    ledger: av_ledger.Ledger | None
    placements: tuple[Decision, ...]
    warnings: tuple[LiveWarning, ...]
