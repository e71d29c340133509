"""amdgpu_virt: share AMD Instinct GPUs across Nova and Kubernetes."""
