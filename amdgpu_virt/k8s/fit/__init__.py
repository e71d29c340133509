"""Where a pod fits: what it asks, what a node offers and holds (pure).

The face is this package: the names of :mod:`.placement` (the decision,
with the request of :mod:`.request` and the node views of :mod:`.view`),
plus :mod:`.rank` (the packed ranking) and :mod:`.entry` (what the cache
and the consumer view keep of a node and a pod). Plain dicts in, frozen
dataclasses out: no client, no gRPC, no other component.
"""

from amdgpu_virt.k8s.fit.placement import *  # noqa: F403
from amdgpu_virt.k8s.fit.placement import __all__  # noqa: F401
