"""Policy filters: which kinds a workload may get (namespace
``amdgpu_virt.policy.filters``)."""
