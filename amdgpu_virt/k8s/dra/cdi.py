"""CDI specs for prepared claims (Container Device Interface).

One transient spec per claim, ``<cdi_dir>/k8s.<driver>-gpu_<claim UID>.json``
(kind ``k8s.<driver>/gpu``), written atomically on every prepare (a reboot
empties ``/var/run/cdi``) and removed on unprepare. It holds:

* one CDI device per device of the claim, ``<claim UID>-<device>`` (a
  share: ``<claim UID>-<device>-<shareID>``, so two shares of one device
  in one claim stay apart): the device's DRM nodes and, for a share, its
  memory limit;
* one CDI device per request, ``<claim UID>-req-<request>``: ``/dev/kfd``
  and what depends on all of the request's GPUs (``ROCR_VISIBLE_DEVICES``,
  ``HIP_VISIBLE_DEVICES``, ``HSA_CU_MASK``, ``LD_AUDIT`` and its library)
  and, where the kernel caps VRAM (:class:`DmemHook`), a ``createRuntime``
  hook that caps the container's cgroup at the request's shares before
  its process runs (``amdgpu-virt k8s dmem-hook``).

kubelet hands a container the CDI ids of every device of the requests it
uses, so each device answers its own id, and the first device of each
request also the request's. Device names never start with ``req-``, and
the claim UID keeps names unique across claims (runtimes cache specs).
Device nodes carry the major/minor read from the host's sysfs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.k8s.dra import prepare as dra_prepare
from amdgpu_virt.k8s.dra import state as dra_state

CDI_CLASS = 'gpu'
#: device names starting with a digit (a claim UID) need CDI 0.5.0
CDI_VERSION = '0.5.0'

#: what CDI accepts as a device name
_DEVICE_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$')
REQUEST_PREFIX = 'req-'

#: host device path -> (major, minor)
DeviceNumbers = Callable[[str], tuple[int, int]]


def sysfs_numbers(sysfs_root: str) -> DeviceNumbers:
    """Device numbers of ``/dev/kfd`` and ``/dev/dri/*`` from sysfs."""
    from amdgpu_virt.inventory import sysfs

    def numbers(path: str) -> tuple[int, int]:
        if path == '/dev/kfd':
            return sysfs.device_number(sysfs_root, 'kfd', 'kfd')
        if path.startswith('/dev/dri/'):
            return sysfs.device_number(sysfs_root, 'drm',
                                       os.path.basename(path))
        raise exception.InventoryError(source=path,
                                       reason='not a GPU device node')

    return numbers


def vendor(driver: str) -> str:
    return 'k8s.%s' % driver


def kind(driver: str) -> str:
    return '%s/%s' % (vendor(driver), CDI_CLASS)


def _checked(uid: str, name: str) -> str:
    if not _DEVICE_NAME.match(name):
        raise exception.DraClaimError(
            claim=uid, reason='CDI device name %.300r is not letters, digits '
            'and "_.:-"' % name)
    return name


def request_device_name(uid: str, request: str) -> str:
    """``<claim UID>-req-<request>``: the edits of a whole request."""
    return _checked(uid, '%s-%s%s' % (uid, REQUEST_PREFIX, request))


def device_names(uid: str, claim: dra_state.PreparedClaim) -> list[str]:
    """The CDI device name of each device of ``claim``, in claim order.

    :raises DraClaimError: a name CDI would not accept.
    """
    names: list[str] = []
    for index, device in enumerate(claim.devices):
        name = '%s-%s' % (uid, device.device)
        if device.share_id:
            name = '%s-%s' % (name, device.share_id)
        if name in names:  # one device twice without shareIDs
            name = '%s-%d' % (name, index)
        names.append(_checked(uid, name))
    return names


def qualified_name(driver: str, name: str) -> str:
    """What kubelet passes to the runtime: ``k8s.<driver>/gpu=<name>``."""
    return '%s=%s' % (kind(driver), name)


def device_ids(driver: str, uid: str, claim: dra_state.PreparedClaim
               ) -> list[list[str]]:
    """The ``cdi_device_ids`` of each device of ``claim``: its own, and
    for the first device of each request the request's as well."""
    seen: set[str] = set()
    ids = []
    for device, name in zip(claim.devices, device_names(uid, claim),
                            strict=True):
        own = [qualified_name(driver, name)]
        request = device.request.split('/', 1)[0]
        if request not in seen:
            seen.add(request)
            own.append(qualified_name(driver,
                                      request_device_name(uid, request)))
        ids.append(own)
    return ids


def spec_path(cdi_dir: str, driver: str, uid: str) -> str:
    return os.path.join(cdi_dir, '%s-%s_%s.json' % (vendor(driver),
                                                    CDI_CLASS, uid))


@dataclasses.dataclass(frozen=True)
class DmemHook:
    """The ``createRuntime`` hook that caps a share's VRAM.

    :ivar path: the ``amdgpu-virt`` command on the host.
    :ivar root: where the hook finds the host's proc and cgroup trees.
    """

    path: str
    root: str = '/'
    #: seconds the runtime gives it (CDI ``timeout``)
    timeout: int = 30

    def entry(self, caps: Sequence[tuple[str, int]]) -> dict[str, Any]:
        args = ['amdgpu-virt', 'k8s', 'dmem-hook']
        for region, value in caps:
            args += ['--cap', '%s=%d' % (region, value)]
        if self.root != '/':
            args += ['--root', self.root]
        return {'hookName': 'createRuntime', 'path': self.path,
                'args': args, 'timeout': self.timeout}


def _container_edits(edit: dra_prepare.Edits, numbers: DeviceNumbers,
                     hook: DmemHook | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {}
    if edit.env:
        container['env'] = ['%s=%s' % item for item in edit.env]
    nodes = []
    for path in edit.device_paths:
        major, minor = numbers(path)
        nodes.append({'path': path, 'type': 'c', 'major': major,
                      'minor': minor, 'permissions': 'rw'})
    if nodes:
        container['deviceNodes'] = nodes
    if edit.mounts:
        container['mounts'] = [{'hostPath': lib, 'containerPath': lib,
                                'options': ['ro', 'nosuid', 'nodev',
                                            'bind']}
                               for lib in edit.mounts]
    if edit.caps and hook is not None:
        container['hooks'] = [hook.entry(edit.caps)]
    return container


def spec(driver: str, uid: str, claim: dra_state.PreparedClaim,
         edits: dra_prepare.ClaimEdits,
         numbers: DeviceNumbers,
         hook: DmemHook | None = None) -> dict[str, Any]:
    """The CDI spec of one claim: its devices, then its requests (with
    ``hook`` for the requests the kernel caps).

    :raises InventoryError: a device node without a device number.
    :raises DraClaimError: a name CDI would not accept.
    """
    devices = [{'name': name, 'containerEdits': _container_edits(edit,
                                                                 numbers)}
               for name, edit in zip(device_names(uid, claim), edits.devices,
                                     strict=True)]
    devices.extend({'name': request_device_name(uid, edit.request),
                    'containerEdits': _container_edits(edit, numbers, hook)}
                   for edit in edits.requests)
    return {'cdiVersion': CDI_VERSION, 'kind': kind(driver),
            'devices': devices}


def write(cdi_dir: str, driver: str, uid: str,
          content: dict[str, Any]) -> str:
    """Write (or rewrite) the claim's spec; :returns: its path."""
    path = spec_path(cdi_dir, driver, uid)
    fileutil.atomic_write(path, json.dumps(content, indent=1,
                                           sort_keys=True) + '\n')
    return path


def remove(cdi_dir: str, driver: str, uid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(spec_path(cdi_dir, driver, uid))
