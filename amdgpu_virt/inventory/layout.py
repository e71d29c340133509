"""Where the kernel shows AMD GPUs in sysfs: paths and file names.

One vocabulary for the reader (:mod:`amdgpu_virt.inventory.sysfs`) and the
writer of simulated hosts (:mod:`amdgpu_virt.inventory.simtree`), so the
two never drift apart. Paths are relative to the sysfs root (``/sys``).
"""

from __future__ import annotations

# --- directories below the sysfs root --------------------------------------

PCI_DEVICES = 'bus/pci/devices'
PCI_DRIVERS = 'bus/pci/drivers'
PCI_BUS = 'bus/pci'
IOMMU_GROUPS = 'kernel/iommu_groups'
DRM_CLASS = 'class/drm'
#: the partition devices 1..7 of a GPU (their ``drm/`` holds the nodes)
PLATFORM_DEVICES = 'devices/platform'
XCP_NAME = 'amdgpu_xcp_%d'
#: older kernels name them so
LEGACY_XCP_NAME = 'amdgpu_xcp.%d'
KFD_CLASS = 'class/kfd/kfd'
KFD_DEVICE = 'devices/virtual/kfd/kfd'
KFD_TOPOLOGY = KFD_DEVICE + '/topology'
KFD_NODES = KFD_CLASS + '/topology/nodes'
GIM_VERSION = 'module/gim/version'

# --- files and links of a PCI function -------------------------------------

VENDOR = 'vendor'
DEVICE = 'device'
SUBSYSTEM_VENDOR = 'subsystem_vendor'
SUBSYSTEM_DEVICE = 'subsystem_device'
CLASS = 'class'
NUMA_NODE = 'numa_node'
SUBSYSTEM = 'subsystem'
DRIVER = 'driver'
IOMMU_GROUP = 'iommu_group'
PHYSFN = 'physfn'
#: ``virtfn<N>`` links of a PF
VIRTFN = 'virtfn'
SRIOV_TOTALVFS = 'sriov_totalvfs'
SRIOV_NUMVFS = 'sriov_numvfs'
SRIOV_OFFSET = 'sriov_offset'
SRIOV_STRIDE = 'sriov_stride'
SRIOV_VF_DEVICE = 'sriov_vf_device'

# --- amdgpu attributes of a PF bound to amdgpu -----------------------------

CURRENT_COMPUTE_PARTITION = 'current_compute_partition'
AVAILABLE_COMPUTE_PARTITION = 'available_compute_partition'
CURRENT_MEMORY_PARTITION = 'current_memory_partition'
AVAILABLE_MEMORY_PARTITION = 'available_memory_partition'
MEM_INFO_VRAM_TOTAL = 'mem_info_vram_total'
UNIQUE_ID = 'unique_id'
PRODUCT_NAME = 'product_name'

# --- DRM -------------------------------------------------------------------

DRM_DIR = 'drm'
CARD = 'card'
RENDER = 'renderD'
#: the DRM node's ``dev`` file: ``major:minor``
DEV = 'dev'
DRM_MAJOR = 226
FIRST_RENDER_MINOR = 128
#: card0 belongs to the onboard VGA controller of the server
FIRST_CARD_MINOR = 1
#: card minors end here: a partition past it gets no DRM nodes
MAX_CARD_MINOR = 63
#: DRM minors a partition-capable GPU reserves on bare metal
MINORS_PER_GPU = 8

# --- KFD topology nodes ----------------------------------------------------

PROPERTIES = 'properties'
#: memory bank 0 of a node, relative to the node
MEM_BANK_PROPERTIES = 'mem_banks/0/properties'
NODE_NAME = 'name'
GPU_ID = 'gpu_id'
GENERATION_ID = 'generation_id'
SYSTEM_PROPERTIES = 'system_properties'
#: SIMDs per CU on every CDNA GPU
SIMD_PER_CU = 4

# --- telemetry and RAS of a PF bound to amdgpu -----------------------------

#: bytes of VRAM in use, ``%llu``
MEM_INFO_VRAM_USED = 'mem_info_vram_used'
#: load of the GPU's cores as the SMU computes it, 0..100
GPU_BUSY_PERCENT = 'gpu_busy_percent'
#: load of the memory controller, 0..100
MEM_BUSY_PERCENT = 'mem_busy_percent'
#: the device's hwmon directory (one ``hwmon<N>`` child)
HWMON_DIR = 'hwmon'
HWMON_CLASS = 'class/hwmon'
HWMON_NAME = 'name'
#: ``temp<N>_input`` (millidegrees Celsius) and ``temp<N>_label``
#: (``edge``, ``junction``, ``mem``): MI300-class GPUs hide temp1 (edge)
TEMP_INPUT = 'temp%d_input'
TEMP_LABEL = 'temp%d_label'
#: socket power in microwatts: MI300-class GPUs have only the
#: instantaneous ``power1_input``, older ones ``power1_average``
POWER_AVERAGE = 'power1_average'
POWER_INPUT = 'power1_input'
#: the RAS directory: ``<block>_err_count`` files (``ue: N``, ``ce: M``,
#: newer kernels ``de: D``) and ``features`` (``feature mask: 0x...``)
RAS_DIR = 'ras'
RAS_COUNT_SUFFIX = '_err_count'
RAS_FEATURES = 'features'

# --- cgroup v2 (below the sysfs root) --------------------------------------

CGROUP_ROOT = 'fs/cgroup'
CGROUP_CONTROLLERS = 'cgroup.controllers'
DMEM_CAPACITY = 'dmem.capacity'
DMEM_CURRENT = 'dmem.current'
DMEM_MAX = 'dmem.max'
#: the dmem region amdgpu registers for a GPU's VRAM
DMEM_VRAM_REGION = 'drm/%s/vram'
