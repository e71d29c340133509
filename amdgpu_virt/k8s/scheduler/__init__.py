"""The kube-scheduler extender: ``/filter``, ``/prioritize``, ``/bind``.

Face: :mod:`.service` (the service the ``k8s scheduler`` command runs).
Inside: :mod:`.core` (the decisions), :mod:`.handler` (HTTP),
:mod:`.metrics`, :mod:`.bookings` (what a decision writes, and its undo),
:mod:`.fencing` (the leader lease) and :mod:`.cache` (the cluster view fed
by the watchers). Imported by the command only.
"""

__all__ = ['service']
