"""Options of the ``[nova]`` group: Nova PCI passthrough and Placement."""

from __future__ import annotations

from oslo_config import cfg

nova_group = cfg.OptGroup(
    'nova', title='OpenStack Nova',
    help='How amdgpu_virt renders Nova PCI passthrough configuration, '
         'GIM host configuration and flavors, and how it reads Placement.')

NUMA_POLICIES = ('required', 'legacy', 'preferred', 'socket')

nova_opts: list[cfg.Opt] = [
    cfg.StrOpt('cloud',
               help="""
Name of the cloud in ``clouds.yaml`` used by ``nova flavors``, ``nova audit``
and ``nova drain-check``.

Possible values:

* a cloud name known to openstacksdk
* unset: use ``placement_endpoint``/``compute_endpoint`` and ``token``

Related options:

* placement_endpoint, compute_endpoint, token
"""),
    cfg.URIOpt('placement_endpoint', schemes=['http', 'https'],
               help="""
Placement API URL, used with ``token`` when ``cloud`` is unset (admin token
authentication, no Keystone catalog).

Related options:

* cloud, token
"""),
    cfg.URIOpt('compute_endpoint', schemes=['http', 'https'],
               help="""
Nova compute API URL (``.../v2.1``), used with ``token`` when ``cloud`` is
unset.

Related options:

* cloud, token
"""),
    cfg.StrOpt('token', secret=True,
               help="""
Token sent as ``X-Auth-Token`` to ``placement_endpoint`` and
``compute_endpoint``.

Related options:

* cloud
"""),
    cfg.StrOpt('vf_resource_class_template',
               default='CUSTOM_AMD_{model}_{compute_mode}_VF',
               help="""
Placement resource class of the VFs of one GIM GPU. Fields: ``{model}``
(catalog name, upper case, non alphanumerics replaced by ``_``, e.g.
``MI300X``, ``MI300X_HF``), ``{compute_mode}`` (``SPX``/``DPX``/``QPX``/
``CPX``, implied by the VF count), ``{memory_mode}`` (``NPS1``...),
``{vf_count}``. The result must match ``^CUSTOM_[A-Z0-9_]+$`` and be at most
255 characters.

Related options:

* dedicated_resource_class_template, trait_prefix
"""),
    cfg.StrOpt('dedicated_resource_class_template',
               default='CUSTOM_AMD_{model}',
               help="""
Placement resource class of a whole GPU passed through with vfio-pci. Field:
``{model}``. Must match ``^CUSTOM_[A-Z0-9_]+$``.

Related options:

* vf_resource_class_template
"""),
    cfg.StrOpt('trait_prefix', default='CUSTOM_AMD_',
               help="""
Prefix of the traits put on every GPU provider: ``<prefix>MODEL_<MODEL>``,
``<prefix>PARTITION_<MODE>`` and ``<prefix>MEMORY_<NPS>`` (VFs only).
Must start with ``CUSTOM_``.

Related options:

* vf_resource_class_template
"""),
    cfg.StrOpt('vf_alias_template', default='amd-{model}-{compute_mode}-vf',
               help="""
Name of the ``[pci] alias`` for the VFs of one class. Same fields as
``vf_resource_class_template``, lower case. Flavors request it as
``pci_passthrough:alias=<name>:<count>``.

Related options:

* dedicated_alias_template
"""),
    cfg.StrOpt('dedicated_alias_template', default='amd-{model}',
               help="""
Name of the ``[pci] alias`` for whole GPUs of one model.

Related options:

* vf_alias_template
"""),
    cfg.StrOpt('numa_policy', default='preferred', choices=NUMA_POLICIES,
               help="""
``numa_policy`` of every rendered alias and default
``hw:pci_numa_affinity_policy`` of flavors.

Possible values:

* required: the device must be on the instance's NUMA node
* legacy: like required when NUMA information is known
* preferred: try to, but schedule anyway
* socket: same socket

Related options:

* flavors_file
"""),
    cfg.StrOpt('dedicated_device_type', default='auto',
               choices=['auto', 'type-PF', 'type-PCI'],
               help="""
Nova device type (alias ``device_type``) of a whole GPU.

Possible values:

* auto: what nova-compute reports for the device: ``type-PF`` when the
  host's ``sriov_totalvfs`` is above 0 (libvirt reports the SR-IOV
  capability even with no VF enabled), ``type-PCI`` otherwise. Rendering
  from the ledger alone (``nova aliases --ledger``, ``nova audit --ledger``)
  cannot read the host and uses ``type-PF`` for models with SR-IOV.
* type-PF, type-PCI: force one type; ``nova audit`` reports a GPU whose
  host says otherwise (``wrong-device-type``), since Nova would never
  match the alias to it.
"""),
    cfg.BoolOpt('per_gpu_traits', default=True,
                help="""
Put a per-GPU trait ``<trait_prefix>GPU_<n>`` on every GPU provider (``n``
is the GPU's rank by PCI address among the host's AMD GPUs, from 0) and
render, next to every alias, per-GPU aliases ``<alias>-gpu<n>`` requiring
it. A flavor with ``gpus`` in ``flavors_file`` asks one alias per GPU, so
every request group Nova sends Placement matches exactly one provider of a
host: 8, 16 or 32 VFs on 8 GPUs get allocation candidates at once, where
the plain alias makes Placement enumerate every combination of identical
providers and never answer. The per-GPU aliases only tell GPUs apart with
``[filter_scheduler] pci_in_placement = True``.

Possible values:

* True: per-GPU traits and aliases (default)
* False: no per-GPU trait or alias; ``nova flavors`` refuses flavors
  with ``gpus``

Related options:

* trait_prefix, flavors_file
"""),
    cfg.BoolOpt('managed', default=False,
                help="""
Value of the ``managed`` tag of rendered device specs. False (the default)
tells libvirt not to detach/reattach the device from its host driver: the
devices are bound to vfio-pci at boot, and rebinding an AMD VF or PF at
runtime is known to hang hosts.
"""),
    cfg.DictOpt('extra_spec_tags', default={},
                help="""
Extra tags added to every rendered ``device_spec`` (e.g. ``live_migratable:
false``). Keys are checked against the keys Nova knows; a misspelt key is
an error, since Nova would silently ignore it.
"""),
    cfg.StrOpt('flavors_file',
               help="""
YAML file defining the flavors ``nova flavors`` creates or updates. Format::

    flavors:
      - name: gpu.mi300x.cpx.1
        vcpus: 16
        ram_mib: 131072
        disk_gb: 100
        alias: amd-mi300x-cpx-vf
        count: 1
        numa_policy: preferred   # optional
        isolate: false           # optional: group_policy=isolate
        # gpus: 8                # optional: count spread over GPUs 0..7
        extra_specs: {}          # optional

``disk_gb`` must be above 0 (Nova's default policy
``os_compute_api:servers:create:zero_disk_flavor`` lets only admins boot a
disk 0 flavor from an image; ``nova flavors --allow-zero-disk`` accepts
it). ``gpus`` asks through the per-GPU aliases (``per_gpu_traits``).

Related options:

* numa_policy, per_gpu_traits
"""),
    cfg.StrOpt('output_dir', default='/etc/nova/nova.conf.d',
               help="""
Directory ``nova config`` writes ``amdgpu-virt-pci.conf`` to when no
``--output`` is given.
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(nova_group)
    conf.register_opts(nova_opts, group=nova_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(nova_group, nova_opts)]
