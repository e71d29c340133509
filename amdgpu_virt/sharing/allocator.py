"""Per-GPU compute unit (CU) allocator.

A GPU's CUs are a bitmap (a Python int, bit i = CU i). Consumers (pods,
containers) get disjoint sets of CUs; the allocator fails closed: a CU is
never given to two owners, and rebuilding from persisted ranges that
overlap raises :class:`~amdgpu_virt.exception.AllocationConflict` naming
both owners and the CU.

Which free CUs a request takes is decided by a :class:`CuStrategy`
(stevedore namespace ``amdgpu_virt.sharing.strategies``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping

from amdgpu_virt import exception


def bits(mask: int) -> Iterator[int]:
    """The set bit positions of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def mask_of(cus: Iterable[int]) -> int:
    mask = 0
    for cu in cus:
        mask |= 1 << cu
    return mask


def runs(mask: int) -> list[tuple[int, int]]:
    """Maximal runs of set bits as ``(start, length)``, lowest first."""
    result = []
    while mask:
        start = (mask & -mask).bit_length() - 1
        shifted = mask >> start
        length = (~shifted & (shifted + 1)).bit_length() - 1
        result.append((start, length))
        mask &= ~(((1 << length) - 1) << start)
    return result


class CuStrategy(abc.ABC):
    """Chooses which free CUs a request gets."""

    #: Name under which the strategy is registered.
    name = ''

    @abc.abstractmethod
    def choose(self, free: int, total: int, count: int,
               unit: int) -> int | None:
        """Pick ``count`` CUs out of the ``free`` bitmap.

        :param free: bitmap of free CUs (bit i = CU i), below ``1 << total``.
        :param total: number of CUs of the GPU.
        :param count: CUs wanted; a positive multiple of ``unit``.
        :param unit: CUs that must be taken together, aligned to ``unit``
            (1 on CDNA, 2 on RDNA where CUs pair into WGPs).
        :returns: bitmap of exactly ``count`` free CUs made of whole aligned
            units, or None when the free CUs cannot satisfy the request.
        """


class FirstFitStrategy(CuStrategy):
    """HAMi's choice: the lowest free CU ids (whole units on RDNA)."""

    name = 'first-fit'

    def choose(self, free: int, total: int, count: int,
               unit: int) -> int | None:
        chosen = 0
        taken = 0
        unit_mask = (1 << unit) - 1
        for start in range(0, total - unit + 1, unit):
            piece = unit_mask << start
            if free & piece == piece:
                chosen |= piece
                taken += unit
                if taken == count:
                    return chosen
        return None


class CuAllocator:
    """The CUs of one GPU and who holds them.

    :param gpu: the GPU's identity (used in error messages).
    :param total: number of CUs.
    :param unit: allocation unit (1 CDNA, 2 RDNA).
    :param strategy: how free CUs are chosen; first-fit by default.
    """

    def __init__(self, gpu: str, total: int, unit: int = 1,
                 strategy: CuStrategy | None = None) -> None:
        if total <= 0 or unit <= 0 or total % unit:
            raise exception.SharingError(
                reason='GPU %s: %d CUs cannot be shared in units of %d'
                % (gpu, total, unit))
        self.gpu = gpu
        self.total = total
        self.unit = unit
        self.strategy = strategy or FirstFitStrategy()
        self._owners: dict[str, int] = {}
        self._used = 0

    # -- queries -----------------------------------------------------------

    @property
    def full_mask(self) -> int:
        return (1 << self.total) - 1

    @property
    def free_mask(self) -> int:
        return self.full_mask & ~self._used

    @property
    def free_count(self) -> int:
        return self.total - self._used.bit_count()

    @property
    def used_count(self) -> int:
        return self._used.bit_count()

    @property
    def allocations(self) -> Mapping[str, tuple[int, ...]]:
        return {owner: tuple(bits(mask))
                for owner, mask in sorted(self._owners.items())}

    def cus_of(self, owner: str) -> tuple[int, ...]:
        try:
            return tuple(bits(self._owners[owner]))
        except KeyError:
            raise exception.UnknownConsumer(gpu=self.gpu,
                                            owner=owner) from None

    def owner_of(self, cu: int) -> str | None:
        for owner, mask in self._owners.items():
            if mask >> cu & 1:
                return owner
        return None

    def free_runs(self) -> list[tuple[int, int]]:
        """Runs of free CUs as ``(start, length)``."""
        return runs(self.free_mask)

    @property
    def largest_free_run(self) -> int:
        return max((length for _s, length in self.free_runs()), default=0)

    @property
    def free_run_count(self) -> int:
        return len(self.free_runs())

    # -- changes -----------------------------------------------------------

    def round_up(self, count: int) -> int:
        """``count`` rounded up to whole allocation units."""
        return -(-count // self.unit) * self.unit

    def allocate(self, owner: str, count: int) -> tuple[int, ...]:
        """Give ``count`` CUs (rounded up to whole units) to ``owner``.

        :returns: the CU ids, sorted.
        :raises AllocationConflict: ``owner`` already holds CUs here.
        :raises InsufficientCapacity: not enough free CUs.
        """
        if owner in self._owners:
            first = next(bits(self._owners[owner]))
            raise exception.AllocationConflict(
                cu=first, gpu=self.gpu, owner=owner, other=owner)
        if count <= 0 or count > self.total:
            raise exception.InsufficientCapacity(
                gpu=self.gpu, requested=count, unit='CUs', owner=owner,
                free=self.free_count, capacity=self.total)
        wanted = self.round_up(count)
        chosen = self.strategy.choose(self.free_mask, self.total, wanted,
                                      self.unit)
        if chosen is None:
            raise exception.InsufficientCapacity(
                gpu=self.gpu, requested=wanted, unit='CUs', owner=owner,
                free=self.free_count, capacity=self.total)
        if chosen & self._used or chosen.bit_count() != wanted:
            raise exception.SharingError(
                reason='strategy %s returned an invalid choice for GPU %s'
                % (self.strategy.name, self.gpu))
        self._owners[owner] = chosen
        self._used |= chosen
        return tuple(bits(chosen))

    def claim(self, owner: str, cus: Iterable[int]) -> None:
        """Record that ``owner`` holds ``cus`` (rebuilding from storage).

        :raises AllocationConflict: a CU is already held by another owner
            (naming both), or ``owner`` already holds other CUs.
        :raises SharingError: a CU id outside the GPU.
        """
        mask = 0
        for cu in cus:
            if not 0 <= cu < self.total:
                raise exception.SharingError(
                    reason='CU %d of %s is outside 0..%d (claimed by %s)'
                    % (cu, self.gpu, self.total - 1, owner))
            mask |= 1 << cu
        overlap = mask & self._used
        if overlap:
            cu = next(bits(overlap))
            raise exception.AllocationConflict(
                cu=cu, gpu=self.gpu, owner=owner,
                other=self.owner_of(cu))
        if owner in self._owners:
            cu = next(bits(self._owners[owner]))
            raise exception.AllocationConflict(
                cu=cu, gpu=self.gpu, owner=owner, other=owner)
        if mask:
            self._owners[owner] = mask
            self._used |= mask

    def release(self, owner: str) -> tuple[int, ...]:
        """Free what ``owner`` holds.

        :returns: the CU ids freed.
        :raises UnknownConsumer: ``owner`` holds nothing here.
        """
        try:
            mask = self._owners.pop(owner)
        except KeyError:
            raise exception.UnknownConsumer(gpu=self.gpu,
                                            owner=owner) from None
        self._used &= ~mask
        return tuple(bits(mask))
