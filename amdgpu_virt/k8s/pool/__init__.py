"""Who uses which GPU on the Kubernetes side, for ``move``, ``audit``,
``status`` and ``plan --running-from``.

Face: :mod:`.consumers` (the one consumer view), :mod:`.side` (the
Kubernetes side of the shared pool), :mod:`.backend` (the ``kubernetes``
backend of ``amdgpu_virt.backends``), :mod:`.running` (holdings for the
planner), :mod:`.claims` (GPUs held through DRA claims) and
:mod:`.nodefacts` (health and memory enforcement the nodes register).
Reads the other components; none of them imports it.
"""

__all__ = ['backend', 'claims', 'consumers', 'nodefacts', 'running', 'side']
