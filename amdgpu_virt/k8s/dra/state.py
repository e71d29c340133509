"""The durable record of prepared claims (a JSON state file).

kubelet does not call prepare again for running pods after a plugin
restart, so what was prepared (which GPU partitions, which CUs of a
share, which CDI devices) must survive the plugin and the node. Every
change is written atomically (:func:`amdgpu_virt.fileutil.atomic_write`)
before the call returns, and an ``fcntl`` lock beside the file serialises
two plugin instances (a rolling update with ``maxSurge``).

A file that does not parse, or that holds what cannot be true (two shares
with overlapping CUs, a device held twice), is not repaired: loading
fails naming the file and the entry, and the plugin prepares nothing
until an operator looks (fail closed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import yamlutil

STATE_VERSION = 1
#: the largest state file read (a node holds a few hundred claims)
MAX_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One claim result as prepared.

    :ivar masks: for a share: partition index -> CU bitmap.
    """

    request: str
    pool: str
    device: str
    gpu: str
    partitions: tuple[int, ...]
    share_id: str = ''
    compute_units: int = 0
    memory_mib: int = 0
    masks: tuple[tuple[int, int], ...] = ()
    #: prepared for an ``adminAccess`` result: watched, not held
    admin: bool = False

    @property
    def shared(self) -> bool:
        return bool(self.masks) or bool(self.share_id)

    def to_dict(self) -> dict[str, Any]:
        data = {'request': self.request, 'pool': self.pool,
                'device': self.device, 'gpu': self.gpu,
                'partitions': list(self.partitions),
                'shareID': self.share_id,
                'computeUnits': self.compute_units,
                'memoryMiB': self.memory_mib,
                'masks': {str(p): '0x%x' % m for p, m in self.masks}}
        if self.admin:
            data['adminAccess'] = True
        return data


@dataclasses.dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    def to_dict(self) -> dict[str, Any]:
        return {'namespace': self.namespace, 'name': self.name,
                'devices': [d.to_dict() for d in self.devices]}


def _fail(path: str, reason: str) -> exception.DraStateError:
    return exception.DraStateError(path=path, reason=reason)


def _str(path: str, where: str, data: Mapping[str, Any], key: str,
         allow_empty: bool = False) -> str:
    value = data.get(key)
    if not isinstance(value, str) or (not value and not allow_empty) or \
            len(value) > 1024:
        raise _fail(path, '%s.%s must be a string, got %r' % (
            where, key, value))
    return value


def _int(path: str, where: str, data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _fail(path, '%s.%s must be a non-negative integer, got %r'
                    % (where, key, value))
    return value


def _device(path: str, where: str, data: Any) -> PreparedDevice:
    if not isinstance(data, dict):
        raise _fail(path, '%s is not a mapping' % where)
    parts = data.get('partitions')
    if not isinstance(parts, list) or not parts or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 64
            for p in parts):
        raise _fail(path, '%s.partitions must be a list of partition '
                    'indexes, got %r' % (where, parts))
    masks_raw = data.get('masks', {})
    if not isinstance(masks_raw, dict):
        raise _fail(path, '%s.masks is not a mapping' % where)
    masks = []
    for key, value in sorted(masks_raw.items()):
        try:
            index, mask = int(key), int(value, 16)
        except (TypeError, ValueError):
            raise _fail(path, '%s.masks[%r] = %r is not <index>: <hex '
                        'mask>' % (where, key, value)) from None
        if index not in parts or mask <= 0 or mask.bit_length() > 65536:
            raise _fail(path, '%s.masks[%r] = %r is outside the device'
                        % (where, key, value))
        masks.append((index, mask))
    admin = data.get('adminAccess', False)
    if not isinstance(admin, bool) or (admin and masks):
        raise _fail(path, '%s.adminAccess must be true (without masks) or '
                    'false, got %r' % (where, admin))
    return PreparedDevice(
        request=_str(path, where, data, 'request'),
        pool=_str(path, where, data, 'pool'),
        device=_str(path, where, data, 'device'),
        gpu=_str(path, where, data, 'gpu'),
        partitions=tuple(parts),
        share_id=_str(path, where, data, 'shareID', allow_empty=True),
        compute_units=_int(path, where, data, 'computeUnits'),
        memory_mib=_int(path, where, data, 'memoryMiB'),
        masks=tuple(masks), admin=admin)


def parse(text: str, path: str) -> dict[str, PreparedClaim]:
    """The claims recorded in ``text``.

    :raises DraStateError: naming ``path`` and the bad entry.
    """
    try:
        data = yamlutil.load_json(text, 'it')
    except exception.AmdgpuVirtError as err:
        raise _fail(path, str(err)) from None
    if not isinstance(data, dict) or data.get('version') != STATE_VERSION:
        raise _fail(path, 'expected an object with version %d' %
                    STATE_VERSION)
    claims_raw = data.get('claims')
    if not isinstance(claims_raw, dict):
        raise _fail(path, 'claims is not a mapping')
    claims = {}
    holders: dict[tuple[str, int], str] = {}
    cus: dict[tuple[str, int], int] = {}
    for uid, raw in claims_raw.items():
        where = 'claims[%s]' % uid
        if not isinstance(raw, dict) or not isinstance(raw.get('devices'),
                                                       list):
            raise _fail(path, '%s has no devices list' % where)
        devices = tuple(_device(path, '%s.devices[%d]' % (where, n), d)
                        for n, d in enumerate(raw['devices']))
        claim = PreparedClaim(uid=uid,
                              namespace=_str(path, where, raw, 'namespace'),
                              name=_str(path, where, raw, 'name'),
                              devices=devices)
        check_conflicts(claim, holders, cus, path)
        claims[uid] = claim
    return claims


def check_conflicts(claim: PreparedClaim,
                    holders: dict[tuple[str, int], str],
                    cus: dict[tuple[str, int], int], path: str) -> None:
    """Record ``claim`` in ``holders``/``cus``; raise on any overlap.

    An exclusive device holds its partitions alone; shares of one
    partition must not overlap in CUs; a device prepared for admin access
    (monitoring) holds nothing.
    """
    for device in claim.devices:
        if device.admin:
            continue
        for part in device.partitions:
            key = (device.gpu, part)
            mask = dict(device.masks).get(part)
            other = holders.get(key)
            if mask is None:
                if other is not None:
                    raise _fail(path, 'GPU %s partition %d is held by both '
                                'claim %s and claim %s' % (
                                    device.gpu, part, other, claim.uid))
                holders[key] = claim.uid
                continue
            if other is not None and not other.startswith('share:'):
                raise _fail(path, 'GPU %s partition %d is held by claim '
                            '%s and shared by claim %s' % (
                                device.gpu, part, other, claim.uid))
            if cus.get(key, 0) & mask:
                raise _fail(path, 'claim %s: CUs %#x of GPU %s partition '
                            '%d overlap another share' % (
                                claim.uid, cus[key] & mask, device.gpu,
                                part))
            cus[key] = cus.get(key, 0) | mask
            holders[key] = 'share:%s' % claim.uid


def dumps(claims: Mapping[str, PreparedClaim]) -> str:
    return json.dumps({'version': STATE_VERSION, 'claims': {
        uid: claims[uid].to_dict() for uid in sorted(claims)}},
        indent=1, sort_keys=True) + '\n'


class StateFile:
    """The state file at ``path``, read at start and written on change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.claims: dict[str, PreparedClaim] = {}

    def load(self) -> dict[str, PreparedClaim]:
        """Read the file (a missing file is an empty state).

        :raises DraStateError: unreadable, too large or inconsistent.
        """
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            self.claims = {}
            return self.claims
        except OSError as err:
            raise _fail(self.path, err.strerror or str(err)) from None
        if size > MAX_BYTES:
            raise _fail(self.path, 'is %d bytes, more than the %d a state '
                        'file may hold' % (size, MAX_BYTES))
        try:
            text = fileutil.read_text(self.path)
        except exception.AmdgpuVirtError as err:
            raise _fail(self.path, str(err)) from None
        self.claims = parse(text or '', self.path) if text is not None \
            else {}
        return self.claims

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Write ``claims`` atomically, then make them current.

        :raises DraStateError: the file cannot be written.
        """
        try:
            fileutil.write_if_changed(self.path, dumps(claims), mode=0o600)
        except exception.AmdgpuVirtError as err:
            raise _fail(self.path, str(err)) from None
        self.claims = dict(claims)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lock file beside the state file (across processes)."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)) or '.',
                    exist_ok=True)
        with open(self.path + '.lock', 'a') as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
