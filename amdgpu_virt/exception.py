"""The one error hierarchy of amdgpu_virt.

Every error the project raises on purpose derives from
:class:`AmdgpuVirtError`. A subclass sets ``msg_fmt``, a template filled
from the keyword arguments given at raise time; the template must name the
culprit (the file, field, annotation or option that was wrong) so that an
operator can act on it without reading a traceback.

Areas keep their subclasses in their own section below; add new ones at the
end of the section that owns them.
"""

from __future__ import annotations

from typing import Any


class AmdgpuVirtError(Exception):
    """Base class of every error amdgpu_virt raises on purpose."""

    msg_fmt = 'An unknown error occurred.'

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        self.kwargs = kwargs
        if message is None:
            try:
                message = self.msg_fmt % kwargs
            except (KeyError, TypeError, ValueError):
                # A template that does not fit its arguments is a bug of
                # ours; still say everything we know rather than hiding it.
                message = '%s (%s)' % (self.msg_fmt, ', '.join(
                    '%s=%r' % item for item in sorted(kwargs.items())))
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return self.message


# --- configuration and plugins -----------------------------------------------

class ConfigError(AmdgpuVirtError):
    msg_fmt = 'Invalid configuration: option %(option)s: %(reason)s'


class DriverNotFound(AmdgpuVirtError):
    msg_fmt = ('No %(namespace)s plugin named %(name)r could be loaded '
               '(known: %(known)s): %(reason)s')


class FileInputError(AmdgpuVirtError):
    msg_fmt = 'cannot read %(what)s %(path)s: %(reason)s'


class OutputError(AmdgpuVirtError):
    """A file or directory the command was asked to write cannot be
    written (``--out``, ``--output-ledger``, ``--chart``, ``--html``...)."""

    msg_fmt = 'cannot write %(path)s: %(reason)s'


class UsageError(ConfigError):
    """The command line is wrong (an option, an argument, a combination).

    A :class:`ConfigError` so that code catching configuration errors
    keeps catching it; the command line exits with its own status.
    """

    msg_fmt = 'Invalid command line: %(option)s: %(reason)s'


# --- hardware model and catalog ----------------------------------------------

class InvalidPciAddress(AmdgpuVirtError):
    msg_fmt = ('%(value)r is not a PCI address; expected '
               'DDDD:BB:DD.F (hex), e.g. 0000:85:00.0')


class UnknownModel(AmdgpuVirtError):
    msg_fmt = 'Unknown GPU model %(model)r; known models: %(known)s'


class InvalidPartitionMode(AmdgpuVirtError):
    msg_fmt = ('%(model)s does not support %(what)s %(value)r; '
               'allowed: %(allowed)s')


class InvalidData(AmdgpuVirtError):
    msg_fmt = 'Field %(field)s: %(reason)s'


# --- inventory ---------------------------------------------------------------

class InventoryError(AmdgpuVirtError):
    msg_fmt = 'Inventory of %(source)s failed: %(reason)s'


class NothingReadable(InventoryError):
    msg_fmt = ('No AMD GPU could be read from %(source)s: %(reason)s')


class SysfsValueError(InventoryError):
    msg_fmt = 'Bad value %(value)r in %(path)s: %(reason)s'


class SnapshotError(InventoryError):
    msg_fmt = 'Snapshot %(path)s is not usable: %(reason)s'


class SnapshotUnreadable(SnapshotError):
    """The snapshot file is missing or cannot be read (its content was
    never seen)."""


class AmdSmiUnavailable(InventoryError):
    msg_fmt = ('The amdsmi inventory driver cannot run: %(reason)s. '
               'Install ROCm (libamd_smi.so) and the amdsmi Python package, '
               'or choose [inventory] driver = sysfs.')


class SimulationError(AmdgpuVirtError):
    msg_fmt = 'Cannot simulate host: %(reason)s'


# --- CU and memory sharing ---------------------------------------------------

class SharingError(AmdgpuVirtError):
    msg_fmt = 'CU sharing error: %(reason)s'


class AllocationConflict(SharingError):
    msg_fmt = ('CU %(cu)d of GPU %(gpu)s is claimed by both %(owner)s and '
               '%(other)s')


class InsufficientCapacity(SharingError):
    msg_fmt = ('GPU %(gpu)s cannot give %(requested)s %(unit)s to %(owner)s: '
               '%(free)s free of %(capacity)s')


class UnknownConsumer(SharingError):
    msg_fmt = 'GPU %(gpu)s has no allocation for %(owner)s'


class MaskSyntaxError(SharingError):
    msg_fmt = ('Invalid %(variable)s value %(value)r at position '
               '%(position)d: %(reason)s')


class HamiProtocolError(SharingError):
    msg_fmt = 'Invalid %(key)s value %(value)r: %(reason)s'


# --- policy and planning -----------------------------------------------------

class WorkloadSpecError(AmdgpuVirtError):
    """One or more problems in a workload specification.

    ``problems`` lists every problem found, each naming its field.
    """

    msg_fmt = 'Invalid workload %(workload)s: %(problems)s'

    def __init__(self, workload: str, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(workload=workload, problems='; '.join(problems))


class PlanError(AmdgpuVirtError):
    msg_fmt = 'Invalid plan %(source)s: %(reason)s'


class UnknownWorkload(PlanError):
    msg_fmt = 'No workload named %(name)r in the plan; known: %(known)s'


# --- OpenStack Nova ----------------------------------------------------------

class NovaConfigError(AmdgpuVirtError):
    msg_fmt = 'Cannot render Nova configuration for %(host)s: %(reason)s'


class PlacementError(AmdgpuVirtError):
    msg_fmt = 'Placement request %(request)s failed: %(reason)s'


class PlacementUnreachable(PlacementError):
    msg_fmt = ('Placement request %(request)s got no answer: %(reason)s; '
               'check [nova] placement_endpoint (or cloud) and that '
               'Placement runs')


class UnsafeRoleChange(AmdgpuVirtError):
    msg_fmt = 'Refusing to change GPU %(gpu)s: %(reason)s'


class NovaApiError(AmdgpuVirtError):
    msg_fmt = 'Nova API request %(request)s failed: %(reason)s'


class ServiceUnreachable(AmdgpuVirtError):
    msg_fmt = ('Cannot reach the %(service)s API at %(where)s: %(reason)s; '
               'check %(options)s')


# --- Kubernetes --------------------------------------------------------------

class KubernetesError(AmdgpuVirtError):
    msg_fmt = 'Kubernetes request %(request)s failed: %(reason)s'


class InvalidQuantity(KubernetesError):
    """Text that is no Kubernetes quantity (``resource.Quantity``), or one
    beyond the bounds the project reads (:mod:`amdgpu_virt.k8s.api.quantity`).
    """

    msg_fmt = '%(value)r is not a Kubernetes quantity: %(reason)s'


class AnnotationError(KubernetesError):
    msg_fmt = 'Bad annotation %(key)s on %(obj)s: %(reason)s'


class DevicePluginError(KubernetesError):
    msg_fmt = 'Device plugin for %(resource)s: %(reason)s'


class LockHolderGone(DevicePluginError):
    """The node lock names a pod that is gone (or replaced by a pod of
    another UID under its name): an Allocate now is that pod's late one.

    ``kwargs`` carry ``namespace``, ``name`` and ``uid`` (None when the
    lock names no UID) of the holder.
    """


class UnknownDevice(DevicePluginError):
    msg_fmt = ('Device ID %(device)r in %(request)s is not one that the '
               'device plugin for %(resource)s offered')


class KubernetesUnavailable(KubernetesError):
    msg_fmt = ('Kubernetes request %(request)s got no usable answer: '
               '%(reason)s; the API server or the network to it failed, '
               'the request may or may not have taken effect')


class KubernetesNotFound(KubernetesError):
    msg_fmt = 'Kubernetes request %(request)s failed: 404 Not Found'


class KubernetesConflict(KubernetesError):
    msg_fmt = ('%(obj)s changed while it was being updated (409 Conflict); '
               'retry with its new version')


class WatchBehind(KubernetesConflict):
    """What a watch showed is not what the API has (or may not be):
    decide again on a fresh read."""
    msg_fmt = ('%(obj)s: the watch may be behind the API (%(reason)s); '
               'decide again on a fresh read')


class AdmissionReviewError(KubernetesError):
    msg_fmt = 'Invalid AdmissionReview: %(field)s: %(reason)s'


class ReviewBudgetExceeded(KubernetesError):
    """A review ran out of its time budget (the pod is denied)."""

    msg_fmt = ('the review took longer than its budget of %(seconds)g s '
               '(%(where)s)')


class ClusterShapesUnknown(KubernetesError):
    """The webhook has not read the cluster's GPU shapes yet."""

    msg_fmt = ('the GPU shapes the cluster\'s nodes register are not '
               'known yet: %(reason)s')


class HttpRequestError(KubernetesError):
    msg_fmt = 'Bad HTTP request: %(reason)s'


class ExtenderRequestError(KubernetesError):
    msg_fmt = 'Invalid scheduler extender request: %(field)s: %(reason)s'


class DraClaimError(KubernetesError):
    msg_fmt = 'ResourceClaim %(claim)s: %(reason)s'


class DraStateError(KubernetesError):
    msg_fmt = 'DRA state file %(path)s: %(reason)s'


class DraPluginError(KubernetesError):
    msg_fmt = 'DRA plugin %(driver)s: %(reason)s'


class NodeLockError(KubernetesError):
    msg_fmt = ('Node %(node)s: lock hami.io/mutex.lock not acquired for pod '
               '%(pod)s: %(reason)s')


class AllocationRecordError(KubernetesError):
    msg_fmt = 'Allocation record %(record)s: %(reason)s'


class NotLeader(KubernetesError):
    msg_fmt = ('Not answering: %(reason)s; the kube-scheduler of this pod '
               'does not hold the leader lease %(lease)s')


class MemoryHookError(DevicePluginError):
    msg_fmt = ('Memory-limit hook library %(path)s is not usable: '
               '%(reason)s')


# --- node memory enforcement (cgroup v2 dmem caps) ---------------------------

class CgroupError(AmdgpuVirtError):
    """A cgroup file or directory is missing, unsafe or unreadable."""

    msg_fmt = 'cgroup %(path)s: %(reason)s'


class CgroupNotFound(CgroupError):
    """The cgroup of a pod or container is not where kubelet puts it."""

    msg_fmt = 'cgroup of %(owner)s not found: %(reason)s'


class DmemError(CgroupError):
    """The dmem controller cannot cap VRAM here (named file, reason)."""

    msg_fmt = 'dmem cap on %(path)s: %(reason)s'


class OciStateError(AmdgpuVirtError):
    msg_fmt = 'OCI state from the container runtime: %(field)s: %(reason)s'
class HookInstallError(AmdgpuVirtError):
    """``k8s install-hook`` could not install the memory-limit library."""

    msg_fmt = ('Cannot install the memory-limit hook library %(path)s: '
               '%(reason)s')


class HookSourceMissing(HookInstallError):
    msg_fmt = ('Memory-limit hook library source %(path)s cannot be read: '
               '%(reason)s')


class HookSourceInvalid(HookInstallError):
    msg_fmt = ('Memory-limit hook library source %(path)s is not usable: '
               '%(reason)s')


class HookTargetError(HookInstallError):
    msg_fmt = ('Cannot install the memory-limit hook library at %(path)s: '
               '%(reason)s')


class HookInstallBusy(HookInstallError):
    msg_fmt = ('Cannot install the memory-limit hook library at %(path)s: '
               'another install held its directory\'s lock for '
               '%(seconds)s seconds; run the same command again')


class TelemetryError(AmdgpuVirtError):
    msg_fmt = 'Node telemetry source %(source)s: %(reason)s'
