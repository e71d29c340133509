"""Kernel VRAM caps through the ``dmem`` cgroup controller (cgroup v2).

Linux 6.14+ (``CONFIG_CGROUP_DMEM``) charges device memory to cgroups.
amdgpu registers each GPU's VRAM as the region ``drm/<PCI address>/vram``
(``amdgpu_vram_mgr_init``), listed with its size in bytes in the root
cgroup's ``dmem.capacity``. A cgroup whose parent enables the controller
(``+dmem`` in the parent's ``cgroup.subtree_control``, and so on up to the
root) has ``dmem.max``: lines ``<region> <bytes|max>``; an allocation that
would take the cgroup (or any ancestor) over its ``max`` fails.

:func:`probe` says whether this node can cap at all, and which regions it
has; :func:`ensure_enabled` enables ``+dmem`` down to a cgroup (or says
precisely which file refused); :func:`set_max` writes caps, one region per
write, only when they differ, and reads them back (a kernel that does not
apply a lowered cap below current usage says so only there). Everything
goes through :class:`~amdgpu_virt.k8s.node.cgroups.CgroupFs`, so no link
is followed and every read is bounded; every failure names the file.

The cap must be in place before the workload allocates: lowering it
below current usage reclaims nothing.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from collections.abc import Mapping
from collections.abc import Sequence

from amdgpu_virt import exception
from amdgpu_virt import model
from amdgpu_virt.inventory import readings
from amdgpu_virt.k8s.node import cgroups

LOG = logging.getLogger(__name__)

CONTROLLER = 'dmem'
CAPACITY = 'dmem.capacity'
MAX = 'dmem.max'
CONTROLLERS = 'cgroup.controllers'
SUBTREE_CONTROL = 'cgroup.subtree_control'
#: the page size the kernel may round a limit down to
PAGE = 4096


def region(address: str | model.PciAddress) -> str:
    """``drm/<PCI address>/vram``: amdgpu's VRAM region of a GPU."""
    return readings.vram_region(str(model.PciAddress.parse(str(address))))


def parse(text: str, where: str, allow_max: bool) -> dict[str, int | None]:
    """``<region> <bytes>`` lines (``max`` -> None when allowed): the
    parser the node's telemetry reads these files with.

    :raises DmemError: a line that is not a region and a value, naming
        the file and the line.
    """
    try:
        result = readings.parse_dmem(text, where)
    except exception.SysfsValueError as err:
        raise exception.DmemError(path=where, reason='%s (%.80r)' % (
            err.kwargs.get('reason'), err.kwargs.get('value'))) from None
    unlimited = sorted(k for k, v in result.items() if v is None)
    if unlimited and not allow_max:
        raise exception.DmemError(path=where, reason='region %s: \'max\' '
                                  'is not a byte count' % unlimited[0])
    return result


@dataclasses.dataclass(frozen=True)
class NodeDmem:
    """Whether the node's kernel can cap VRAM, and its regions.

    :ivar reason: why it cannot ('' when it can).
    :ivar capacity: region -> bytes (root ``dmem.capacity``).
    """

    available: bool
    reason: str = ''
    capacity: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def covers(self, address: str | model.PciAddress) -> bool:
        return self.available and region(address) in self.capacity

    def gpu_reason(self, address: str | model.PciAddress) -> str:
        """Why the kernel cannot cap this GPU ('' when it can)."""
        if not self.available:
            return self.reason
        if region(address) not in self.capacity:
            return 'the dmem controller lists no region %s (amdgpu of this ' \
                'kernel registers no VRAM region for the GPU)' % region(
                    address)
        return ''


def probe(fs: cgroups.CgroupFs) -> NodeDmem:
    """What the node's kernel offers (never raises: a reason instead)."""
    try:
        cgroups.check_v2(fs)
        controllers = fs.read((), CONTROLLERS).split()
        if CONTROLLER not in controllers:
            return NodeDmem(False, '%s lists no dmem controller (%s): the '
                            'kernel is older than 6.14 or built without '
                            'CONFIG_CGROUP_DMEM' % (
                                fs.where((), CONTROLLERS),
                                ' '.join(controllers) or 'none'))
        where = fs.where((), CAPACITY)
        capacity = {k: v for k, v in parse(
            fs.read((), CAPACITY), where, False).items() if v is not None}
    except FileNotFoundError as err:
        return NodeDmem(False, '%s does not exist' % err.filename)
    except exception.CgroupError as err:
        return NodeDmem(False, str(err))
    if not capacity:
        return NodeDmem(False, '%s lists no region: no driver registers '
                        'device memory with the dmem controller' % where)
    return NodeDmem(True, '', capacity)


def ensure_enabled(fs: cgroups.CgroupFs, parts: Sequence[str],
                   enable: bool = True) -> None:
    """Make the dmem controller available in cgroup ``parts``: ``+dmem``
    in the ``cgroup.subtree_control`` of the root and of every ancestor
    of ``parts`` (enabled where missing when ``enable``).

    :raises DmemError: naming the ``cgroup.subtree_control`` that lacks
        dmem and why it could not be enabled.
    :raises CgroupError, FileNotFoundError: a cgroup on the way is unsafe
        or missing.
    """
    for depth in range(len(parts)):
        here = tuple(parts[:depth])
        where = fs.where(here, SUBTREE_CONTROL)
        if CONTROLLER in fs.read(here, SUBTREE_CONTROL).split():
            continue
        if not enable:
            raise exception.DmemError(path=where,
                                      reason='dmem is not enabled there')
        try:
            fs.write(here, SUBTREE_CONTROL, ['+' + CONTROLLER])
        except exception.CgroupError as err:
            code = err.kwargs.get('errno')
            why = {errno.EBUSY: 'the cgroup holds processes of its own, '
                                'and cgroup v2 enables controllers only '
                                'for cgroups without them',
                   errno.ENOENT: 'its parent does not offer dmem',
                   errno.EACCES: 'no permission (mount the host\'s cgroup '
                                 'hierarchy writable)',
                   errno.EROFS: 'the cgroup hierarchy is mounted '
                                'read-only'}.get(code or 0, str(err))
            raise exception.DmemError(
                path=where, reason='dmem is not enabled and enabling it '
                'failed: %s' % why) from None
        if CONTROLLER not in fs.read(here, SUBTREE_CONTROL).split():
            raise exception.DmemError(
                path=where, reason='+dmem was written but dmem is still not '
                'enabled there')
        LOG.info('Enabled the dmem controller in %s', where)


def read_max(fs: cgroups.CgroupFs, parts: Sequence[str]
             ) -> dict[str, int | None]:
    """The cgroup's ``dmem.max`` (region -> bytes, None for ``max``).

    :raises DmemError: the controller is not enabled there (no file), or
        the file is not readable as ``dmem.max``.
    """
    try:
        text = fs.read(parts, MAX)
    except FileNotFoundError:
        raise exception.DmemError(
            path=fs.where(parts, MAX), reason='no such file: the dmem '
            'controller is not enabled for this cgroup') from None
    return parse(text, fs.where(parts, MAX), True)


def _applied(wanted: int, found: int | None) -> bool:
    """The kernel keeps what was written, or rounds it down to a page."""
    return found is not None and 0 <= wanted - found < PAGE


def set_max(fs: cgroups.CgroupFs, parts: Sequence[str],
            caps: Mapping[str, int],
            capacity: Mapping[str, int] | None = None) -> bool:
    """Cap the cgroup at ``caps`` (region -> bytes), idempotently.

    :param capacity: the node's regions (:attr:`NodeDmem.capacity`); a
        cap of a region it does not list is refused before any write.
    :returns: True if anything was written.
    :raises DmemError: a region the node does not have, a write the
        kernel refused, or a cap that does not read back (naming the
        file).
    """
    where = fs.where(parts, MAX)
    for name, value in sorted(caps.items()):
        if capacity is not None and name not in capacity:
            raise exception.DmemError(
                path=where, reason='region %s is not one of the node\'s '
                '(%s)' % (name, ', '.join(sorted(capacity)) or 'none'))
        if not isinstance(value, int) or isinstance(value, bool) or \
                not 0 <= value <= readings.MAX_VALUE:
            raise exception.DmemError(
                path=where, reason='%r is not a byte count for %s'
                % (value, name))
    current = read_max(fs, parts)
    if all(_applied(v, current.get(k)) for k, v in caps.items()):
        return False
    try:
        fs.write(parts, MAX, ['%s %d' % item for item in
                              sorted(caps.items())])
    except exception.CgroupError as err:
        raise exception.DmemError(path=where, reason=str(err)) from None
    after = read_max(fs, parts)
    wrong = sorted(k for k, v in caps.items() if not _applied(v, after.get(k)))
    if wrong:
        raise exception.DmemError(
            path=where, reason='written, but it reads %s (the kernel did '
            'not apply the cap: is the cgroup already using more?)' % ', '
            .join('%s %s' % (k, 'max' if after.get(k) is None
                             else after[k]) for k in wrong))
    LOG.info('dmem caps on %s: %s', where, ', '.join(
        '%s %d' % item for item in sorted(caps.items())))
    return True
