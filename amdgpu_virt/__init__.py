"""amdgpu_virt: share AMD Instinct GPUs across OpenStack Nova and Kubernetes."""
