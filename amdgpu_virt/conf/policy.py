"""Options of the ``[policy]`` group: which kind each workload gets."""

from __future__ import annotations

from oslo_config import cfg



def _group() -> cfg.OptGroup:
    return cfg.OptGroup(
        'policy', title='Placement policy',
        help='How amdgpu_virt decides between a dedicated GPU, an SR-IOV VF '
             'and a CU slice for each workload, and plans GPU roles.')


policy_group = _group()

DEFAULT_FILTERS = ['platform', 'isolation', 'p2p', 'size', 'interference',
                   'constraints']
DEFAULT_WEIGHERS = ['stranding', 'role', 'numa', 'interference']

policy_opts: list[cfg.Opt] = [
    cfg.ListOpt('enabled_filters', default=DEFAULT_FILTERS,
                help="""
Filters applied to every workload, in this order; plugins of the
``amdgpu_virt.policy.filters`` namespace. A misspelt name stops the
command with an error naming it.

Possible values:

* platform: VMs get a dedicated GPU or a VF, pods a dedicated GPU or a CU
  slice
* isolation: isolated tenants never get a CU slice (CU masks are not a
  security boundary)
* p2p: multi-GPU workloads that need peer-to-peer DMA get dedicated GPUs
  only (VFs block P2P)
* size: a request larger than one VF is not a VF; a slice larger than
  ``dedicated_threshold`` of a GPU is not a CU slice
* interference: workloads more sensitive than ``cu_max_sensitivity`` get
  no CU slice
* constraints: the workload's model and NUMA constraints

Related options:

* enabled_weighers
"""),
    cfg.ListOpt('enabled_weighers', default=DEFAULT_WEIGHERS,
                help="""
Weighers that score candidate placements; plugins of the
``amdgpu_virt.policy.weighers`` namespace. Each scores in [0, 1] and is
multiplied by its ``*_weight_multiplier``.

Possible values:

* stranding: prefer the kind that leaves the least capacity unusable
* role: prefer GPUs that already play the role the kind needs
* numa: prefer GPUs on one NUMA node
* interference: keep sensitive workloads away from shared GPUs

Related options:

* stranding_weight_multiplier, role_weight_multiplier,
  numa_weight_multiplier, interference_weight_multiplier
"""),
    cfg.FloatOpt('stranding_weight_multiplier', default=1.0, min=0.0,
                 max=100.0, help="""
Multiplier of the ``stranding`` weigher's score (1 - the share of the
granted GPUs, VF or slice the workload leaves unused).

Possible values:

* 0.0 .. 100.0; 0 disables the weigher

Related options:

* enabled_weighers
"""),
    cfg.FloatOpt('role_weight_multiplier', default=0.5, min=0.0, max=100.0,
                 help="""
Multiplier of the ``role`` weigher's score (1 when every GPU already plays
the needed role, 0.5 when GPUs must be converted from unassigned, 0 for a
GPU whose driver would differ from its host's).

Possible values:

* 0.0 .. 100.0; 0 disables the weigher

Related options:

* enabled_weighers, allow_mixed_host_drivers
"""),
    cfg.FloatOpt('numa_weight_multiplier', default=0.25, min=0.0, max=100.0,
                 help="""
Multiplier of the ``numa`` weigher's score (1 when all GPUs of a
placement share one NUMA node).

Possible values:

* 0.0 .. 100.0; 0 disables the weigher

Related options:

* enabled_weighers
"""),
    cfg.FloatOpt('interference_weight_multiplier', default=0.5, min=0.0,
                 max=100.0, help="""
Multiplier of the ``interference`` weigher's score (1 for a dedicated GPU
or a VF; for a CU slice 1, 0.5 or 0 for low, medium or high sensitivity).

Possible values:

* 0.0 .. 100.0; 0 disables the weigher

Related options:

* enabled_weighers, cu_max_sensitivity
"""),
    cfg.FloatOpt('dedicated_threshold', default=0.5, min=0.0, max=1.0,
                 help="""
A workload asking for more than this fraction of one GPU (CUs or memory,
whichever is larger) gets a whole GPU rather than a CU slice: a larger
slice leaves too little for neighbours and suffers most from their
interference.

Possible values:

* 0.0 .. 1.0 (0.5 = more than half a GPU is dedicated)

Related options:

* enabled_filters (size)
"""),
    cfg.StrOpt('cu_max_sensitivity', default='medium',
               choices=[('low', 'only low-sensitivity workloads share'),
                        ('medium', 'low and medium may share'),
                        ('high', 'every workload may share')],
               help="""
The highest interference sensitivity that may still get a CU slice. CU
masks give disjoint CUs, but HBM bandwidth, L2 and MALL stay shared.

Possible values:

* low, medium, high

Related options:

* enabled_filters (interference), interference_weight_multiplier
"""),
    cfg.IntOpt('vf_count', default=8,
               choices=[1, 2, 4, 8],
               help="""
VFs per GPU the planner gives a GPU it turns into ``nova-vf``, when
neither the ledger nor the host's GIM configuration fixes one. A count the
GPU model does not support (the catalog's official VF counts, MI300X 1 or
8) is replaced by the model's largest supported count.

Possible values:

* 1 (SPX), 2 (DPX), 4 (QPX), 8 (CPX: 38 CUs and ~24 GB per VF on MI300X)

Related options:

* none
"""),
    cfg.IntOpt('max_slices_per_gpu', default=10, min=1, max=128,
               help="""
At most this many CU slices share one GPU when the planner places
workloads (HAMi's device plugin advertises 10 per GPU).

Possible values:

* 1 .. 128

Related options:

* [kubernetes] share_count: the slots per GPU the device plugin and node
  agent offer to pods; keep the two equal so that a plan fits the cluster
"""),
    cfg.BoolOpt('allow_mixed_host_drivers', default=False,
                help="""
Allow GPUs of one host to use different driver families: some under AMD's
GIM host driver (``nova-vf``) and others under ``amdgpu`` (``k8s-shared``,
``k8s-dedicated``), using GIM's ``enabled_devices``. Off by default: a
host keeps one family. When on, every decision that relies on it is
marked "unverified on real hardware".

Possible values:

* true, false

Related options:

* role_weight_multiplier
"""),
    cfg.BoolOpt('packing', default=True,
                help="""
Choose among the ``k8s-shared`` devices that fit a CU slice with the
fragmentation-aware score (the one the scheduler extender uses, see
``[scheduler] packing``), measured against the mix of the workloads
planned: the device whose host's expected fragmentation grows least.
Off: the best fit (the device left with the least room).

Possible values:

* true, false

Related options:

* [scheduler] packing
"""),
    cfg.FloatOpt('improve_seconds', default=0.0, min=0.0, max=3600.0,
                 help="""
After the greedy plan, spend at most this many seconds on local moves
that raise the placed priority: a workload left unschedulable takes the
place of lower-priority placements on one host (which are then placed
elsewhere if they fit), only when the priority placed grows. 0 turns the
pass off. Plans are the same on every run as long as the pass ends before
its time (see ``improve_tries``).

Possible values:

* 0 .. 3600 (seconds)

Related options:

* improve_tries
"""),
    cfg.IntOpt('improve_tries', default=4, min=1, max=1000,
               help="""
GPUs the improvement pass tries per unschedulable workload (hosts, for a
workload of several GPUs): those with lower-priority placements that
could serve it, in fleet order.

Possible values:

* 1 .. 1000

Related options:

* improve_seconds
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    # A fresh group object per ConfigOpts: oslo.config copies a registered
    # group shallowly, so sharing one object would share its option
    # state (and overrides) between ConfigOpts instances.
    conf.register_group(_group())
    conf.register_opts(policy_opts, group='policy')


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(policy_group, policy_opts)]
