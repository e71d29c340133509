"""HAMi's AMD vocabulary: resource names, annotation keys, policies, the
device plugin's environment and the protocol's defaults.

The one place these names are declared; every module imports them (through
:mod:`amdgpu_virt.sharing.hami`), never re-declares them.
"""

from __future__ import annotations

import datetime

from amdgpu_virt.sharing import cumask

# --- resource names ----------------------------------------------------------

#: The vendor domain of AMD's extended resources and annotations.
VENDOR = 'amd.com/'
#: Number of physical GPUs (pod limit).
RESOURCE_GPU = 'amd.com/gpu'
#: MiB per GPU; 0 or absent = the whole card's memory.
RESOURCE_GPUMEM = 'amd.com/gpumem'
#: Percent of the GPU's CUs, 1..100; absent = 100.
RESOURCE_GPUCORES = 'amd.com/gpucores'
#: The three, in HAMi's order (count, memory, cores).
RESOURCES = (RESOURCE_GPU, RESOURCE_GPUMEM, RESOURCE_GPUCORES)

# --- node annotations --------------------------------------------------------

NODE_REGISTER = 'hami.io/node-amd-register'
NODE_LOCK = 'hami.io/mutex.lock'

# --- pod annotations ---------------------------------------------------------

DEVICES_TO_ALLOCATE = 'hami.io/amd-devices-to-allocate'
DEVICES_ALLOCATED = 'hami.io/amd-devices-allocated'
CU_ALLOCATED = 'hami.io/amd-cu-allocated'
#: Node chosen by the filter (also a pod label).
VGPU_NODE = 'hami.io/vgpu-node'
#: Unix seconds of the filter decision.
VGPU_TIME = 'hami.io/vgpu-time'
BIND_PHASE = 'hami.io/bind-phase'
#: Unix seconds of the bind.
BIND_TIME = 'hami.io/bind-time'
USE_GPUTYPE = 'amd.com/use-gputype'
NOUSE_GPUTYPE = 'amd.com/nouse-gputype'
USE_GPU_UUID = 'amd.com/use-gpu-uuid'
NOUSE_GPU_UUID = 'amd.com/nouse-gpu-uuid'
NODE_SCHEDULER_POLICY = 'hami.io/node-scheduler-policy'
GPU_SCHEDULER_POLICY = 'hami.io/gpu-scheduler-policy'
#: Label (and its value) that makes HAMi's webhook skip an object. The
#: label is set by the pod's owner, so our webhook deliberately ignores it:
#: admission exemptions are by namespace only (an administrator's choice).
WEBHOOK_LABEL = 'hami.io/webhook'
WEBHOOK_IGNORE = 'ignore'
#: Pod annotations that record an allocation: only the scheduler and the
#: device plugin write them (a pod owner who could would claim GPUs it was
#: never given or make its CUs look free).
ALLOCATION_ANNOTATIONS = (DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED,
                          CU_ALLOCATED, VGPU_NODE, VGPU_TIME, BIND_PHASE,
                          BIND_TIME)
#: Pod labels that record an allocation (HAMi's scheduler labels a pod
#: with the node it chose, for selecting a node's pods): written, like
#: :data:`ALLOCATION_ANNOTATIONS`, only by the project's service accounts.
ALLOCATION_LABELS = (VGPU_NODE,)

NODE_SCHEDULER_POLICIES = ('binpack', 'spread')
DEFAULT_NODE_SCHEDULER_POLICY = 'binpack'
GPU_SCHEDULER_POLICIES = ('binpack', 'spread', 'topology-aware', 'mutex',
                          'numa')
DEFAULT_GPU_SCHEDULER_POLICY = 'spread'

# --- container environment (device plugin Allocate) --------------------------

ENV_ROCR_VISIBLE_DEVICES = 'ROCR_VISIBLE_DEVICES'
ENV_HIP_VISIBLE_DEVICES = 'HIP_VISIBLE_DEVICES'
ENV_HSA_CU_MASK = cumask.HSA_CU_MASK
#: Per container-local GPU i: ``HIP_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``.
ENV_HIP_DEVICE_MEMORY_LIMIT = 'HIP_DEVICE_MEMORY_LIMIT'
ENV_LD_AUDIT = 'LD_AUDIT'
LD_AUDIT_LIBRARY = '/usr/local/vgpu/libamvgpu.so'
ENV_ROC_GLOBAL_CU_MASK = cumask.ROC_GLOBAL_CU_MASK
#: Environment the device plugin sets (or that would override what it
#: sets): a container setting one itself could escape its CU mask or
#: memory limit, or see other GPUs.
PLUGIN_ENV = (ENV_HSA_CU_MASK, ENV_ROC_GLOBAL_CU_MASK,
              ENV_ROCR_VISIBLE_DEVICES, ENV_LD_AUDIT)
#: ... and every variable starting with one of these.
PLUGIN_ENV_PREFIXES = (ENV_HIP_DEVICE_MEMORY_LIMIT,)

# --- defaults ----------------------------------------------------------------

#: ``count`` HAMi's AMD plugin registers: max pods sharing one GPU.
DEFAULT_SHARE_COUNT = 10
#: ``mode`` of a legacy 7-field registration entry.
DEFAULT_MODE = 'hami-core'
#: Older HAMi schedulers matched AMD devices by this word in ``type``
#: (current ones take every device of ``hami.io/node-amd-register`` as AMD,
#: whatever its type, and so does our extender); the node agent still puts
#: it in the types it registers, for the older ones.
AMD_TYPE_WORD = 'amd'
NODE_LOCK_TIMEOUT = datetime.timedelta(minutes=5)
#: Key of ``custominfo`` with the CUs allocated together (RDNA WGPs).
CUSTOMINFO_CU_PER_WGP = 'cuPerWGP'
CUSTOMINFO_PCI_BDF = 'pciBDF'
#: Key of ``custominfo`` (ours, not HAMi's; HAMi ignores unknown keys)
#: with why a device registered ``health: false`` is unhealthy, as the
#: node agent saw it (node input: short free text).
CUSTOMINFO_HEALTH_REASON = 'healthReason'


def is_plugin_env(name: str) -> bool:
    """True for an environment variable only the device plugin may set."""
    return name in PLUGIN_ENV or name.startswith(PLUGIN_ENV_PREFIXES)


def plugin_env_clash(prefix: str) -> str | None:
    """The device plugin's variable that ``envFrom`` with this ``prefix``
    could set (every key of a ConfigMap or Secret becomes
    ``prefix + key``), or None when none can.
    """
    for name in PLUGIN_ENV:
        if name.startswith(prefix):
            return name
    for start in PLUGIN_ENV_PREFIXES:
        if start.startswith(prefix) or prefix.startswith(start):
            return start + '*'
    return None
