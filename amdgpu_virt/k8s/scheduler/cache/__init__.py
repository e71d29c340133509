"""The extender's in-memory view of the cluster's AMD GPUs.

Face: :mod:`.cluster` (:class:`~.cluster.ClusterCache`) and
:mod:`.watching` (the list-and-watch threads that feed it). Inside:
:mod:`.pages` (typed list pages), :mod:`.views` (node views for a whole
cluster), :mod:`.index` (bucketed node indexes) and :mod:`.pack` (the
packed decision over the indexes).
"""

__all__ = ['cluster', 'watching']
