"""CDI specs for prepared claims (Container Device Interface).

One transient spec per claim, ``<cdi_dir>/k8s.<driver>-gpu_<claim UID>.json``
(kind ``k8s.<driver>/gpu``), with one CDI device per request of the
claim, named ``<claim UID>-<request>``; the UID keeps names unique, as
runtimes cache specs. Device nodes carry the major/minor read from the
host's sysfs. The spec is written atomically on every prepare (a reboot
empties ``/var/run/cdi``) and removed on unprepare.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.k8s.dra import prepare as dra_prepare

CDI_CLASS = 'gpu'
#: device names starting with a digit (a claim UID) need CDI 0.5.0
CDI_VERSION = '0.5.0'

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


def device_name(uid: str, request: str) -> str:
    return '%s-%s' % (uid, request)


def qualified_name(driver: str, uid: str, request: str) -> str:
    """What kubelet passes to the runtime: ``k8s.<driver>/gpu=<name>``."""
    return '%s=%s' % (kind(driver), device_name(uid, request))


def spec_path(cdi_dir: str, driver: str, uid: str) -> str:
    return os.path.join(cdi_dir, '%s-%s_%s.json' % (vendor(driver),
                                                    CDI_CLASS, uid))


def spec(driver: str, uid: str, edits: Sequence[dra_prepare.Edits],
         numbers: DeviceNumbers) -> dict[str, Any]:
    """The CDI spec of one claim.

    :raises InventoryError: a device node without a device number.
    """
    devices = []
    for edit in edits:
        container: dict[str, Any] = {
            'env': ['%s=%s' % item for item in edit.env],
            'deviceNodes': [],
        }
        for path in edit.device_paths:
            major, minor = numbers(path)
            container['deviceNodes'].append({
                'path': path, 'type': 'c', 'major': major, 'minor': minor,
                'permissions': 'rw'})
        if edit.mounts:
            container['mounts'] = [{'hostPath': lib, 'containerPath': lib,
                                    'options': ['ro', 'nosuid', 'nodev',
                                                'bind']}
                                   for lib in edit.mounts]
        devices.append({'name': device_name(uid, edit.request),
                        'containerEdits': container})
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
