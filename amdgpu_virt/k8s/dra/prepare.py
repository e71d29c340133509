"""Prepare: concrete CUs for shares, and what a container gets.

Pure: given the node's devices, its ROCr units and the claims prepared
before, :func:`prepare` turns a claim's results into a
:class:`~amdgpu_virt.k8s.dra.state.PreparedClaim` (for a share: CU ranges
chosen by the project's CU allocator against the shares already prepared
on that GPU partition, so two shares never overlap, also across
restarts), and :func:`container_edits` into the container edits of each
device and of each request.

A request's GPUs are numbered in result order (a whole partitioned GPU:
all its partitions): the i-th is what ROCr shows as device i, because
``ROCR_VISIBLE_DEVICES`` lists them in that order. What depends on the
whole request (that list, ``HIP_VISIBLE_DEVICES``, ``HSA_CU_MASK``,
``LD_AUDIT`` and its library, ``/dev/kfd``) is one set of edits per
request; what belongs to one device (its DRM nodes, a share's
``HIP_DEVICE_MEMORY_LIMIT_<i>``) is one set per device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from amdgpu_virt import exception
from amdgpu_virt.k8s.dra import claims as dra_claims
from amdgpu_virt.k8s.dra import state as dra_state
from amdgpu_virt.k8s.node import devices as unit_devices
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami


@dataclasses.dataclass(frozen=True)
class Edits:
    """Container edits: of one device of a claim, or of one request.

    :ivar request: the claim's request (``req`` of ``req/sub``).
    :ivar device: index of the device in ``PreparedClaim.devices``; None
        for the edits of the request.
    """

    request: str
    env: tuple[tuple[str, str], ...]
    device_paths: tuple[str, ...]
    mounts: tuple[str, ...] = ()
    device: int | None = None
    #: (dmem region, bytes) the kernel caps a container of the request at
    #: (its shares of GPUs the kernel caps, summed per GPU)
    caps: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class ClaimEdits:
    """Every device's edits (claim order) and every request's."""

    devices: tuple[Edits, ...]
    requests: tuple[Edits, ...]


def _unit(units: Mapping[tuple[str, int], unit_devices.GpuUnit], gpu: str,
          partition: int, claim: str) -> unit_devices.GpuUnit:
    unit = units.get((gpu, partition))
    if unit is None:
        raise exception.DraClaimError(
            claim=claim, reason='GPU %s partition %d has no ROCr device on '
            'this node (no KFD node or DRM minor)' % (gpu, partition))
    return unit


def index_units(units: Sequence[unit_devices.GpuUnit]
                ) -> dict[tuple[str, int], unit_devices.GpuUnit]:
    return {(u.gpu_address, u.partition): u for u in units}


def prepare(uid: str, namespace: str, name: str,
            results: Sequence[dra_claims.Result],
            units: Sequence[unit_devices.GpuUnit],
            prepared: Mapping[str, dra_state.PreparedClaim],
            strategy: allocator.CuStrategy | None = None
            ) -> dra_state.PreparedClaim:
    """Choose the claim's concrete devices and CUs.

    A result with admin access (a monitoring claim) gets its device's
    nodes and holds nothing: it neither waits for the device's owner nor
    keeps the owner from being prepared.

    :param prepared: the other claims prepared on the node.
    :raises DraClaimError: a device already held, CUs or memory no longer
        free, a partition without a ROCr device.
    """
    key = '%s/%s' % (namespace, name)
    by_unit = index_units(units)
    holders: dict[tuple[str, int], str] = {}
    cus: dict[tuple[str, int], int] = {}
    memory: dict[tuple[str, int], int] = {}
    for other in prepared.values():
        if other.uid == uid:
            continue
        dra_state.check_conflicts(other, holders, cus, 'state')
        for held in other.devices:
            if held.masks:
                (part, _mask), = held.masks
                memory[(held.gpu, part)] = memory.get(
                    (held.gpu, part), 0) + held.memory_mib
    existing_cus = dict(cus)
    chosen = []
    for result in results:
        device = result.device
        gpu = str(device.gpu.address)
        for part in device.partitions:
            _unit(by_unit, gpu, part, key)
        if result.admin or not device.shared:
            # admin access (monitoring): the device's nodes, nothing held
            chosen.append(dra_state.PreparedDevice(
                request=result.request, pool=result.pool,
                device=device.name, gpu=gpu, partitions=device.partitions,
                share_id=result.share_id, admin=result.admin))
            continue
        (part,) = device.partitions
        unit = by_unit[(gpu, part)]
        slot = (gpu, part)
        if memory.get(slot, 0) + result.memory_mib > device.memory_mib:
            raise exception.DraClaimError(
                claim=key, reason='device %s: %d MiB asked, %d of %d MiB '
                'already prepared for other shares' % (
                    device.name, result.memory_mib, memory.get(slot, 0),
                    device.memory_mib))
        cu_alloc = allocator.CuAllocator(
            '%s partition %d' % (gpu, part), unit.compute_units,
            unit=unit.cu_unit, strategy=strategy)
        if cus.get(slot):
            cu_alloc.claim_mask('others', cus[slot])
        try:
            mask = cu_alloc.allocate_mask(key, result.compute_units)
        except exception.SharingError as err:
            raise exception.DraClaimError(
                claim=key, reason='device %s: %s' % (device.name, err)
            ) from None
        cus[slot] = cus.get(slot, 0) | mask
        memory[slot] = memory.get(slot, 0) + result.memory_mib
        chosen.append(dra_state.PreparedDevice(
            request=result.request, pool=result.pool, device=device.name,
            gpu=gpu, partitions=device.partitions,
            share_id=result.share_id, compute_units=result.compute_units,
            memory_mib=result.memory_mib, masks=((part, mask),)))
    claim = dra_state.PreparedClaim(uid=uid, namespace=namespace,
                                    name=name, devices=tuple(chosen))
    try:
        dra_state.check_conflicts(claim, holders, existing_cus, 'state')
    except exception.DraStateError as err:
        raise exception.DraClaimError(claim=key, reason=str(err).split(
            ': ', 1)[-1]) from None
    return claim


def container_edits(claim: dra_state.PreparedClaim,
                    units: Sequence[unit_devices.GpuUnit],
                    library: str = hami.LD_AUDIT_LIBRARY,
                    kernel: Collection[str] = ()) -> ClaimEdits:
    """The edits of each device and of each request of ``claim``.

    :param kernel: PCI addresses of the GPUs whose VRAM the kernel caps:
        a request's shares of them give its edits ``caps``.

    :raises DraClaimError: a partition without a ROCr device.
    """
    by_unit = index_units(units)
    key = '%s/%s' % (claim.namespace, claim.name)
    groups: dict[str, list[int]] = {}
    for index, device in enumerate(claim.devices):
        groups.setdefault(device.request.split('/', 1)[0], []).append(index)
    per_device: dict[int, Edits] = {}
    requests = []
    for request, members in groups.items():
        chosen: list[unit_devices.GpuUnit] = []
        masks: dict[int, int] = {}
        caps: dict[str, int] = {}
        for index in members:
            device = claim.devices[index]
            part_masks = dict(device.masks)
            if part_masks and device.gpu in kernel:
                region = dmem.region(device.gpu)
                caps[region] = caps.get(region, 0) + \
                    device.memory_mib * (1 << 20)
            paths: list[str] = []
            env: list[tuple[str, str]] = []
            for part in device.partitions:
                unit = _unit(by_unit, device.gpu, part, key)
                if part in part_masks:
                    masks[len(chosen)] = part_masks[part]
                    env.append(('%s_%d' % (hami.ENV_HIP_DEVICE_MEMORY_LIMIT,
                                           len(chosen)),
                                '%dm' % device.memory_mib))
                chosen.append(unit)
                paths.extend((unit.card_path, unit.render_path))
            per_device[index] = Edits(request=request, env=tuple(env),
                                      device_paths=tuple(paths),
                                      device=index)
        base = unit_devices.allocation_for(chosen)
        env = list(base.envs)
        mounts: tuple[str, ...] = ()
        if masks:
            env.append((hami.ENV_HSA_CU_MASK,
                        cumask.encode_hsa_cu_mask(masks)))
            env.append((hami.ENV_LD_AUDIT, library))
            mounts = (library,)
        requests.append(Edits(request=request, env=tuple(env),
                              device_paths=(unit_devices.KFD_PATH,),
                              mounts=mounts, caps=tuple(sorted(
                                  caps.items()))))
    return ClaimEdits(devices=tuple(per_device[i] for i in
                                    range(len(claim.devices))),
                      requests=tuple(requests))
