"""The planner's working state: every GPU, its role and what is free.

Indexes keep placement searches cheap on large fleets: unassigned GPUs
are bucketed per (model, host driver family) by how many a host has free,
VF GPUs by free VFs, shared compute partitions by free CUs. Capacity only
shrinks while a plan is made, which the planner relies on to cache
failures.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping

from sortedcontainers import SortedList

from amdgpu_virt import catalog
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import allocator as cu_allocator

GIM = 'gim'
AMDGPU = 'amdgpu'
#: the driver family a role needs (None: vfio-pci or nothing, any host)
ROLE_FAMILY = {Role.NOVA_VF: GIM, Role.K8S_SHARED: AMDGPU,
               Role.K8S_DEDICATED: AMDGPU}
DRIVER_FAMILY = {Driver.GIM: GIM, Driver.AMDGPU: AMDGPU}
#: what a GPU without a role holds: nothing (shared, read-only)
NO_VFS: tuple[int, ...] = ()
NO_OWNERS: Mapping[int, str] = types.MappingProxyType({})
NO_POOLS: tuple[Pool, ...] = ()
#: ``(NUMA node,)`` per NUMA node (see :attr:`GpuState.numa_nodes`).
#: Bounded: an inventory is input, and a crafted one may name any number
#: of nodes; cleared when full (the tuples stay equal, only less shared)
_NUMA: dict[int | None, tuple[int | None]] = {}
_NUMA_ENTRIES = 1024


class Pool:
    """CUs and memory of one shareable device: a GPU, or one of its
    compute partitions (CPX, QPX ...)."""

    __slots__ = ('gpu', 'partition', 'alloc', 'mem_total', 'mem_free')

    def __init__(self, gpu: GpuState, partition: int | None, cus: int,
                 mem: int, strategy: cu_allocator.CuStrategy) -> None:
        self.gpu = gpu
        self.partition = partition
        name = gpu.address if partition is None else '%s/%d' % (
            gpu.address, partition)
        self.alloc = cu_allocator.CuAllocator(
            '%s:%s' % (gpu.host.name, name), cus,
            unit=gpu.model.cu_alloc_unit, strategy=strategy)
        self.mem_total = mem
        self.mem_free = mem

    def fits(self, cus: int, mem: int) -> bool:
        return self.alloc.free_count >= cus and self.mem_free >= mem


class GpuState:
    """One GPU while planning."""

    __slots__ = ('host', 'gpu', 'model', 'address', 'addresses',
                 'numa_nodes', 'order', 'role',
                 'fixed', 'vf_count', 'vf_free', 'vf_owners', 'pools',
                 'slices', 'owner', 'unverified', 'compute_mode',
                 'memory_mode', '_layouts')

    def __init__(self, host: HostState, gpu: Gpu, order: int) -> None:
        self.host = host
        self.gpu = gpu
        self.model = gpu.model
        self.address = str(gpu.address)
        #: ``(address,)``, shared by every candidate of this GPU alone
        self.addresses = (self.address,)
        #: ``(NUMA node,)``, one tuple for all GPUs of a node
        numa = _NUMA.get(gpu.numa_node)
        if numa is None:
            if len(_NUMA) >= _NUMA_ENTRIES:
                _NUMA.clear()
            numa = _NUMA[gpu.numa_node] = (gpu.numa_node,)
        self.numa_nodes = numa
        self.order = order
        self.role: Role | None = None
        #: the role came from the ledger and must not change
        self.fixed = False
        self.vf_count: int | None = None
        # read-only empties until the GPU gets a role that fills them
        # (three containers fewer per GPU of a large fleet; a write to
        # one fails loudly)
        self.vf_free: list[int] = NO_VFS  # type: ignore[assignment]
        self.vf_owners: dict[int, str] = NO_OWNERS  # type: ignore
        self.pools: list[Pool] = NO_POOLS  # type: ignore[assignment]
        self.slices = 0
        self.owner: str | None = None
        self.unverified = False
        self.compute_mode = gpu.compute_partition
        self.memory_mode = gpu.memory_partition
        self._layouts: list[tuple[str | None, list[tuple[int, int]]]] = []

    @property
    def native_family(self) -> str | None:
        return DRIVER_FAMILY.get(self.gpu.driver)

    @property
    def cus(self) -> int:
        return self.gpu.compute_units or self.model.compute_units or 0

    @property
    def vram(self) -> int:
        return self.gpu.vram_mib or self.model.vram_mib or 0

    def vf_unit(self) -> tuple[int, int]:
        cus, mib = catalog.vf_size(self.model, self.vf_count or 1)
        return cus or 0, mib or 0

    def layouts(self) -> list[tuple[str | None, list[tuple[int, int]]]]:
        """Ways this GPU can be shared: (compute mode, device sizes).

        The current layout comes first. A partitioned GPU under amdgpu may
        also switch live to another compute mode valid with its memory
        (NPS) mode, e.g. CPX to QPX under NPS4 (76 CUs, 48 GB devices); the
        memory mode itself stays (changing it needs a driver reload across
        the hive). A GPU that is not under amdgpu now is shared in SPX.
        The inventory's partitions are used as seen (a DRM-minor shortage
        can hide one).
        """
        if not self._layouts:
            self._layouts = self._make_layouts()
        return self._layouts

    def _make_layouts(self) -> list[tuple[str | None,
                                          list[tuple[int, int]]]]:
        parts = self.gpu.partitions
        if self.gpu.driver is not Driver.AMDGPU or len(parts) <= 1:
            mode = 'SPX' if self.model.partition_modes else None
            return [(mode, [(self.cus, self.vram)])]
        current = self.gpu.compute_partition
        result: list[tuple[str | None, list[tuple[int, int]]]] = [
            (current, [(p.compute_units, p.vram_mib) for p in parts])]
        nps = self.gpu.memory_partition or 'NPS1'
        for mode in self.model.compute_modes:
            if mode == current or not self.model.supports(mode, nps):
                continue
            count = catalog.partitions_in_mode(self.model, mode)
            result.append((mode, [(self.cus // count, self.vram // count)]
                           * count))
        return result

    def make_pools(self, strategy: cu_allocator.CuStrategy,
                   mode: str | None = None) -> None:
        """Shareable devices of this GPU as ``k8s-shared``.

        :param mode: the compute mode to share in (one of
            :meth:`layouts`); the current layout by default. A CU slice
            never spans two partitions.
        """
        layouts = self.layouts()
        chosen = layouts[0]
        for layout in layouts:
            if mode is not None and layout[0] == mode:
                chosen = layout
        if chosen[0] is not None:
            self.compute_mode = chosen[0]
            if len(chosen[1]) == 1:
                self.memory_mode = self.memory_mode or 'NPS1'
        sizes = chosen[1]
        if len(sizes) == 1:
            self.pools = [Pool(self, None, sizes[0][0], sizes[0][1],
                               strategy)]
        else:
            self.pools = [Pool(self, i, cus, mem, strategy)
                          for i, (cus, mem) in enumerate(sizes)]


class HostState:
    """One host: its GPUs and the driver families it runs."""

    __slots__ = ('name', 'inventory', 'gpus', 'families',
                 'native_families')

    def __init__(self, inventory: HostInventory) -> None:
        self.name = inventory.hostname
        self.inventory = inventory
        self.gpus: list[GpuState] = []
        self.families: set[str] = set()
        for gpu in inventory.gpus:
            family = DRIVER_FAMILY.get(gpu.driver)
            if family:
                self.families.add(family)
        if inventory.gim_version:
            self.families.add(GIM)
        #: the families of the drivers the inventory found
        self.native_families = frozenset(self.families)

    @property
    def family_key(self) -> str:
        if not self.families:
            return 'none'
        if len(self.families) > 1:
            return 'mixed'
        return next(iter(self.families))


class FreeIndex:
    """Unassigned GPUs, bucketed per (model, host family) by free count."""

    def __init__(self) -> None:
        self.free: dict[tuple[str, str], list[GpuState]] = {}
        self.buckets: dict[tuple[str, str], dict[int, dict[str, None]]] = {}
        self.hosts: dict[str, HostState] = {}
        self.keys: dict[str, str] = {}
        self.max_count = 0
        self.counts: dict[str, int] = {}
        #: models with a free list, per host (so a rekey is per host)
        self.models: dict[str, dict[str, None]] = {}
        #: grows at every change (searches cached on the index compare it)
        self.version = 0

    def _bucket(self, model: str, key: str, count: int) -> dict[str, None]:
        per_count = self.buckets.get((model, key))
        if per_count is None:
            per_count = self.buckets[(model, key)] = {}
        bucket = per_count.get(count)
        if bucket is None:
            bucket = per_count[count] = {}
        return bucket

    def add(self, gpu: GpuState) -> None:
        self.version += 1
        host = gpu.host
        key = self.keys.setdefault(host.name, host.family_key)
        self.hosts[host.name] = host
        lst = self.free.setdefault((host.name, gpu.model.name), [])
        self.models.setdefault(host.name, {})[gpu.model.name] = None
        if lst:
            self._bucket(gpu.model.name, key, len(lst)).pop(host.name, None)
        lst.append(gpu)
        lst.sort(key=lambda g: g.order)
        self.counts[gpu.model.name] = self.counts.get(gpu.model.name, 0) + 1
        self._bucket(gpu.model.name, key, len(lst))[host.name] = None
        self.max_count = max(self.max_count, len(lst))

    def remove(self, gpu: GpuState) -> None:
        self.version += 1
        host = gpu.host.name
        key = self.keys[host]
        lst = self.free[(host, gpu.model.name)]
        self._bucket(gpu.model.name, key, len(lst)).pop(host, None)
        lst.remove(gpu)
        self.counts[gpu.model.name] -= 1
        if lst:
            self._bucket(gpu.model.name, key, len(lst))[host] = None

    def rekey(self, host: HostState) -> None:
        """Move ``host`` after its driver families changed."""
        old = self.keys.get(host.name)
        new = host.family_key
        if old is None or old == new:
            return
        self.version += 1
        self.keys[host.name] = new
        name = host.name
        for model in self.models.get(name, ()):
            lst = self.free[(name, model)]
            if lst:
                self._bucket(model, old, len(lst)).pop(name, None)
                self._bucket(model, new, len(lst))[name] = None

    def hosts_with(self, model: str, key: str,
                   at_least: int) -> Iterator[tuple[HostState,
                                                    list[GpuState]]]:
        """Hosts with >= ``at_least`` free GPUs, fewest free first."""
        buckets = self.buckets.get((model, key))
        if not buckets:
            return
        for count in range(at_least, self.max_count + 1):
            bucket = buckets.get(count)
            if not bucket:
                continue
            for name in bucket:
                yield self.hosts[name], self.free[(name, model)]

    def count(self, model: str) -> int:
        return self.counts.get(model, 0)


class BucketIndex:
    """Items bucketed by an integer (free VFs, free CUs)."""

    def __init__(self) -> None:
        self.buckets: dict[int, dict[object, None]] = {}
        self.where: dict[object, int] = {}
        self.top = 0
        #: sum of the values
        self.total = 0

    def put(self, item: object, value: int) -> None:
        old = self.where.pop(item, None)
        if old is not None:
            self.buckets[old].pop(item, None)
            self.total -= old
        if value > 0:
            bucket = self.buckets.get(value)
            if bucket is None:
                bucket = self.buckets[value] = {}
            bucket[item] = None
            self.where[item] = value
            self.total += value
            self.top = max(self.top, value)

    def at_least(self, value: int) -> Iterator[object]:
        """Items with >= ``value``, smallest value first (best fit)."""
        for count in range(max(1, value), self.top + 1):
            bucket = self.buckets.get(count)
            if bucket:
                yield from bucket

    def __len__(self) -> int:
        return len(self.where)


class PoolIndex:
    """Shareable devices ordered by balanced free capacity, then free
    memory, then the least recently changed.

    The balanced value of a device is the smaller of its free CUs and its
    free memory counted in CUs (rounded up); a request of ``cus`` CUs and
    ``mib`` MiB whose balanced size is ``need`` fits every device of a
    larger value, and those of value ``need`` with at least ``mib`` free,
    so :meth:`fitting` skips every device that cannot take it without
    looking at it (a scan from ``need`` of devices a few MiB short would
    otherwise grow with the fleet).

    Devices of one (value, free MiB) share a bucket, a dict in the order
    they were put (which is the order of their sequence numbers); the
    buckets' keys are kept sorted. Most changes move a device between two
    buckets that exist (no sorted search at all); the sorted keys change
    only when a bucket is made or emptied, in logarithmic time however
    many devices a fleet has (tens of thousands of idle partitions share
    one bucket).
    """

    def __init__(self) -> None:
        #: (value, free MiB) -> the devices there, least recent first
        self._buckets: dict[tuple[int, int], dict[Pool, None]] = {}
        #: the buckets' keys, ascending
        self._keys: SortedList = SortedList()
        self._where: dict[Pool, tuple[int, int, int]] = {}
        self._seq = 0

    def put(self, pool: Pool, value: int) -> None:
        """Index ``pool`` at balanced ``value`` (0: not at all); a device
        whose value and free memory are unchanged keeps its place."""
        old = self._where.get(pool)
        if old is not None:
            if old[0] == value and old[1] == pool.mem_free:
                return
            del self._where[pool]
            key = old[:2]
            bucket = self._buckets[key]
            del bucket[pool]
            if not bucket:
                del self._buckets[key]
                self._keys.remove(key)
        if value > 0:
            self._seq += 1
            self._where[pool] = (value, pool.mem_free, self._seq)
            key = (value, pool.mem_free)
            into = self._buckets.get(key)
            if into is None:
                into = self._buckets[key] = {}
                self._keys.add(key)
            into[pool] = None

    def fitting(self, need: int, mib: int) -> Iterator[Pool]:
        """Devices of balanced value >= ``need`` with >= ``mib`` MiB free
        at value ``need``: best fit first."""
        keys = self._keys
        buckets = self._buckets
        for key in keys.islice(keys.bisect_left((need, mib))):
            yield from buckets[key]

    def largest(self) -> int:
        """The largest balanced value now indexed (0 when empty)."""
        return int(self._keys[-1][0]) if self._keys else 0

    def __len__(self) -> int:
        return len(self._where)
