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
import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping

from amdgpu_virt import exception
from amdgpu_virt import plugins
from amdgpu_virt.model import GpuModel

STRATEGY_NAMESPACE = 'amdgpu_virt.sharing.strategies'

#: Most CUs one allocator handles (a guard against absurd counts read from
#: elsewhere; today's largest GPUs have a few hundred).
MAX_CUS = 65536


def bits(mask: int) -> Iterator[int]:
    """The set bit positions of ``mask``, lowest first."""
    for start, length in runs(mask):
        yield from range(start, start + length)


def ids_of(mask: int) -> tuple[int, ...]:
    """The set bit positions of ``mask`` as a sorted tuple."""
    low = mask & -mask
    if not (mask + low) & mask:   # one run (or nothing)
        start = low.bit_length() - 1
        return tuple(range(start, start + mask.bit_count()))
    result: list[int] = []
    for start, length in runs(mask):
        result.extend(range(start, start + length))
    return tuple(result)


def mask_of(cus: Iterable[int]) -> int:
    mask = 0
    for cu in cus:
        mask |= 1 << cu
    return mask


def runs(mask: int) -> list[tuple[int, int]]:
    """Maximal runs of set bits as ``(start, length)``, lowest first."""
    result = []
    while mask:
        low = mask & -mask
        # adding the lowest set bit carries through its run and clears it
        rest = (mask + low) & mask
        start = low.bit_length() - 1
        result.append((start, (mask ^ rest).bit_length() - start))
        mask = rest
    return result


def whole_units(free: int, unit: int) -> int:
    """Bits of ``free`` that belong to a wholly free, ``unit``-aligned
    group of ``unit`` CUs (all of ``free`` when ``unit`` is 1)."""
    if unit == 1:
        return free
    if unit == 2:
        starts = free & (free >> 1) & _unit_starts(free.bit_length(), 2)
        return starts | (starts << 1)
    starts = free
    for shift in range(1, unit):
        starts &= free >> shift
    starts &= _unit_starts(free.bit_length(), unit)
    result = starts
    for shift in range(1, unit):
        result |= starts << shift
    return result


@functools.lru_cache(maxsize=1024)
def _unit_starts(width: int, unit: int) -> int:
    """Bits 0, unit, 2*unit, ... below ``width`` (rounded up to a unit)."""
    groups = -(-width // unit)
    pattern = 1
    pattern_groups = 1
    while pattern_groups < groups:
        pattern |= pattern << (pattern_groups * unit)
        pattern_groups *= 2
    return pattern


def take_low(mask: int, count: int) -> int:
    """The ``count`` lowest set bits of ``mask`` (``mask`` has enough)."""
    chosen = 0
    for start, length in runs(mask):
        if length >= count:
            return chosen | (((1 << count) - 1) << start)
        chosen |= ((1 << length) - 1) << start
        count -= length
    return chosen


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
        usable = whole_units(free, unit)
        if usable.bit_count() < count:
            return None
        return take_low(usable, count)


class BestFitStrategy(CuStrategy):
    """Contiguous ranges first, from the smallest free run that holds them.

    * If a run of free whole units holds the request, take the low end of
      the smallest such run (lowest on ties): the mask is one range, and
      larger runs stay free for larger requests.
    * Otherwise (the free CUs are fragmented) take the fewest pieces:
      whole runs from the largest down, and the remainder from the
      smallest run that holds it.

    It refuses a request only when fewer whole units are free than asked,
    exactly as first-fit does, so on the same GPU it admits the same
    requests; what differs is the shape of what it hands out.

    A range of consecutive CU ids also spreads evenly over the XCDs and
    shader engines: the kernel maps mask bit i to XCC ``i mod num_xcc``,
    so any L consecutive bits give each XCC ``floor(L / num_xcc)`` or one
    more.
    """

    name = 'best-fit'

    def choose(self, free: int, total: int, count: int,
               unit: int) -> int | None:
        usable = whole_units(free, unit)
        if usable.bit_count() < count:
            return None
        # the runs of ``usable`` (see runs()), looking for the best fit
        free_runs = []
        best_start = best_length = 0
        mask = usable
        while mask:
            low = mask & -mask
            rest = (mask + low) & mask
            start = low.bit_length() - 1
            length = (mask ^ rest).bit_length() - start
            if length >= count and (not best_length or length < best_length):
                best_start, best_length = start, length
                if length == count:
                    break
            free_runs.append((start, length))
            mask = rest
        if best_length:
            return ((1 << count) - 1) << best_start
        # fragmented: fewest pieces, the last from the smallest run that
        # holds the remainder
        chosen = 0
        by_size = sorted(free_runs, key=lambda run: (-run[1], run[0]))
        for index, (start, length) in enumerate(by_size):
            fits = [run for run in by_size[index:] if run[1] >= count]
            if fits:
                start = min(fits, key=lambda run: (run[1], run[0]))[0]
                return chosen | (((1 << count) - 1) << start)
            chosen |= ((1 << length) - 1) << start
            count -= length
        return None   # not reached: enough whole units are free


@dataclasses.dataclass(frozen=True)
class Fragmentation:
    """How scattered the free CUs of one GPU are.

    :ivar free: free CUs.
    :ivar largest_free_run: longest range of consecutive free CUs.
    :ivar free_runs: number of such ranges.
    :ivar index: ``1 - largest_free_run / free`` (0 when nothing or all of
        the free CUs form one range; near 1 when they are scattered).
    """

    free: int
    largest_free_run: int
    free_runs: int

    @property
    def index(self) -> float:
        if not self.free:
            return 0.0
        return 1.0 - self.largest_free_run / self.free


def xcc_counts(mask: int, num_xcc: int) -> tuple[int, ...]:
    """CUs of ``mask`` per XCC when bit i maps to XCC ``i mod num_xcc``."""
    counts = [0] * num_xcc
    for start, length in runs(mask):
        whole, extra = divmod(length, num_xcc)
        for offset in range(num_xcc):
            counts[offset] += whole
        for offset in range(extra):
            counts[(start + offset) % num_xcc] += 1
    return tuple(counts)


def xcc_imbalance(mask: int, num_xcc: int) -> int:
    """Most minus fewest CUs of ``mask`` on one XCC (0 or 1 is even)."""
    counts = xcc_counts(mask, num_xcc)
    return max(counts) - min(counts)


def load_strategy(name: str) -> CuStrategy:
    """The strategy registered as ``name`` in
    ``amdgpu_virt.sharing.strategies``.

    :raises DriverNotFound: no such strategy.
    """
    strategy: CuStrategy = plugins.load_driver(STRATEGY_NAMESPACE, name)
    return strategy


class CuAllocator:
    """The CUs of one GPU and who holds them.

    :param gpu: the GPU's identity (used in error messages).
    :param total: number of CUs.
    :param unit: allocation unit (1 CDNA, 2 RDNA).
    :param strategy: how free CUs are chosen; first-fit by default.
    """

    def __init__(self, gpu: str, total: int, unit: int = 1,
                 strategy: CuStrategy | None = None) -> None:
        if not 0 < total <= MAX_CUS or unit <= 0 or total % unit:
            raise exception.SharingError(
                reason='GPU %s: %d CUs cannot be shared in units of %d'
                % (gpu, total, unit))
        self.gpu = gpu
        self.total = total
        self.unit = unit
        self.strategy = strategy or FirstFitStrategy()
        self._owners: dict[str, int] = {}
        self._used = 0
        self._full = (1 << total) - 1
        #: owners whose CUs are not whole units (claimed from storage)
        self._partial: set[str] = set()

    @classmethod
    def for_model(cls, gpu: str, model: GpuModel,
                  strategy: CuStrategy | None = None) -> CuAllocator:
        """An allocator for a GPU of ``model``: its CU count, and its
        allocation unit (1 on CDNA, 2 on RDNA where CUs pair into WGPs).

        :raises SharingError: the model's CU count is unknown.
        """
        if not model.compute_units:
            raise exception.SharingError(
                reason='GPU %s (%s): CU count unknown, cannot share it by '
                       'CUs' % (gpu, model.name))
        return cls(gpu, model.compute_units, unit=model.cu_alloc_unit,
                   strategy=strategy)

    # -- queries -----------------------------------------------------------

    @property
    def full_mask(self) -> int:
        return self._full

    @property
    def free_mask(self) -> int:
        return self._full & ~self._used

    @property
    def free_count(self) -> int:
        return self.total - self._used.bit_count()

    @property
    def used_count(self) -> int:
        return self._used.bit_count()

    @property
    def usable_count(self) -> int:
        """Free CUs in wholly free allocation units."""
        if not self._partial:   # every allocation is whole units
            return self.total - self._used.bit_count()
        return whole_units(self.full_mask & ~self._used,
                           self.unit).bit_count()

    @property
    def allocations(self) -> Mapping[str, tuple[int, ...]]:
        return {owner: ids_of(mask) for owner, mask in self.owner_masks()}

    def owner_masks(self) -> list[tuple[str, int]]:
        """(owner, bitmap of the CUs it holds), by owner."""
        return sorted(self._owners.items())

    def mask_of(self, owner: str) -> int:
        """Bitmap of the CUs ``owner`` holds.

        :raises UnknownConsumer: ``owner`` holds nothing here.
        """
        try:
            return self._owners[owner]
        except KeyError:
            raise exception.UnknownConsumer(gpu=self.gpu,
                                            owner=owner) from None

    def cus_of(self, owner: str) -> tuple[int, ...]:
        return ids_of(self.mask_of(owner))

    def owner_of(self, cu: int) -> str | None:
        if not self._used >> cu & 1:
            return None
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

    def fragmentation(self) -> Fragmentation:
        free_runs = self.free_runs()
        return Fragmentation(
            free=self.free_count,
            largest_free_run=max((n for _s, n in free_runs), default=0),
            free_runs=len(free_runs))

    # -- changes -----------------------------------------------------------

    def round_up(self, count: int) -> int:
        """``count`` rounded up to whole allocation units."""
        return -(-count // self.unit) * self.unit

    def allocate_mask(self, owner: str, count: int) -> int:
        """Like :meth:`allocate`, returning the bitmap of the CUs given."""
        owners = self._owners
        if owner in owners:
            first = next(bits(owners[owner]))
            raise exception.AllocationConflict(
                cu=first, gpu=self.gpu, owner=owner, other=owner)
        total = self.total
        if count <= 0 or count > total:
            raise exception.InsufficientCapacity(
                gpu=self.gpu, requested=count, unit='CUs', owner=owner,
                free=self.free_count, capacity=total)
        unit = self.unit
        wanted = -(-count // unit) * unit
        used = self._used
        full = self._full
        chosen = self.strategy.choose(full & ~used, total, wanted, unit)
        if chosen is None:
            raise exception.InsufficientCapacity(
                gpu=self.gpu, requested=wanted, unit='CUs', owner=owner,
                free=self.free_count, capacity=total)
        if chosen & used or chosen & ~full or \
                chosen.bit_count() != wanted or \
                unit > 1 and whole_units(chosen, unit) != chosen:
            raise exception.SharingError(
                reason='strategy %s returned an invalid choice for GPU %s'
                % (self.strategy.name, self.gpu))
        owners[owner] = chosen
        self._used = used | chosen
        return chosen

    def allocate(self, owner: str, count: int) -> tuple[int, ...]:
        """Give ``count`` CUs (rounded up to whole units) to ``owner``.

        :returns: the CU ids, sorted.
        :raises AllocationConflict: ``owner`` already holds CUs here.
        :raises InsufficientCapacity: not enough free CUs.
        """
        return ids_of(self.allocate_mask(owner, count))

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
        self.claim_mask(owner, mask)

    def claim_mask(self, owner: str, mask: int) -> None:
        """:meth:`claim` with a bitmap.

        :raises AllocationConflict: as :meth:`claim`.
        :raises SharingError: a CU outside the GPU.
        """
        if mask < 0 or mask >> self.total:
            raise exception.SharingError(
                reason='CU %d of %s is outside 0..%d (claimed by %s)'
                % (mask.bit_length() - 1 if mask > 0 else -1, self.gpu,
                   self.total - 1, owner))
        overlap = mask & self._used
        if overlap:
            cu = (overlap & -overlap).bit_length() - 1
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
            if self.unit > 1 and whole_units(mask, self.unit) != mask:
                self._partial.add(owner)

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
        self._partial.discard(owner)
        return ids_of(mask)
