"""Who uses which GPU on the Kubernetes side, for ``move``, ``audit`` and
``plan --running-from``.

Face: :mod:`.consumers` (the one consumer view), :mod:`.side` (the
Kubernetes side of the shared pool), :mod:`.backend` (the ``kubernetes``
backend of ``amdgpu_virt.backends``), :mod:`.running` (holdings for the
planner) and :mod:`.claims` (GPUs held through DRA claims). Reads the
other components; none of them imports it.
"""

__all__ = ['backend', 'claims', 'consumers', 'running', 'side']
