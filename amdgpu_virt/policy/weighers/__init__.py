"""Policy weighers: which candidate placement is best (namespace
``amdgpu_virt.policy.weighers``)."""
