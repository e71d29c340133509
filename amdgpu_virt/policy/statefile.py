"""The state file of incremental planning: a ledger plus placements.

``amdgpu-virt plan --output-ledger FILE`` writes the GPU roles (the
:mod:`~amdgpu_virt.ledger` format) and, under ``placements``, what each
placed workload holds; ``--ledger FILE`` reads both back, so that a new
plan keeps them::

    version: 1
    hosts: {...}
    placements:
      - workload: tenant-vm-1
        kind: vf
        host: gim-0
        grants: [{address: "0000:85:00.0", vf: 0, memory_mib: 20480,
                  compute_units: 38}]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.model import Kind
from amdgpu_virt.policy.decision import Code
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import Grant
from amdgpu_virt.policy.decision import parse_cu_ranges


def placements_from_dict(raw: Any, source: str) -> list[Decision]:
    """Running placements of a state file's ``placements`` list.

    :raises PlanError: naming the file, the entry and the field.
    """
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise exception.PlanError(source=source,
                                  reason='placements must be a list')
    result = []
    for i, entry in enumerate(raw):
        where = '%s: placements[%d]' % (source, i)
        if not isinstance(entry, Mapping):
            raise exception.PlanError(source=where,
                                      reason='expected a mapping')
        try:
            kind = Kind(entry.get('kind'))
        except ValueError:
            raise exception.PlanError(
                source=where, reason='kind %r is not one of %s' % (
                    entry.get('kind'), ', '.join(k.value for k in Kind))
            ) from None
        grants = []
        for j, g in enumerate(entry.get('grants') or []):
            gwhere = '%s.grants[%d]' % (where, j)
            if not isinstance(g, Mapping) or 'address' not in g:
                raise exception.PlanError(source=gwhere,
                                          reason='expected a mapping with '
                                          'an address')
            try:
                cus = (None if g.get('cus') is None else
                       parse_cu_ranges(str(g['cus'])))
                grants.append(Grant(
                    address=str(g['address']),
                    memory_mib=int(g.get('memory_mib', 0)),
                    compute_units=int(g.get('compute_units', 0)),
                    vf_index=(None if g.get('vf') is None
                              else int(g['vf'])),
                    cus=cus,
                    partition=(None if g.get('partition') is None
                               else int(g['partition']))))
            except (TypeError, ValueError) as err:
                raise exception.PlanError(source=gwhere,
                                          reason=str(err)) from None
        if not grants or not entry.get('workload') or not entry.get('host'):
            raise exception.PlanError(source=where, reason='workload, host '
                                      'and grants are required')
        result.append(Decision(
            workload=str(entry['workload']), code=Code.PLACED,
            reason='running (kept from the ledger)', kind=kind,
            host=str(entry['host']), grants=tuple(grants), existing=True))
    return result


def load_state(data: Any, source: str
               ) -> tuple[av_ledger.Ledger, list[Decision]]:
    """The ledger and running placements of a state file's content."""
    ledger = av_ledger.from_dict(data, source=source)
    placements = placements_from_dict(
        data.get('placements') if isinstance(data, Mapping) else None,
        source)
    return ledger, placements
