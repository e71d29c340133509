"""The exit statuses of ``amdgpu-virt``: one table for every command.

A command that fails raises an error of the project's hierarchy
(:mod:`amdgpu_virt.exception`); :func:`status_of` turns it into the exit
status here, by the first class of the error's MRO that :data:`BY_ERROR`
names, so that a new subclass inherits its family's status. The values
follow ``sysexits.h`` where it has one; 1 and 3 are the pool's own
outcomes. :data:`TABLE` is what ``amdgpu-virt --help`` and the command
line guide print.
"""

from __future__ import annotations

from collections.abc import Mapping

from amdgpu_virt import exception

#: done; ``audit``: consistent
OK = 0
#: refused or a conflict: ``move`` refused (the GPU is in use, another
#: move is recorded), ``audit`` found a GPU offered or used by both
#: clouds, ``nova drain-check`` found an allocation, ``nova audit`` drift
REFUSED = 1
#: ``audit``: drift between the ledger and a side, no conflict
DRIFT = 3
#: EX_USAGE: the command line is wrong (unknown command or option, a
#: missing or malformed argument, no command)
USAGE = 64
#: EX_DATAERR: an input's content is wrong (ledger, fleet, workloads,
#: snapshot, YAML, a sysfs value, an allocation record)
DATA = 65
#: EX_NOINPUT: an input file or tree is missing or cannot be read
NO_INPUT = 66
#: EX_UNAVAILABLE: Placement, Nova or the Kubernetes API cannot be
#: reached; nothing was changed
UNREACHABLE = 69
#: EX_SOFTWARE: an unexpected internal error (a bug; ``--debug`` prints
#: the traceback)
SOFTWARE = 70
#: EX_CANTCREAT: an output file or directory cannot be written (a
#: missing parent, no permission, a full disk; ``k8s install-hook``: the
#: library's directory is a link)
CANT_CREATE = 73
#: EX_TEMPFAIL: ``move`` waits for a side or the host; a lock or a
#: concurrent writer: run the same command again later
WAITING = 75
#: EX_PROTOCOL: an API answered, with an error (403, 422, ...)
PROTOCOL = 76
#: EX_CONFIG: a configuration option or file is wrong, or a plugin it
#: names cannot be loaded
CONFIG = 78

#: error class -> status; the most specific class of an error's MRO wins
BY_ERROR: Mapping[type[exception.AmdgpuVirtError], int] = {
    exception.UsageError: USAGE,
    exception.ConfigError: CONFIG,
    exception.DriverNotFound: CONFIG,
    exception.AmdSmiUnavailable: CONFIG,
    exception.MemoryHookError: CONFIG,
    exception.HookSourceMissing: NO_INPUT,
    exception.HookTargetError: CANT_CREATE,
    exception.HookInstallBusy: WAITING,
    exception.FileInputError: NO_INPUT,
    exception.SnapshotUnreadable: NO_INPUT,
    exception.OutputError: CANT_CREATE,
    exception.NothingReadable: NO_INPUT,
    exception.UnsafeRoleChange: REFUSED,
    exception.ServiceUnreachable: UNREACHABLE,
    exception.PlacementUnreachable: UNREACHABLE,
    exception.KubernetesUnavailable: UNREACHABLE,
    exception.PlacementError: PROTOCOL,
    exception.NovaApiError: PROTOCOL,
    exception.KubernetesError: PROTOCOL,
    exception.KubernetesConflict: WAITING,
    exception.NodeLockError: WAITING,
    exception.NotLeader: WAITING,
    exception.AllocationRecordError: DATA,
    exception.AnnotationError: DATA,
    # everything else the project names is about an input's content:
    # a ledger, plan, workload, snapshot, mask, YAML document
    exception.AmdgpuVirtError: DATA,
}

#: (status, meaning) in the order the help and the guide print them
TABLE = (
    (OK, 'done; audit: consistent'),
    (REFUSED, 'refused or a conflict (move: the GPU is in use; audit: a '
              'GPU offered or used by both clouds)'),
    (DRIFT, 'audit: drift only'),
    (USAGE, 'the command line is wrong'),
    (DATA, 'an input\'s content is wrong (ledger, fleet, workloads, '
           'snapshot, YAML)'),
    (NO_INPUT, 'an input file is missing or cannot be read'),
    (UNREACHABLE, 'Placement, Nova or the Kubernetes API cannot be '
                  'reached; nothing was changed'),
    (SOFTWARE, 'internal error (a bug; --debug prints the traceback)'),
    (CANT_CREATE, 'an output file or directory cannot be written (a '
                  'missing parent, no permission, a full disk; '
                  'install-hook: the target directory is a link)'),
    (WAITING, 'waiting (move) or busy: run the same command again later'),
    (PROTOCOL, 'an API answered with an error'),
    (CONFIG, 'a configuration option or file is wrong'),
)


def status_of(error: BaseException) -> int:
    """The exit status for ``error`` (:data:`SOFTWARE` for anything that
    is not one of the project's errors)."""
    for cls in type(error).__mro__:
        status = BY_ERROR.get(cls)
        if status is not None:
            return status
    return SOFTWARE


def epilog() -> str:
    """The exit status table as plain text (for ``--help``)."""
    return 'Exit statuses:\n' + '\n'.join(
        '  %-3d %s' % (status, meaning) for status, meaning in TABLE)
