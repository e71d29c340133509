"""The VRAM cap of one container, set by a CDI ``createRuntime`` hook.

The DRA driver's CDI spec gives each share a ``createRuntime`` hook that
runs ``amdgpu-virt k8s dmem-hook --cap <region>=<bytes>``. The container
runtime (runc, crun) runs it in the runtime's namespaces once it created
the container's cgroup and put the container's init process in it, and
before that process runs the user's program; it passes the container's
OCI state (``ociVersion``, ``id``, ``status``, ``pid``, ``bundle``) on
standard input, and a hook that fails fails the container's creation.

:func:`run` finds the container's cgroup from ``/proc/<pid>/cgroup`` (the
unified hierarchy's line ``0::<path>``), enables the dmem controller down
to it and writes the caps, read back (:mod:`.dmem`). The cap is on the
container's cgroup: a claim's share belongs to the containers that use
it, each capped on its own. Every input is bounded and checked; every
failure names what was wrong.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from collections.abc import Sequence

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.k8s.node import cgroups
from amdgpu_virt.k8s.node import dmem

#: the OCI state is a few hundred bytes (annotations included)
MAX_STATE = 1024 * 1024
MAX_PROC = 64 * 1024
_CAP = re.compile(r'^(drm/[A-Za-z0-9_.:-]{1,64}/[A-Za-z0-9_]{1,32})='
                  r'([0-9]{1,19})$')


@dataclasses.dataclass(frozen=True)
class OciState:
    pid: int
    id: str
    status: str


def parse_state(text: str) -> OciState:
    """The OCI state a runtime passes to a hook.

    :raises OciStateError: naming the field.
    """
    if len(text) > MAX_STATE:
        raise exception.OciStateError(field='(stdin)', reason='more than '
                                      '%d bytes' % MAX_STATE)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise exception.OciStateError(field='(stdin)', reason='not JSON: %s'
                                      % err) from None
    if not isinstance(data, dict):
        raise exception.OciStateError(field='(stdin)',
                                      reason='not an object')
    pid = data.get('pid')
    if not isinstance(pid, int) or isinstance(pid, bool) or \
            not 0 < pid < 1 << 31:
        raise exception.OciStateError(field='pid', reason='%.40r is not '
                                      'the pid of a created container' % (
                                          pid,))
    ident = data.get('id')
    status = data.get('status')
    return OciState(pid, ident[:128] if isinstance(ident, str) else '',
                    status[:32] if isinstance(status, str) else '')


def unified_path(text: str, where: str) -> cgroups.Parts:
    """The cgroup of the unified hierarchy in ``/proc/<pid>/cgroup``.

    :raises CgroupError: a cgroup v1 process, or a path that is not a
        plain cgroup below the root (naming the file).
    """
    for line in text.splitlines():
        number, _sep, rest = line.partition(':')
        controllers, sep, path = rest.partition(':')
        if number != '0' or controllers or not sep:
            continue
        parts = tuple(p for p in path.split('/') if p)
        if not path.startswith('/') or not parts or \
                any(p in ('.', '..') for p in parts):
            raise exception.CgroupError(
                path=where, reason='%.200r is not a container\'s cgroup'
                % path)
        return parts
    raise exception.CgroupError(
        path=where, reason='no cgroup v2 line (0::<path>): the container '
        'runs on a cgroup v1 hierarchy, which has no dmem controller')


def parse_caps(values: Sequence[str]) -> dict[str, int]:
    """``<region>=<bytes>`` arguments.

    :raises UsageError: naming the argument.
    """
    caps: dict[str, int] = {}
    for value in values:
        match = _CAP.match(value)
        if match is None or int(match.group(2)) > (1 << 63) - 1:
            raise exception.UsageError(
                option='--cap', reason='%.200r is not <region>=<bytes> '
                '(e.g. drm/0000:85:00.0/vram=8589934592)' % value)
        caps[match.group(1)] = caps.get(match.group(1), 0) + int(
            match.group(2))
    if not caps:
        raise exception.UsageError(option='--cap', reason='give at least '
                                   'one')
    return caps


def run(state_text: str, caps: Mapping[str, int], root: str = '/'
        ) -> tuple[str, bool]:
    """Cap the container the OCI state names.

    :param root: where the host's ``proc`` and ``sys/fs/cgroup`` are.
    :returns: (the container's cgroup, whether anything was written).
    :raises OciStateError, CgroupError: naming what was wrong; the
        runtime then fails the container's creation.
    """
    state = parse_state(state_text)
    fs = cgroups.CgroupFs(os.path.join(root, 'sys', 'fs', 'cgroup'))
    node = dmem.probe(fs)
    if not node.available:
        raise exception.DmemError(path=fs.root, reason=node.reason)
    proc = os.path.join(root, 'proc', str(state.pid), 'cgroup')
    try:
        text = fileutil.read_text(proc, 'cgroup membership', limit=MAX_PROC)
    except exception.FileInputError as err:
        raise exception.CgroupError(path=proc, reason=str(err)) from None
    if text is None:
        raise exception.CgroupError(
            path=proc, reason='no such file: process %d (container %s) is '
            'gone' % (state.pid, state.id or '?'))
    parts = unified_path(text, proc)
    dmem.ensure_enabled(fs, parts)
    written = dmem.set_max(fs, parts, caps, node.capacity)
    return fs.where(parts), written
