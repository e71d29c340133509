"""Per-GPU memory shares in MiB.

A consumer of a shared GPU gets a memory limit (``amd.com/gpumem``, handed
to the container as ``HIP_DEVICE_MEMORY_LIMIT_<i>``). The limits of one
GPU's consumers must add up to no more than its memory: the ledger here
enforces that with the same fail-closed rules as the CU allocator: an
owner holds one share per GPU, a request that does not fit is refused with
:class:`~amdgpu_virt.exception.InsufficientCapacity` naming the GPU, the
owner, what was asked, what is free and the capacity, and rebuilding from
stored shares that exceed the capacity fails instead of over-committing.

Like CU masks, these limits are enforced by an interception library in
the container, not by the hardware: they are not a security boundary.
"""

from __future__ import annotations

from collections.abc import Mapping

from amdgpu_virt import exception


class MemoryShares:
    """The memory of one GPU and who holds how much of it.

    :param gpu: the GPU's identity (used in error messages).
    :param capacity: MiB that may be shared out (the GPU's memory, or less
        to keep a reserve).
    """

    def __init__(self, gpu: str, capacity: int) -> None:
        if capacity <= 0:
            raise exception.SharingError(
                reason='GPU %s: memory capacity must be positive, not %d MiB'
                % (gpu, capacity))
        self.gpu = gpu
        self.capacity = capacity
        self._owners: dict[str, int] = {}
        self._used = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def free(self) -> int:
        return self.capacity - self._used

    @property
    def allocations(self) -> Mapping[str, int]:
        return dict(sorted(self._owners.items()))

    def share_of(self, owner: str) -> int:
        """MiB held by ``owner``.

        :raises UnknownConsumer: ``owner`` holds nothing here.
        """
        try:
            return self._owners[owner]
        except KeyError:
            raise exception.UnknownConsumer(gpu=self.gpu,
                                            owner=owner) from None

    def fits(self, mib: int) -> bool:
        return 0 < mib <= self.free

    def _check(self, owner: str, mib: int) -> None:
        if isinstance(mib, bool) or not isinstance(mib, int) or mib <= 0:
            raise exception.SharingError(
                reason='GPU %s: %s asked for %r MiB; a share is a positive '
                       'whole number of MiB' % (self.gpu, owner, mib))
        if owner in self._owners:
            raise exception.SharingError(
                reason='GPU %s: %s already holds %d MiB; release it first'
                % (self.gpu, owner, self._owners[owner]))
        if mib > self.free:
            raise exception.InsufficientCapacity(
                gpu=self.gpu, requested=mib, unit='MiB', owner=owner,
                free=self.free, capacity=self.capacity)

    def allocate(self, owner: str, mib: int) -> int:
        """Give ``mib`` MiB to ``owner``.

        :returns: ``mib``.
        :raises SharingError: ``mib`` not positive, or ``owner`` already
            holds a share here.
        :raises InsufficientCapacity: fewer than ``mib`` MiB free.
        """
        self._check(owner, mib)
        self._owners[owner] = mib
        self._used += mib
        return mib

    def claim(self, owner: str, mib: int) -> None:
        """Record a share read back from storage.

        The same checks as :meth:`allocate`: stored shares that add up to
        more than the capacity are an error, never an over-commit.
        """
        self._check(owner, mib)
        self._owners[owner] = mib
        self._used += mib

    def release(self, owner: str) -> int:
        """Free what ``owner`` holds.

        :returns: the MiB freed.
        :raises UnknownConsumer: ``owner`` holds nothing here.
        """
        try:
            mib = self._owners.pop(owner)
        except KeyError:
            raise exception.UnknownConsumer(gpu=self.gpu,
                                            owner=owner) from None
        self._used -= mib
        return mib
