"""Kernel VRAM caps of the device plugin's pods, set in PreStartContainer.

When the node's kernel can cap VRAM (:mod:`amdgpu_virt.k8s.node.dmem`),
the device plugin registers with ``PreStartRequired``: kubelet then calls
``PreStartContainer`` before it starts each container of a GPU (its first
start and every restart), and fails the start when the call fails. The
call carries the container's device IDs only; the plugin maps them to the
pod and container it served them to (its served checkpoint) and reads what
the allocation record gives that pod.

The cap goes on the **pod** cgroup, not the container's: kubelet creates
the pod cgroup before any of the pod's containers (so it exists at
PreStart), while the container cgroup is created by the OCI runtime only
after PreStart returned, when the container is created. The kernel
charges a container's VRAM to its cgroup and every ancestor, so a pod cap
binds all of the pod's containers together. Its value, per GPU, is
everything the record books for the pod on that GPU, over all its
containers: exactly what the extender counted as used, so the pod never
takes more than its booking, and the value is the same whichever of the
pod's containers starts (each PreStart writes the same caps; a second one
writes nothing).

Whole GPUs need no cap (the record never shares a whole GPU with slices);
only GPUs where the pod holds a slice are capped. A failure to cap fails
the call, so kubelet does not start the container (fail closed).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node import dmem
from amdgpu_virt.k8s.record import allocation as allocrecord

LOG = logging.getLogger(__name__)

MIB = 1 << 20


def pod_caps(grants: allocrecord.PodGrants,
             units: Sequence[devices.GpuUnit]) -> dict[str, int]:
    """Region -> bytes of the pod's caps: per GPU where it holds a slice,
    the MiB of every grant it holds there (a whole partition of that GPU
    counts with the partition's VRAM).

    :raises DevicePluginError: a grant names a GPU not of this node.
    """
    by_uuid = {unit.uuid.lower(): unit for unit in units}
    booked: dict[str, int] = {}
    shared: set[str] = set()
    for container in grants.containers:
        for grant in container:
            unit = by_uuid.get(grant.gpu)
            if unit is None:
                raise exception.DevicePluginError(
                    resource=grants.describe(), reason='the record gives '
                    'GPU %s, which is not one of this node' % grant.gpu)
            name = dmem.region(unit.gpu_address)
            whole = grant.cus == (1 << unit.compute_units) - 1
            booked[name] = booked.get(name, 0) + (
                unit.vram_mib if whole else grant.mem) * MIB
            if not whole:
                shared.add(name)
    return {name: booked[name] for name in sorted(shared)}


@dataclasses.dataclass(frozen=True)
class Applied:
    """What one PreStartContainer did.

    :ivar cgroup: the pod cgroup (None: nothing to cap).
    :ivar caps: region -> bytes.
    :ivar written: False when the caps were in place already.
    """

    pod: str
    cgroup: str | None
    caps: Mapping[str, int]
    written: bool


class PodCaps:
    """Writes the caps of the pod a PreStartContainer is for.

    :param fs: the host's cgroup hierarchy.
    :param node: what the kernel offers (its regions).
    :param units: the node's GPUs.
    :param driver: kubelet's cgroup driver (None: detect it).
    :param kubelet_root: kubelet's ``--cgroup-root`` as name parts.
    """

    def __init__(self, fs: cgroups.CgroupFs, node: dmem.NodeDmem,
                 units: Sequence[devices.GpuUnit],
                 driver: cgroups.Driver | None = None,
                 kubelet_root: Sequence[str] = ()) -> None:
        self.fs = fs
        self.node = node
        self.units = tuple(units)
        self.driver = driver
        self.kubelet_root = tuple(kubelet_root)

    def prepare(self) -> None:
        """At start: find kubelet's cgroups and enable dmem down to its QoS
        cgroups where the node allows (a failure is logged; PreStart
        tries again and fails closed)."""
        try:
            driver = cgroups.detect_driver(self.fs, self.driver,
                                           self.kubelet_root)
            for qos in cgroups.QosClass:
                parts = cgroups.qos_cgroup(driver, qos, self.kubelet_root)
                # dmem for the pods below the QoS cgroup: enabled in it
                # and every ancestor
                dmem.ensure_enabled(self.fs, (*parts, 'pod'))
        except (exception.CgroupError, FileNotFoundError) as err:
            LOG.warning('dmem not enabled for kubelet\'s pods yet: %s', err)

    def apply(self, device_ids: Sequence[str], shared: Any,
              request: str = 'PreStartContainer') -> Applied:
        """Cap the pod that ``device_ids`` were served to.

        :param shared: the plugin's
            :class:`~amdgpu_virt.k8s.node.sharedserve.SharedServer` (what
            was served, the allocation record).
        :raises DevicePluginError: the IDs were never served, or the
            record no longer holds the pod.
        :raises CgroupError: the pod cgroup is missing or unsafe, dmem
            cannot be enabled or the cap does not hold (naming the file).
        """
        served = shared.served_to(device_ids)
        if served is None:
            raise exception.DevicePluginError(
                resource=request, reason='device IDs %s were not served to '
                'any container; refusing to start a container whose VRAM '
                'cannot be capped' % ','.join(sorted(device_ids)))
        uid, index = served
        record = shared.source.allocation_record()
        grants = record.pods.get(uid)
        if grants is None:
            raise exception.DevicePluginError(
                resource=request, reason='pod uid %s (served device IDs %s) '
                'is not in the allocation record of %s any more' % (
                    uid, ','.join(sorted(device_ids)), record.node))
        # a GPU without a VRAM region is not at a kernel level: its hook
        # (or nothing, as memory_enforcement allowed) enforces its slices
        caps = {k: v for k, v in pod_caps(grants, self.units).items()
                if k in self.node.capacity}
        what = '%s container %d' % (grants.describe(), index)
        if not caps:
            LOG.info('%s: no slice of a GPU the kernel caps', what)
            return Applied(grants.describe(), None, {}, False)
        driver = cgroups.detect_driver(self.fs, self.driver,
                                       self.kubelet_root)
        pod = cgroups.find_pod(self.fs, driver, uid, root=self.kubelet_root)
        dmem.ensure_enabled(self.fs, pod)
        written = dmem.set_max(self.fs, pod, caps, self.node.capacity)
        LOG.info('%s: VRAM capped on %s (%s)', what, self.fs.where(pod),
                 ', '.join('%s %d MiB' % (k, v // MIB)
                           for k, v in caps.items()))
        return Applied(grants.describe(), self.fs.where(pod), caps, written)
