"""The live fleet in one view: ``amdgpu-virt status`` (pure).

:mod:`.view` puts together, per GPU, what the ledger gives it, who uses
it (the running placements the clouds report, as the planner books them),
what is free, its health and memory enforcement as its node registers
them, and the cross-audit's findings; :mod:`.page` writes that view as
one self-contained HTML page. Nothing here talks to an API: the command
(:mod:`amdgpu_virt.cmd.status`) reads the clouds and hands the results
in.
"""

__all__ = ['page', 'view']
