"""Codecs of HAMi's AMD protocol (annotation values), pure Python.

HAMi's scheduler, webhook and AMD device plugin talk through annotations on
nodes and pods. Everything here turns those values into typed frozen
dataclasses and back, byte for byte as HAMi writes them, so that either
side of a cluster may be HAMi's or ours:

* node registration (``hami.io/node-amd-register``): a JSON array of
  DeviceInfo written the way Go's ``encoding/json`` writes HAMi's struct
  (fields in struct order, ``omitempty``); decoding accepts present and
  absent zero fields alike and never requires a field. The legacy colon
  format (``ID,Count,Devmem,Devcore,Type,Numa,Health[,Index,Mode]:``) is
  decoded and encoded too;
* pod allocation (``hami.io/amd-devices-to-allocate`` and
  ``hami.io/amd-devices-allocated``): ``UUID,Type,Mem,Cores:`` per device,
  ``;`` after each container (init containers first), empty containers
  kept;
* node lock (``hami.io/mutex.lock``): ``<RFC 3339>,<namespace>,<pod>`` or a
  bare time;
* handshake and bind phase values, unix-second times;
* per-pod CU ranges (``hami.io/amd-cu-allocated``):
  ``{"<uuid>": "<ID list>"}``, and :func:`rebuild_allocators` that turns
  those of all live pods back into one :class:`CuAllocator` per GPU,
  failing closed on overlaps.

Every decoder raises :class:`~amdgpu_virt.exception.HamiProtocolError`
naming the annotation key, the value and what is wrong; nothing here talks
to Kubernetes.

The parts, each re-exported here (import this module, not a part):
:mod:`~amdgpu_virt.sharing.hami.names` (the vocabulary: resource names,
annotation keys, policies, environment, defaults),
:mod:`~amdgpu_virt.sharing.hami.percent` (``amd.com/gpucores``),
:mod:`~amdgpu_virt.sharing.hami.register` (node registration),
:mod:`~amdgpu_virt.sharing.hami.pods` (pod allocation and CU ranges) and
:mod:`~amdgpu_virt.sharing.hami.lock` (node lock, handshake, bind phase,
times).
"""

from __future__ import annotations

from amdgpu_virt.sharing.hami.names import ALLOCATION_ANNOTATIONS
from amdgpu_virt.sharing.hami.names import ALLOCATION_LABELS
from amdgpu_virt.sharing.hami.names import AMD_TYPE_WORD
from amdgpu_virt.sharing.hami.names import BIND_PHASE
from amdgpu_virt.sharing.hami.names import BIND_TIME
from amdgpu_virt.sharing.hami.names import CU_ALLOCATED
from amdgpu_virt.sharing.hami.names import CUSTOMINFO_CU_PER_WGP
from amdgpu_virt.sharing.hami.names import CUSTOMINFO_HEALTH_REASON
from amdgpu_virt.sharing.hami.names import CUSTOMINFO_PCI_BDF
from amdgpu_virt.sharing.hami.names import DEFAULT_GPU_SCHEDULER_POLICY
from amdgpu_virt.sharing.hami.names import DEFAULT_MODE
from amdgpu_virt.sharing.hami.names import DEFAULT_NODE_SCHEDULER_POLICY
from amdgpu_virt.sharing.hami.names import DEFAULT_SHARE_COUNT
from amdgpu_virt.sharing.hami.names import DEVICES_ALLOCATED
from amdgpu_virt.sharing.hami.names import DEVICES_TO_ALLOCATE
from amdgpu_virt.sharing.hami.names import ENV_HIP_DEVICE_MEMORY_LIMIT
from amdgpu_virt.sharing.hami.names import ENV_HIP_VISIBLE_DEVICES
from amdgpu_virt.sharing.hami.names import ENV_HSA_CU_MASK
from amdgpu_virt.sharing.hami.names import ENV_LD_AUDIT
from amdgpu_virt.sharing.hami.names import ENV_ROC_GLOBAL_CU_MASK
from amdgpu_virt.sharing.hami.names import ENV_ROCR_VISIBLE_DEVICES
from amdgpu_virt.sharing.hami.names import GPU_SCHEDULER_POLICIES
from amdgpu_virt.sharing.hami.names import GPU_SCHEDULER_POLICY
from amdgpu_virt.sharing.hami.names import VENDOR
from amdgpu_virt.sharing.hami.names import is_plugin_env
from amdgpu_virt.sharing.hami.names import LD_AUDIT_LIBRARY
from amdgpu_virt.sharing.hami.names import NODE_LOCK
from amdgpu_virt.sharing.hami.names import NODE_LOCK_TIMEOUT
from amdgpu_virt.sharing.hami.names import NODE_REGISTER
from amdgpu_virt.sharing.hami.names import NODE_SCHEDULER_POLICIES
from amdgpu_virt.sharing.hami.names import NODE_SCHEDULER_POLICY
from amdgpu_virt.sharing.hami.names import NOUSE_GPU_UUID
from amdgpu_virt.sharing.hami.names import NOUSE_GPUTYPE
from amdgpu_virt.sharing.hami.names import PLUGIN_ENV
from amdgpu_virt.sharing.hami.names import plugin_env_clash
from amdgpu_virt.sharing.hami.names import PLUGIN_ENV_PREFIXES
from amdgpu_virt.sharing.hami.names import RESOURCE_GPU
from amdgpu_virt.sharing.hami.names import RESOURCE_GPUCORES
from amdgpu_virt.sharing.hami.names import RESOURCE_GPUMEM
from amdgpu_virt.sharing.hami.names import RESOURCES
from amdgpu_virt.sharing.hami.names import USE_GPU_UUID
from amdgpu_virt.sharing.hami.names import USE_GPUTYPE
from amdgpu_virt.sharing.hami.names import VGPU_NODE
from amdgpu_virt.sharing.hami.names import VGPU_TIME
from amdgpu_virt.sharing.hami.names import WEBHOOK_IGNORE
from amdgpu_virt.sharing.hami.names import WEBHOOK_LABEL
from amdgpu_virt.sharing.hami.percent import cus_to_percent
from amdgpu_virt.sharing.hami.percent import parse_percent
from amdgpu_virt.sharing.hami.percent import percent_to_cus
from amdgpu_virt.sharing.hami.register import decode_node_devices_legacy
from amdgpu_virt.sharing.hami.register import decode_node_register
from amdgpu_virt.sharing.hami.register import device_to_json
from amdgpu_virt.sharing.hami.register import DeviceInfo
from amdgpu_virt.sharing.hami.register import encode_node_devices_legacy
from amdgpu_virt.sharing.hami.register import encode_node_register
from amdgpu_virt.sharing.hami.pods import ContainerDevice
from amdgpu_virt.sharing.hami.pods import decode_cu_allocated
from amdgpu_virt.sharing.hami.pods import decode_one_device
from amdgpu_virt.sharing.hami.pods import decode_pod_devices
from amdgpu_virt.sharing.hami.pods import encode_cu_allocated
from amdgpu_virt.sharing.hami.pods import encode_pod_devices
from amdgpu_virt.sharing.hami.pods import gpu_shapes
from amdgpu_virt.sharing.hami.pods import PodDevices
from amdgpu_virt.sharing.hami.pods import rebuild_allocators
from amdgpu_virt.sharing.hami.lock import BindPhase
from amdgpu_virt.sharing.hami.lock import decode_bind_phase
from amdgpu_virt.sharing.hami.lock import decode_handshake
from amdgpu_virt.sharing.hami.lock import decode_node_lock
from amdgpu_virt.sharing.hami.lock import decode_unix_time
from amdgpu_virt.sharing.hami.lock import encode_node_lock
from amdgpu_virt.sharing.hami.lock import encode_unix_time
from amdgpu_virt.sharing.hami.lock import format_rfc3339
from amdgpu_virt.sharing.hami.lock import Handshake
from amdgpu_virt.sharing.hami.lock import HandshakeState
from amdgpu_virt.sharing.hami.lock import NodeLock
from amdgpu_virt.sharing.hami.lock import parse_rfc3339

__all__ = [
    'ALLOCATION_ANNOTATIONS',
    'ALLOCATION_LABELS',
    'AMD_TYPE_WORD',
    'BIND_PHASE',
    'BIND_TIME',
    'BindPhase',
    'CUSTOMINFO_CU_PER_WGP',
    'CUSTOMINFO_HEALTH_REASON',
    'CUSTOMINFO_PCI_BDF',
    'CU_ALLOCATED',
    'ContainerDevice',
    'DEFAULT_GPU_SCHEDULER_POLICY',
    'DEFAULT_MODE',
    'DEFAULT_NODE_SCHEDULER_POLICY',
    'DEFAULT_SHARE_COUNT',
    'DEVICES_ALLOCATED',
    'DEVICES_TO_ALLOCATE',
    'DeviceInfo',
    'ENV_HIP_DEVICE_MEMORY_LIMIT',
    'ENV_HIP_VISIBLE_DEVICES',
    'ENV_HSA_CU_MASK',
    'ENV_LD_AUDIT',
    'ENV_ROCR_VISIBLE_DEVICES',
    'ENV_ROC_GLOBAL_CU_MASK',
    'GPU_SCHEDULER_POLICIES',
    'GPU_SCHEDULER_POLICY',
    'Handshake',
    'HandshakeState',
    'LD_AUDIT_LIBRARY',
    'NODE_LOCK',
    'NODE_LOCK_TIMEOUT',
    'NODE_REGISTER',
    'NODE_SCHEDULER_POLICIES',
    'NODE_SCHEDULER_POLICY',
    'NOUSE_GPUTYPE',
    'NOUSE_GPU_UUID',
    'NodeLock',
    'PLUGIN_ENV',
    'PLUGIN_ENV_PREFIXES',
    'PodDevices',
    'RESOURCES',
    'RESOURCE_GPU',
    'RESOURCE_GPUCORES',
    'RESOURCE_GPUMEM',
    'USE_GPUTYPE',
    'USE_GPU_UUID',
    'VENDOR',
    'VGPU_NODE',
    'VGPU_TIME',
    'WEBHOOK_IGNORE',
    'WEBHOOK_LABEL',
    'cus_to_percent',
    'decode_bind_phase',
    'decode_cu_allocated',
    'decode_handshake',
    'decode_node_devices_legacy',
    'decode_node_lock',
    'decode_node_register',
    'decode_one_device',
    'decode_pod_devices',
    'decode_unix_time',
    'device_to_json',
    'encode_cu_allocated',
    'encode_node_devices_legacy',
    'encode_node_lock',
    'encode_node_register',
    'encode_pod_devices',
    'encode_unix_time',
    'format_rfc3339',
    'gpu_shapes',
    'is_plugin_env',
    'parse_percent',
    'parse_rfc3339',
    'percent_to_cus',
    'plugin_env_clash',
    'rebuild_allocators',
]
