"""The snapshot inventory driver: a saved inventory instead of a host.

``amdgpu-virt inventory -f json`` (or ``-f yaml``) writes the document this
driver reads::

    {"kind": "HostInventory", "version": 1,
     "hostname": "compute-1", "source": "sysfs:/sys",
     "gim_version": "8.1.0.K",
     "gpus": [{"address": "0000:05:00.0", "device_id": 29857,
               "model": {"name": "MI300X", ...}, "driver": "gim",
               "vfs": [{"address": "0000:05:02.0", "index": 0, ...}],
               "partitions": [], ...}],
     "warnings": [{"culprit": "...", "message": "..."}]}

Every field of :class:`~amdgpu_virt.model.HostInventory` is kept (the GPU
model too, so a snapshot stays true when the catalog changes): loading
gives back an equal inventory. Ids are decimal numbers, PCI addresses
strings, enums their values.
"""

from __future__ import annotations

import json
from typing import Any

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import serialize
from amdgpu_virt import yamlutil
from amdgpu_virt.inventory import base
from amdgpu_virt.model import HostInventory

KIND = 'HostInventory'
VERSION = 1


def to_document(inventory: HostInventory) -> dict[str, Any]:
    """The snapshot document of ``inventory`` (plain data)."""
    document: dict[str, Any] = {'kind': KIND, 'version': VERSION}
    document.update(serialize.to_data(inventory))
    return document


def from_document(document: Any, source: str) -> HostInventory:
    """The inventory a snapshot document describes.

    :raises SnapshotError: naming ``source`` and the bad field.
    """
    if not isinstance(document, dict):
        raise exception.SnapshotError(
            path=source, reason='expected a mapping at the top level')
    body = dict(document)
    kind = body.pop('kind', None)
    version = body.pop('version', None)
    if kind != KIND:
        raise exception.SnapshotError(
            path=source, reason='field kind: expected %r, got %r'
            % (KIND, kind))
    if version != VERSION:
        raise exception.SnapshotError(
            path=source, reason='field version: expected %d, got %r'
            % (VERSION, version))
    try:
        return serialize.from_data(HostInventory, body)
    except exception.InvalidData as err:
        raise exception.SnapshotError(path=source, reason=str(err)) from None


def dumps(inventory: HostInventory, fmt: str = 'json') -> str:
    """The snapshot of ``inventory`` as JSON or YAML text."""
    document = to_document(inventory)
    if fmt == 'yaml':
        return yamlutil.dump(document)
    return json.dumps(document, indent=2) + '\n'


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError('duplicate key %r' % key)
        result[key] = value
    return result


def loads(text: str, source: str) -> HostInventory:
    """Parse a JSON or YAML snapshot; ``source`` names it in errors.

    :raises SnapshotError: the text is not a snapshot, naming the field.
    """
    if text.lstrip().startswith('{'):
        try:
            document = yamlutil.load_json(text, source,
                                          object_pairs_hook=_no_duplicates)
        except exception.AmdgpuVirtError as err:
            raise exception.SnapshotError(path=source,
                                          reason=str(err)) from None
    else:
        try:
            document = yamlutil.load(text, source)
        except exception.AmdgpuVirtError as err:
            raise exception.SnapshotError(path=source,
                                          reason=str(err)) from None
    return from_document(document, source)


def load(path: str) -> HostInventory:
    """Load the snapshot file ``path``.

    :raises SnapshotUnreadable: missing or unreadable.
    :raises SnapshotError: not a snapshot (naming the field).
    """
    try:
        text = fileutil.read_text(path, 'snapshot')
    except exception.FileInputError as err:
        raise exception.SnapshotUnreadable(
            path=path, reason='cannot read: %s' % err.kwargs.get('reason')
        ) from None
    if text is None:
        raise exception.SnapshotUnreadable(path=path,
                                           reason='cannot read: no such file')
    return loads(text, path)


class SnapshotInventory(base.InventoryDriver):
    """Returns the inventory saved in ``[inventory] snapshot_path``.

    The saved hostname, source and warnings are kept as they are, so a
    snapshot loads to an inventory equal to the one that was saved.

    :param conf: configuration (``[inventory] snapshot_path``).
    :param path: snapshot file overriding ``[inventory] snapshot_path``.
    """

    def __init__(self, conf: cfg.ConfigOpts, path: str | None = None
                 ) -> None:
        super().__init__(conf)
        self.path = path or conf.inventory.snapshot_path

    def scan(self) -> HostInventory:
        """Load the snapshot.

        :raises SnapshotError: no path configured, or the file is unusable.
        """
        if not self.path:
            raise exception.SnapshotError(
                path='[inventory] snapshot_path',
                reason='not set; the snapshot driver needs a file written '
                'by "amdgpu-virt inventory -f json"')
        return load(self.path)
