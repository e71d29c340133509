"""The Dynamic Resource Allocation (DRA) driver for AMD GPUs.

One module per job: :mod:`.devices` (which devices a node offers, in
which order), :mod:`.served` (what the API server keeps of a
ResourceSlice, by release and feature gates), :mod:`.slices`
(ResourceSlices), :mod:`.classes`
(DeviceClasses), :mod:`.publish` (writing slices through the API),
:mod:`.claims` (reading a ResourceClaim's results of this driver),
:mod:`.prepare` (CU ranges and container edits), :mod:`.cdi` (CDI specs),
:mod:`.state` (the durable record of prepared claims), :mod:`.health` and
:mod:`.plugin` (the kubelet gRPC services and registration).
"""

DEFAULT_DRIVER = 'gpu.amd.com'
