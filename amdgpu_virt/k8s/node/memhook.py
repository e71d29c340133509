"""Is the memory-limit hook library usable on this node?

Containers on a shared GPU get ``LD_AUDIT=<library>`` (HAMi's
``libamvgpu.so``), which enforces their ``HIP_DEVICE_MEMORY_LIMIT_<i>``.
Without a loadable library the hook enforces nothing: the node then
offers slices only where the kernel caps their VRAM and ``[kubernetes]
memory_enforcement`` allows it (see :mod:`.enforcement`), else whole GPUs
only (one device plugin slot per GPU), and says why: in its log, with a
Warning Event on its Node and with the node label
``amdgpu-virt.io/memory-hook`` (``ready`` or ``unavailable``).

:func:`check` looks at the file the way the dynamic loader will need it:
a regular file (a FIFO, socket or device is rejected without being
opened for reading), of a sane size, whose ELF header says shared object
(``ET_DYN``) for this host's class, byte order and machine, with its
program headers, loadable segments and section headers inside the file
(a truncated copy fails). Reads are bounded (the header and the program
header table only). :func:`report` publishes the verdict on the Node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import platform
import stat
import struct
import sys
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import events

LOG = logging.getLogger(__name__)

LABEL = 'amdgpu-virt.io/memory-hook'
READY = 'ready'
UNAVAILABLE = 'unavailable'
EVENT_REASON = 'MemoryHookUnavailable'
#: larger than any real audit library (libamvgpu.so is well under 1 MiB)
MAX_SIZE = 64 * 1024 * 1024
#: at most this many program headers are read (bounded read)
MAX_PROGRAM_HEADERS = 256

_ELF_MAGIC = b'\x7fELF'
_ET_DYN = 3
_PT_LOAD = 1
_PT_DYNAMIC = 2
#: e_machine of the hosts Python reports (platform.machine())
MACHINES = {'x86_64': 62, 'amd64': 62, 'aarch64': 183, 'arm64': 183,
            'ppc64le': 21, 'ppc64': 21, 's390x': 22, 'riscv64': 243,
            'i386': 3, 'i686': 3}


@dataclasses.dataclass(frozen=True)
class HookStatus:
    """The verdict on one path.

    :param reason: why it is not usable ('' when it is).
    """

    path: str
    usable: bool
    reason: str = ''


def _host() -> tuple[int, str, int | None]:
    """(ELF class 1/2, byte order '<'/'>', e_machine or None)."""
    elf_class = 2 if sys.maxsize > 2 ** 32 else 1
    order = '<' if sys.byteorder == 'little' else '>'
    return elf_class, order, MACHINES.get(platform.machine().lower())


def _fail(path: str, reason: str) -> exception.MemoryHookError:
    return exception.MemoryHookError(path=path, reason=reason)


def validate(path: str, host: tuple[int, str, int | None] | None = None,
             max_size: int = MAX_SIZE) -> None:
    """Check that ``path`` is a loadable ELF shared object for this host.

    :param host: (ELF class, byte order, e_machine) to expect; default:
        this host's.
    :raises MemoryHookError: naming the path and what is wrong.
    """
    elf_class, order, machine = host or _host()
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise _fail(path, 'no such file') from None
    except OSError as err:
        raise _fail(path, 'cannot stat it (%s)' % err.strerror) from None
    if not stat.S_ISREG(info.st_mode):
        kind = ('a directory' if stat.S_ISDIR(info.st_mode) else
                'a FIFO' if stat.S_ISFIFO(info.st_mode) else
                'a socket' if stat.S_ISSOCK(info.st_mode) else
                'a device' if stat.S_ISCHR(info.st_mode) or
                stat.S_ISBLK(info.st_mode) else 'not a regular file')
        raise _fail(path, 'it is %s, not a regular file' % kind)
    try:
        # O_NONBLOCK: a FIFO swapped in after the stat cannot block us
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise _fail(path, 'cannot open it (%s)' % err.strerror) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _fail(path, 'it changed into a non-regular file')
        _check_elf(path, fd, info.st_size, elf_class, order, machine,
                   max_size)
    finally:
        os.close(fd)


def _check_elf(path: str, fd: int, size: int, elf_class: int, order: str,
               machine: int | None, max_size: int) -> None:
    if size > max_size:
        raise _fail(path, '%d bytes, more than the %d a hook library may '
                    'have' % (size, max_size))
    header_size = 64 if elf_class == 2 else 52
    ident = os.pread(fd, header_size, 0)
    if len(ident) < 16 or ident[:4] != _ELF_MAGIC:
        raise _fail(path, 'not an ELF file (no ELF magic)')
    if ident[4] != elf_class:
        raise _fail(path, 'ELF class %d, but this host needs %d-bit '
                    'objects' % (ident[4], 64 if elf_class == 2 else 32))
    if ident[5] != (1 if order == '<' else 2):
        raise _fail(path, 'ELF byte order does not match this host')
    if len(ident) < header_size:
        raise _fail(path, 'truncated ELF header (%d of %d bytes)'
                    % (len(ident), header_size))
    if elf_class == 2:
        (e_type, e_machine, _version, _entry, e_phoff, e_shoff, _flags,
         _ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum) = struct.unpack(
            order + 'HHIQQQIHHHHH', ident[16:62])
    else:
        (e_type, e_machine, _version, _entry, e_phoff, e_shoff, _flags,
         _ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum) = struct.unpack(
            order + 'HHIIIIIHHHHH', ident[16:50])
    if e_type != _ET_DYN:
        raise _fail(path, 'ELF type %d, not a shared object (ET_DYN)'
                    % e_type)
    if machine is not None and e_machine != machine:
        raise _fail(path, 'built for ELF machine %d, this host is %d (%s)'
                    % (e_machine, machine, platform.machine()))
    phent = 56 if elf_class == 2 else 32
    if e_phnum == 0 or e_phentsize != phent:
        raise _fail(path, 'no program headers to load it by')
    if e_phnum > MAX_PROGRAM_HEADERS:
        raise _fail(path, '%d program headers, more than %d'
                    % (e_phnum, MAX_PROGRAM_HEADERS))
    if e_phoff + e_phnum * e_phentsize > size:
        raise _fail(path, 'truncated: the program headers end past its '
                    '%d bytes' % size)
    if e_shoff and e_shoff + e_shnum * e_shentsize > size:
        raise _fail(path, 'truncated: the section headers end past its '
                    '%d bytes' % size)
    table = os.pread(fd, e_phnum * e_phentsize, e_phoff)
    if len(table) != e_phnum * e_phentsize:
        raise _fail(path, 'truncated while reading its program headers')
    loads = dynamic = 0
    for n in range(e_phnum):
        entry = table[n * phent:(n + 1) * phent]
        if elf_class == 2:
            p_type, _pflags, p_offset, _vaddr, _paddr, p_filesz = \
                struct.unpack(order + 'IIQQQQ', entry[:40])
        else:
            p_type, p_offset, _vaddr, _paddr, p_filesz = struct.unpack(
                order + 'IIIII', entry[:20])
        if p_type == _PT_LOAD:
            loads += 1
            if p_offset + p_filesz > size:
                raise _fail(path, 'truncated: loadable segment %d ends at '
                            'byte %d of %d' % (n, p_offset + p_filesz, size))
        elif p_type == _PT_DYNAMIC:
            dynamic += 1
    if not loads or not dynamic:
        raise _fail(path, 'no loadable or dynamic segment: not a shared '
                    'library')


def check(path: str) -> HookStatus:
    """The verdict on ``path`` (never raises for a bad file)."""
    try:
        validate(path)
    except exception.MemoryHookError as err:
        return HookStatus(path, False, str(err))
    return HookStatus(path, True)


def node_event(node: dict[str, Any], reason: str, tag: str, message: str,
               now: str) -> dict[str, Any]:
    """A Warning Event on the Node, named after the node, ``tag`` and the
    message (publishing the same again is one object)."""
    digest = hashlib.sha256(message.encode()).hexdigest()[:12]
    return events.node_event(node, '%s.%s' % (tag, digest), reason,
                             'Warning', message[:1024], events.NODE_AGENT,
                             now)


def event_body(node: dict[str, Any], status: HookStatus,
               share: int, now: str) -> dict[str, Any]:
    """The Warning Event on the Node (a deterministic name per node and
    reason, so publishing it again is one object)."""
    if share <= 1:
        consequence = 'this node offers whole GPUs only (%d slot per GPU)' \
            % share
    else:
        consequence = 'slices on this node are capped by the kernel only ' \
            '(dmem cgroup); hipMemGetInfo shows them the whole GPU'
    return node_event(node, EVENT_REASON, 'memory-hook',
                      '%s; %s' % (status.reason, consequence), now)


def report(store: Any, core_api: Any, status: HookStatus, share: int,
           now: str) -> None:
    """Label the Node with the verdict and, when unusable, record the
    Event. ``store`` is the agent's node store (read, label).

    :raises KubernetesError: the node could not be read or labelled.
    """
    node = store.read()
    value = READY if status.usable else UNAVAILABLE
    if ((node.get('metadata') or {}).get('labels') or {}).get(LABEL) != value:
        store.label(node, {LABEL: value})
    if status.usable:
        return
    events.record(core_api, event_body(node, status, share, now))


def publish_with(node_agent: Any, verdict: Any, report_fn: Any,
                 what: str) -> None:
    """``report_fn(store, api, verdict, share_count, now)`` for a node
    agent made by ``agent.from_conf``; nothing without a verdict or an
    API; a failure to publish is logged, never fatal."""
    import datetime

    api = getattr(node_agent.store, 'api', None)
    if verdict is None or api is None:
        return
    now = datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')
    try:
        report_fn(node_agent.store, api, verdict, node_agent.share_count,
                  now)
    except exception.KubernetesError as err:
        LOG.warning('%s not published on the node: %s', what, err)


def publish(node_agent: Any) -> None:
    """:func:`report` for a node agent made by ``agent.from_conf`` (its
    ``memory_hook`` verdict, its store and share count)."""
    publish_with(node_agent, getattr(node_agent, 'memory_hook', None),
                 report, 'memory-hook verdict')
