"""Options of the ``[dra]`` group: the Dynamic Resource Allocation driver.

The DRA kubelet plugin (``amdgpu-virt k8s dra-plugin``) publishes this
node's GPUs as ResourceSlices, and prepares the devices the kube-scheduler
allocated to ResourceClaims (CDI specs, CU masks, memory limits).
"""

from __future__ import annotations

from oslo_config import cfg

dra_group = cfg.OptGroup(
    'dra', title='Dynamic Resource Allocation driver',
    help='The DRA kubelet plugin: ResourceSlices of the node, prepare and '
         'unprepare of ResourceClaims, CDI specs.')

DNS_SUBDOMAIN = (r'^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?'
                 r'(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')

dra_opts: list[cfg.Opt] = [
    cfg.StrOpt('driver_name', default='gpu.amd.com', regex=DNS_SUBDOMAIN,
               help="""
Name of the DRA driver: the ``driver`` of every ResourceSlice and claim
result, the registration name with kubelet, the attribute domain
(``device.attributes["<driver_name>"]``) and the base of the DeviceClass
names (``<driver_name>``, ``partition.<driver_name>``,
``share.<driver_name>``). The CDI vendor is ``k8s.<driver_name>``.

Possible values:

* a DNS subdomain of at most 63 characters; ``gpu.amd.com`` (default)

Related options:

* plugin_dir
"""),
    cfg.StrOpt('plugin', default='kubelet',
               help="""
The DRA plugin implementation, a plugin of the ``amdgpu_virt.k8s.dra``
namespace.

Possible values:

* kubelet: (default) the kubelet plugin over gRPC unix sockets
* the name of any other plugin registered in that namespace
"""),
    cfg.StrOpt('registration_dir', default='/var/lib/kubelet/plugins_registry',
               help="""
Directory kubelet watches for plugin registration sockets.

Possible values:

* an absolute path; kubelet's default is /var/lib/kubelet/plugins_registry

Related options:

* plugin_dir, pod_uid
"""),
    cfg.StrOpt('plugin_dir', default='',
               help="""
Directory of the DRA service socket (``dra.sock``) and of the state file.

Possible values:

* empty: (default) ``/var/lib/kubelet/plugins/<driver_name>``
* an absolute path

Related options:

* driver_name, state_file, pod_uid
"""),
    cfg.StrOpt('pod_uid', default='',
               help="""
UID of the plugin's own pod. When set, the sockets are named after it
(``dra-<uid>.sock`` and ``<driver_name>-<uid>-reg.sock``), so that a
rolling update with ``maxSurge`` can run two plugin pods on one node
without removing each other's sockets.

Possible values:

* empty: (default) ``dra.sock`` and ``<driver_name>-reg.sock``
* the pod UID, from the downward API (``metadata.uid``)

Related options:

* registration_dir, plugin_dir
"""),
    cfg.StrOpt('cdi_dir', default='/var/run/cdi',
               help="""
Directory of the transient CDI specs written on prepare (one per claim).
It is tmpfs on most hosts, so the specs vanish on reboot; the plugin
writes the spec again on every prepare.

Possible values:

* an absolute path the container runtime scans for CDI specs
"""),
    cfg.StrOpt('state_file', default='',
               help="""
The durable record of prepared claims (CU masks of every share), written
atomically on every prepare and unprepare, so that a restart of the plugin
or the node loses nothing and never hands out overlapping CUs.

Possible values:

* empty: (default) ``state.json`` in plugin_dir
* an absolute path on a persistent disk

Related options:

* plugin_dir
"""),
    cfg.BoolOpt('partition_devices', default=True,
                help="""
Publish the compute partitions (DPX/QPX/CPX) of partitioned GPUs as
devices consuming shared counters of their GPU, beside the whole GPU.
The counters need the DRAPartitionableDevices feature (beta, on by
default from Kubernetes 1.36); the plugin learns whether the API server
keeps them, and where it does not, a partitioned GPU is published as
partitions_without_counters says.

Possible values:

* true: (default) whole GPUs and their partitions
* false: whole GPUs only

Related options:

* partitions_without_counters
"""),
    cfg.StrOpt('partitions_without_counters', default='whole',
               choices=[
                   ('whole', 'the whole GPU only: partitions are not '
                    'offered'),
                   ('partitions', 'its partitions only, each an exclusive '
                    'device, and no whole-GPU device: a claim takes a '
                    'whole GPU as all of its partitions (count and '
                    'matchAttribute pciAddress)')],
               help="""
How a partitioned (DPX/QPX/CPX) k8s-dedicated GPU is published on an API
server that does not keep shared counters (DRAPartitionableDevices off,
the default of Kubernetes 1.34 and 1.35). Without counters nothing keeps
a whole GPU and its partitions from being allocated at once, so each
partitioned GPU is published in one form only.

Related options:

* partition_devices (false: whole GPUs everywhere)
"""),
    cfg.StrOpt('slice_layout', default='auto',
               choices=[
                   ('auto', 'by the API server\'s version (its /version '
                    'endpoint, read before every publish): mixed below '
                    '1.35, separate from 1.35 on'),
                   ('mixed', 'each GPU\'s counter set in the slice of the '
                    'devices that consume it: what Kubernetes 1.34 '
                    'accepts'),
                   ('separate', 'counter sets in slices of their own, '
                    'devices in others: what Kubernetes 1.35 and later '
                    'accept')],
               help="""
Where the shared counters of partitioned GPUs are published. Kubernetes
1.34 looks up a device's counter set only in the device's own
ResourceSlice; 1.35 and later refuse a slice that holds both devices and
counter sets. When the layout changes (the API server was upgraded or
downgraded, or this option changed), the node's slices of the other
layout are deleted before the new ones are written.

Related options:

* partition_devices (without partitions there are no counters)
* probe_interval
"""),
    cfg.IntOpt('probe_interval', default=600, min=0, max=86400,
               help="""
Seconds after which the plugin asks the API server again which
ResourceSlice fields it keeps (a server-side dry-run create of a probe
slice: nothing is stored). Fields of feature gates that are off are
dropped silently, so the plugin publishes only what the server keeps:
whole GPUs always, partitions with counters where DRAPartitionableDevices
is on, shares where DRAConsumableCapacity is on. It also asks at start,
when the API server's version changes, and when a write shows a field
dropped (then it writes the slices again without what was dropped at
once). A dry-run refused (an admission webhook without dry-run support)
falls back to the defaults of the server's release.

Possible values:

* 0: only at start and on those events
* 1..86400 seconds; 600 (default)

Related options:

* publish_interval, slice_layout, partitions_without_counters
"""),
    cfg.IntOpt('memory_step_mib', default=256, min=1, max=65536,
               help="""
Granularity of the ``memory`` capacity of shared GPUs: the
``requestPolicy`` ``validRange.step`` (and minimum). The allocator rounds
a requested amount up to a multiple of it.

Possible values:

* 1..65536 MiB; 256 (default)

Related options:

* none
"""),
    cfg.StrOpt('extended_resource_name', default='',
               help="""
``extendedResourceName`` of the whole-GPU DeviceClass that ``k8s
dra-slices --classes`` renders: pods asking for this extended resource in
``resources`` are served through DRA (DRAExtendedResource, beta from
Kubernetes 1.36). Do not use the name the device plugin registers on the
same nodes.

Possible values:

* empty: (default) no mapping
* an extended resource name, e.g. ``amd.com/gpu``
"""),
    cfg.IntOpt('publish_interval', default=30, min=1, max=3600,
               help="""
Seconds between two reads of the role ledger and the GPU health; the
ResourceSlices are rewritten (with a new pool generation) only when what
the node offers changed.

Possible values:

* 1..3600; 30 (default)
"""),
    cfg.IntOpt('health_timeout', default=90, min=1, max=3600,
               help="""
``health_check_timeout_seconds`` sent with every device's health: kubelet
marks a device Unknown when no new health arrives within it.

Possible values:

* 1..3600 seconds; 90 (default)

Related options:

* publish_interval (must be shorter)
"""),
    cfg.StrOpt('dmem_hook', default='',
               help="""
Host path of the ``amdgpu-virt`` command that CDI specs name as the
``createRuntime`` hook of a share: the container runtime runs it after it
created the container's cgroup and before the container's process runs,
with the container's OCI state on standard input; it writes the share's
VRAM cap (``dmem.max``) on the container's cgroup, and fails the
container's creation when it cannot. It runs on the host, in the
runtime's namespaces, so the command must be installed on the host.

Possible values:

* empty (default): no hook; shares are capped by the LD_AUDIT hook only
  (their devices say ``memoryEnforcement: hook``)
* an absolute path, e.g. /usr/local/bin/amdgpu-virt; used only on nodes
  whose kernel has the dmem controller and a VRAM region for the GPU

Related options:

* dmem_hook_root
* [kubernetes] memory_enforcement, cgroup_root
"""),
    cfg.StrOpt('dmem_hook_root', default='/',
               help="""
Root under which the ``createRuntime`` hook finds ``proc/<pid>/cgroup``
and ``sys/fs/cgroup`` of the host (the hook runs on the host).

Possible values:

* ``/`` on a node
* another directory holding proc/ and sys/fs/cgroup (tests)

Related options:

* dmem_hook
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(dra_group)
    conf.register_opts(dra_opts, group=dra_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(dra_group, dra_opts)]
