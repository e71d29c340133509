"""The state the scheduler side, the node side and ``apply`` share in the API.

Face: :mod:`.allocation` (the allocation record, pure), :mod:`.store`
(reading and replacing records), :mod:`.sweep` (removing bookings of pods
that are gone), :mod:`.nodelock` (HAMi's node lock and the UID beside it)
and :mod:`.ledgermap` (the role ledger as a ConfigMap). Imports
:mod:`amdgpu_virt.k8s.api` only.
"""

__all__ = ['allocation', 'ledgermap', 'nodelock', 'store', 'sweep']
