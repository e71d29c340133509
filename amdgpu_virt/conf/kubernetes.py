"""Options of the ``[kubernetes]`` group.

They configure the Kubernetes side: the kubelet device plugin, the
admission webhook, the node agent and the scheduler extender.
"""

from __future__ import annotations

from oslo_config import cfg

kubernetes_group = cfg.OptGroup(
    'kubernetes', title='Kubernetes',
    help='The device plugin, admission webhook, node agent and scheduler '
         'extender that expose AMD GPUs to Kubernetes.')

kubernetes_opts: list[cfg.Opt] = [
    cfg.StrOpt(
        'kubeconfig',
        help='Path of a kubeconfig file for talking to the API server.\n\n'
             'Possible values:\n\n'
             '* unset: use the in-cluster service account (the normal case '
             'in a pod)\n'
             '* a path to a kubeconfig file (for running outside a '
             'cluster)\n'),
    cfg.StrOpt(
        'node_name',
        help='Name of the Kubernetes node this process runs on.\n\n'
             'Possible values:\n\n'
             '* unset: read the NODE_NAME environment variable (set from '
             'the downward API by the DaemonSet)\n'
             '* a node name\n'),
    cfg.StrOpt(
        'namespace', default='amdgpu-virt',
        regex=r'^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$',
        help='The project\'s namespace: it holds the allocation records '
             '(ConfigMaps amdgpu-virt-alloc-<node>, written by the '
             'scheduler extender, read by the device plugin) and the '
             'kube-scheduler leader Lease.\n\n'
             'Possible values:\n\n'
             '* the Helm release namespace\n\n'
             'Related options:\n\n'
             '* [scheduler] leader_lease\n'),
    cfg.StrOpt(
        'resource_name', default='amd.com/gpu',
        regex=r'^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*'
              r'[A-Za-z0-9])?$',
        help='Extended resource the device plugin registers with kubelet.'
             '\n\nPossible values:\n\n'
             '* a vendor-qualified resource name; ``amd.com/gpu`` is what '
             'HAMi and its users expect\n'),
    cfg.StrOpt(
        'device_plugin_dir', default='/var/lib/kubelet/device-plugins/',
        help='Directory holding kubelet.sock and the device plugin '
             'sockets.\n\n'
             'Possible values:\n\n'
             "* an absolute path; kubelet's default is "
             '/var/lib/kubelet/device-plugins/\n\n'
             'Related options:\n\n'
             '* device_plugin_socket\n'),
    cfg.StrOpt(
        'device_plugin_socket', default='amdgpu-virt.sock',
        regex=r'^[A-Za-z0-9_.-]+\.sock$',
        help='File name of the device plugin socket inside '
             'device_plugin_dir.\n\n'
             'Possible values:\n\n'
             '* a file name ending in .sock, unique in the directory\n\n'
             'Related options:\n\n'
             '* device_plugin_dir\n'),
    cfg.IntOpt(
        'share_count', default=10, min=1, max=100,
        help='Number of device plugin slots (pods) each GPU offers.\n\n'
             'Possible values:\n\n'
             '* 1: one pod per GPU (whole GPUs only)\n'
             '* 2-100: up to this many pods share a GPU; HAMi uses 10 and '
             'publishes it as ``count`` in the node registration\n\n'
             'Related options:\n\n'
             '* [policy] max_slices_per_gpu: the slices per GPU the planner '
             'places; keep the two equal\n'
             '* allocation_mode (use 1 with ``whole``)\n'),
    cfg.StrOpt(
        'allocation_mode', default='hami', choices=[
            ('hami', 'the GPUs, CU counts and memory of each container come '
                     'from the HAMi annotations the scheduler extender '
                     'wrote on its pod; shared GPUs get HSA_CU_MASK, memory '
                     'limits and the LD_AUDIT library'),
            ('whole', 'every device ID kubelet allocates names a distinct '
                      'whole GPU; no API access (no extender needed)')],
        help='How the device plugin answers kubelet\'s Allocate.\n\n'
             'Related options:\n\n'
             '* share_count (use 1 with ``whole``)\n'
             '* vgpu_library\n'
             '* [sharing] cu_strategy\n'),
    cfg.StrOpt(
        'vgpu_library', default='/usr/local/vgpu/libamvgpu.so',
        help='Host path of the LD_AUDIT library that enforces memory limits '
             'in containers on a shared GPU; it is mounted read-only at '
             'the same path and named in LD_AUDIT. At start-up the node '
             'agent and the device plugin check that it is a loadable ELF '
             'shared object for this host; when it is not (missing, '
             'truncated, a text file, a FIFO...), the node offers whole '
             'GPUs only (one slot per GPU, as share_count = 1), the agent '
             'labels the node amdgpu-virt.io/memory-hook=unavailable and '
             'records a Warning event MemoryHookUnavailable naming the '
             'path and the reason; install it (``amdgpu-virt k8s '
             'install-hook``, which the chart\'s init containers run) and '
             'restart the pods to share GPUs.\n\n'
             'Possible values:\n\n'
             '* an absolute path; HAMi and the chart install it at '
             '/usr/local/vgpu/libamvgpu.so\n\n'
             'Related options:\n\n'
             '* allocation_mode (only ``hami`` needs it)\n'
             '* share_count\n'),
    cfg.StrOpt(
        'memory_enforcement', default='kernel-or-hook', choices=[
            ('kernel-or-hook', 'a GPU offers slices when the kernel (dmem '
                               'cgroup) or the LD_AUDIT hook caps their '
                               'VRAM'),
            ('kernel', 'only where the kernel caps VRAM: every process of '
                       'a slice is bound, static and musl binaries '
                       'included'),
            ('hook', 'only where the LD_AUDIT hook library is usable (the '
                     'behaviour before kernel caps)'),
            ('kernel-and-hook', 'only where both are in place'),
            ('none', 'always: slice memory limits are advisory where '
                     'nothing enforces them')],
        help='What a node needs before its GPUs offer CU slices. Each GPU '
             'has a memory enforcement level: ``kernel`` (the dmem cgroup '
             'controller of Linux 6.14+ caps the slice\'s VRAM; the device '
             'plugin writes the cap on the pod cgroup in PreStartContainer, '
             'the DRA driver through a CDI createRuntime hook), ``hook`` '
             '(the LD_AUDIT library vgpu_library is usable), '
             '``kernel+hook`` or ``none``. A node whose GPUs do not all '
             'meet this requirement offers whole GPUs only (one slot per '
             'GPU) and says why in its log and in a Warning Event '
             'MemoryEnforcementInsufficient on its Node. The level is '
             'published in the node registration (custominfo '
             'memoryEnforcement), the node label '
             'amdgpu-virt.io/memory-enforcement (the weakest level, '
             '``kernel-hook`` for ``kernel+hook``) and the DRA devices\' '
             'attribute memoryEnforcement.\n\n'
             'Related options:\n\n'
             '* vgpu_library\n'
             '* cgroup_root, cgroup_driver, kubelet_cgroup_root\n'
             '* share_count\n'),
    cfg.StrOpt(
        'cgroup_root', default='/sys/fs/cgroup',
        help='Where the node\'s cgroup v2 hierarchy is mounted in this '
             'process: the node agent reads the dmem controller\'s regions '
             '(dmem.capacity) there, the device plugin writes the VRAM caps '
             '(dmem.max) of pods; the DRA plugin reads it to decide whether '
             'its shares get the kernel cap. Nothing below it is followed '
             'through a symbolic link.\n\n'
             'Possible values:\n\n'
             '* /sys/fs/cgroup on the node itself\n'
             '* the host\'s /sys/fs/cgroup mounted into the pod (the chart '
             'mounts it at /host/cgroup, writable for the device plugin); '
             'a pod\'s own /sys/fs/cgroup shows only its own cgroup\n\n'
             'Related options:\n\n'
             '* memory_enforcement\n'
             '* cgroup_driver\n'),
    cfg.StrOpt(
        'cgroup_driver', default='auto', choices=[
            ('auto', 'whichever of kubepods.slice and kubepods exists below '
                     'kubelet_cgroup_root'),
            ('systemd', 'kubelet runs with --cgroup-driver=systemd '
                        '(kubepods.slice/kubepods-<qos>.slice/'
                        'kubepods-<qos>-pod<uid>.slice)'),
            ('cgroupfs', 'kubelet runs with --cgroup-driver=cgroupfs '
                         '(kubepods/<qos>/pod<uid>)')],
        help='kubelet\'s cgroup driver, which names the pod cgroups the '
             'device plugin caps.\n\n'
             'Related options:\n\n'
             '* kubelet_cgroup_root\n'
             '* cgroup_root\n'),
    cfg.StrOpt(
        'kubelet_cgroup_root', default='/',
        regex=r'^/([A-Za-z0-9_.:@+]+(/[A-Za-z0-9_.:@+]+)*)?$',
        help='kubelet\'s --cgroup-root: the cgroup its kubepods cgroup is '
             'made in.\n\n'
             'Possible values:\n\n'
             '* / (kubelet\'s default)\n'
             '* another cgroup, e.g. /kubelet (kind nodes: '
             'kubelet.slice/kubelet-kubepods.slice)\n\n'
             'Related options:\n\n'
             '* cgroup_driver\n'),
    cfg.FloatOpt(
        'kubelet_poll_interval', default=1.0, min=0.05, max=60.0,
        help='Seconds between checks that kubelet.sock is unchanged (a '
             'kubelet restart recreates it and the plugin must register '
             'again) and between device health checks.\n\n'
             'Possible values:\n\n'
             '* 0.05 to 60 seconds\n'),
    cfg.FloatOpt(
        'registration_interval', default=30.0, min=1.0, max=3600.0,
        help='Seconds between checks of the node registration '
             '(hami.io/node-amd-register) by the node agent; it is '
             'written only when it changed.\n\n'
             'Possible values:\n\n'
             '* 1 to 3600 seconds; HAMi re-registers every 30\n\n'
             'Related options:\n\n'
             '* ledger_source (the ledger is read again at this '
             'interval)\n'),
    cfg.BoolOpt(
        'node_labels', default=True,
        help='Whether the node agent keeps labels compatible with AMD\'s '
             'Kubernetes node labeller (amd.com/gpu.product-name, '
             '.device-id, .family, .vram, .cu-count, .simd-count, '
             '.compute-memory-partition, .compute-partitioning-supported, '
             '.memory-partitioning-supported, .mode, and the counted '
             'beta.amd.com/gpu.* labels) for the GPUs it registers. '
             'Labels it no longer needs are removed.\n\n'
             'Possible values:\n\n'
             '* true: label the node (default)\n'
             '* false: leave labels alone, e.g. when AMD\'s labeller runs '
             'on the same node\n\n'
             'Related options:\n\n'
             '* registration_interval\n'),
    cfg.StrOpt(
        'ledger_source', default='none', choices=[
            ('none', 'no ledger: the node agent registers and the device '
                     'plugin offers every GPU amdgpu drives'),
            ('configmap', 'read the role ledger from the ConfigMap [pool] '
                          'configmap_namespace/configmap_name through the '
                          'API'),
            ('file', 'read the role ledger from ledger_file (e.g. the '
                     'ConfigMap mounted as a volume)')],
        help='Where the node agent and the device plugin read the role '
             'ledger. With a source, they offer only the GPUs whose role on '
             'this node (node_name) is k8s-shared or k8s-dedicated, and '
             'read the ledger again every registration_interval seconds: '
             'the agent drops the other GPUs from hami.io/node-amd-register '
             'and the device plugin reports them unhealthy. A missing or '
             'malformed ledger is logged and the last good one is kept; '
             'until a first good ledger is read, no GPU is offered.\n\n'
             'Related options:\n\n'
             '* ledger_file\n'
             '* registration_interval\n'
             '* [pool] configmap_namespace, configmap_name\n'),
    cfg.StrOpt(
        'ledger_file',
        help='Path of the role ledger YAML when ledger_source is ``file``.'
             '\n\nPossible values:\n\n'
             '* unset (required when ledger_source is ``file``)\n'
             '* a path, usually the key ledger.yaml of the ledger ConfigMap '
             'mounted into the pod\n\n'
             'Related options:\n\n'
             '* ledger_source\n'),
    cfg.StrOpt(
        'device_root', default='/',
        help='Root under which the device nodes /dev/kfd and /dev/dri/* '
             'are checked for health.\n\n'
             'Possible values:\n\n'
             '* ``/`` on a node\n'
             '* another directory holding dev/kfd and dev/dri/* (tests, '
             'a chroot)\n'),
    cfg.StrOpt(
        'scheduler_name', default='amdgpu-virt-scheduler',
        help='Scheduler the admission webhook assigns to pods that request '
             'AMD GPU resources.\n\n'
             'Possible values:\n\n'
             '* the name of the kube-scheduler profile that runs the '
             'amdgpu-virt extender\n\n'
             'Related options:\n\n'
             '* webhook_managed_resources\n'),
    cfg.ListOpt(
        'webhook_managed_resources',
        default=['amd.com/gpu', 'amd.com/gpumem', 'amd.com/gpucores'],
        help='Resources whose presence in a container limit makes the '
             'webhook handle the pod.\n\n'
             'Possible values:\n\n'
             '* a list of extended resource names\n\n'
             'Related options:\n\n'
             '* scheduler_name\n'),
    cfg.StrOpt(
        'isolated_namespace_label', default='amdgpu-virt.io/tenancy=isolated',
        regex=r'^[A-Za-z0-9_./-]+=[A-Za-z0-9_.-]*$',
        help='Namespace label (key=value) marking namespaces whose pods may '
             'only get whole GPUs: CU masks are cooperative, not a security '
             'boundary, so such tenants are never co-located on a GPU.\n\n'
             'Possible values:\n\n'
             '* ``key=value``\n'),
    cfg.ListOpt(
        'webhook_exempt_namespaces', default=[],
        help='Namespaces whose pods the admission webhook lets through '
             'unchecked. The only exemption there is: nothing a pod '
             'carries (HAMi\'s hami.io/webhook: ignore label included) '
             'makes the webhook skip it. Prefer excluding such namespaces '
             'with the webhook configuration\'s namespaceSelector as '
             'well, so that the API server does not call the webhook for '
             'them at all.\n\n'
             'Possible values:\n\n'
             '* empty (default): every namespace is checked\n'
             '* namespace names only an administrator controls (for '
             'example kube-system)\n\n'
             'Related options:\n\n'
             '* webhook_allocation_writers\n'),
    cfg.ListOpt(
        'webhook_allocation_writers',
        default=['system:serviceaccount:amdgpu-virt:amdgpu-virt-scheduler',
                 'system:serviceaccount:amdgpu-virt:amdgpu-virt-node'],
        help='Users (as the AdmissionRequest\'s userInfo.username names '
             'them) who may set or change the GPU allocation annotations '
             'of pods (hami.io/amd-devices-to-allocate, '
             'hami.io/amd-devices-allocated, hami.io/amd-cu-allocated, '
             'hami.io/vgpu-node, hami.io/vgpu-time, hami.io/bind-phase, '
             'hami.io/bind-time) and the webhook\'s decision annotations. '
             'The webhook denies anyone else on CREATE and UPDATE.\n\n'
             'Possible values:\n\n'
             '* the service accounts of the scheduler (extender) and of '
             'the node agent / device plugin, as '
             'system:serviceaccount:<namespace>:<name>\n\n'
             'Related options:\n\n'
             '* webhook_exempt_namespaces\n'),
    cfg.BoolOpt(
        'webhook_dra_claims', default=False,
        help='What the admission webhook gives a pod that states its needs '
             'in the gpu.amd.com/workload annotation (or a container that '
             'states them in workload.gpu.amd.com/<container>).\n\n'
             'Possible values:\n\n'
             '* False (default): HAMi resources (amd.com/gpu, '
             'amd.com/gpucores, amd.com/gpumem) for the scheduler '
             'extender\n'
             '* True: a ResourceClaimTemplate of the DRA driver\'s '
             'DeviceClass gpu.amd.com (whole GPUs) or share.gpu.amd.com '
             '(CU shares, with computeUnits and memory capacities), '
             'written into the pod\'s namespace and referenced from the '
             'pod; the webhook then needs create and get on '
             'resourceclaimtemplates\n\n'
             'Related options:\n\n'
             '* scheduler_name\n'),
    cfg.IntOpt(
        'webhook_max_statements', default=32, min=1, max=1000,
        help='Most statements of needs (gpu.amd.com/workload and '
             'workload.gpu.amd.com/<container>) one pod may carry; a pod '
             'with more is denied before any is read. Each statement is '
             'also bounded before it is parsed: 512 characters, one flat '
             'mapping (no nested lists or mappings).\n\n'
             'Possible values:\n\n'
             '* 1 to 1000; one per container that gets GPUs\n\n'
             'Related options:\n\n'
             '* webhook_max_containers, webhook_review_budget\n'),
    cfg.IntOpt(
        'webhook_max_containers', default=64, min=1, max=10000,
        help='Most containers (init and ephemeral ones included) of a pod '
             'that asks for AMD GPUs; a larger one is denied before any '
             'container is looked at.\n\n'
             'Possible values:\n\n'
             '* 1 to 10000\n\n'
             'Related options:\n\n'
             '* webhook_max_statements\n'),
    cfg.FloatOpt(
        'webhook_review_budget', default=5.0, min=0.1, max=30.0,
        help='Seconds a review may take, from the arrival of its request; '
             'a review past them denies the pod, saying so (the API server '
             'gives up at the webhook configuration\'s timeoutSeconds and '
             'then applies its failurePolicy).\n\n'
             'Possible values:\n\n'
             '* 0.1 to 30; below the webhook configuration\'s '
             'timeoutSeconds (10 in the chart)\n\n'
             'Related options:\n\n'
             '* http_handler_timeout\n'),
    cfg.IntOpt(
        'webhook_event_queue', default=1024, min=1, max=100000,
        help='Decision Events (GpuPlacement) the webhook holds for its '
             'writer thread; a review only queues them, and past this '
             'many an Event is dropped (counted and logged), since the '
             'pod\'s annotations carry the same reasons.\n\n'
             'Possible values:\n\n'
             '* 1 to 100000\n'),
    cfg.HostAddressOpt(
        'webhook_host', default='0.0.0.0',  # noqa: S104
        help='Address the admission webhook listens on.\n\n'
             'Possible values:\n\n'
             '* an IP address or host name\n\n'
             'Related options:\n\n'
             '* webhook_port, webhook_cert_file, webhook_key_file\n'),
    cfg.PortOpt(
        'webhook_port', default=8443,
        help='Port the admission webhook listens on (HTTPS).\n\n'
             'Possible values:\n\n'
             '* a TCP port\n'),
    cfg.StrOpt(
        'webhook_cert_file',
        help='PEM certificate of the webhook server.\n\n'
             'Possible values:\n\n'
             '* unset: serve plain HTTP (tests only; the API server '
             'requires HTTPS)\n'
             '* a path, usually mounted from a TLS secret; when the file '
             'changes (a rotated secret) new connections get the new '
             'certificate, without a restart\n\n'
             'Related options:\n\n'
             '* webhook_key_file\n'),
    cfg.StrOpt(
        'webhook_key_file',
        help='PEM private key of the webhook server.\n\n'
             'Possible values:\n\n'
             '* a path, usually mounted from a TLS secret\n\n'
             'Related options:\n\n'
             '* webhook_cert_file\n'),
    cfg.IntOpt(
        'http_max_connections', default=1024, min=16, max=65536,
        help='Connections each HTTP server of the Kubernetes side (webhook, '
             'scheduler extender, metrics) holds open at most. At the '
             'limit, a connection is closed to admit the new one: one that '
             'never sent a request (a silent or half-done TLS handshake) '
             'or is idle, the longest waiting first, else one whose '
             'request arrives slower than http_min_request_rate; never one '
             'whose request arrives at that pace or is being answered, so '
             'idle and slow clients cannot lock out the API server or '
             'kube-scheduler.\n\n'
             'Possible values:\n\n'
             '* 16 to 65536; keep it below the open-file limit of the '
             'process\n\n'
             'Related options:\n\n'
             '* http_max_connections_per_peer, http_min_request_rate, '
             'http_idle_timeout\n'),
    cfg.IntOpt(
        'http_max_connections_per_peer', default=128, min=1, max=65536,
        help='Connections one client address may hold open on each HTTP '
             'server; a further one from it is refused at once (it closes '
             'no other client\'s connection to make room).\n\n'
             'Possible values:\n\n'
             '* 1 to 65536; keep it above the connections the API server '
             '(the webhook\'s client) or kube-scheduler (the extender\'s) '
             'opens at once, which is at most http_workers plus '
             'http_max_queue requests at a time\n\n'
             'Related options:\n\n'
             '* http_max_connections, http_workers, http_max_queue\n'),
    cfg.IntOpt(
        'http_workers', default=8, min=1, max=256,
        help='Threads that run complete requests in each HTTP server; '
             'reading requests and TLS handshakes never take a thread.\n\n'
             'Possible values:\n\n'
             '* 1 to 256\n\n'
             'Related options:\n\n'
             '* http_max_queue\n'),
    cfg.IntOpt(
        'http_max_queue', default=64, min=0, max=10000,
        help='Complete requests that may wait for a worker; beyond this '
             'a request is answered 503 at once.\n\n'
             'Possible values:\n\n'
             '* 0 to 10000\n\n'
             'Related options:\n\n'
             '* http_workers\n'),
    cfg.IntOpt(
        'http_max_body_bytes', default=8 * 1024 * 1024, min=1024,
        max=256 * 1024 * 1024,
        help='Largest request body (bytes) an HTTP server reads; a larger '
             'Content-Length is answered 413 before the body is read. An '
             'AdmissionReview of an UPDATE carries the pod twice (the API '
             'server caps an object at about 1.5 MiB).\n\n'
             'Possible values:\n\n'
             '* 1024 to 268435456\n'),
    cfg.FloatOpt(
        'http_handshake_timeout', default=5.0, min=0.1, max=300.0,
        help='Seconds a client has to complete the TLS handshake.\n\n'
             'Possible values:\n\n'
             '* 0.1 to 300\n'),
    cfg.FloatOpt(
        'http_request_timeout', default=10.0, min=0.1, max=300.0,
        help='Seconds a client has to send a whole request (head and '
             'body) once its first byte arrived, and to send the first '
             'request on a new connection; a slower client gets 408 and '
             'is disconnected.\n\n'
             'Possible values:\n\n'
             '* 0.1 to 300; the API server gives a webhook at most 30 '
             'seconds in all\n\n'
             'Related options:\n\n'
             '* http_min_request_rate, http_idle_timeout\n'),
    cfg.IntOpt(
        'http_min_request_rate', default=4096, min=1, max=1 << 30,
        help='Bytes a second a request must arrive at, counted from its '
             'first byte once its first second has passed; a slower '
             'client gets 408 and is disconnected (one byte now and then '
             'holds no connection for long), and such a request is the '
             'first to go when the server is full.\n\n'
             'Possible values:\n\n'
             '* 1 to 1073741824; the API server and kube-scheduler send a '
             'request in one go\n\n'
             'Related options:\n\n'
             '* http_request_timeout, http_max_connections\n'),
    cfg.FloatOpt(
        'http_idle_timeout', default=60.0, min=0.1, max=3600.0,
        help='Seconds a kept-alive connection may wait for its next '
             'request.\n\n'
             'Possible values:\n\n'
             '* 0.1 to 3600\n\n'
             'Related options:\n\n'
             '* http_request_timeout, http_max_connections\n'),
    cfg.FloatOpt(
        'http_handler_timeout', default=30.0, min=0.1, max=600.0,
        help='Seconds a request may take to be answered once read; a '
             'slower one is answered 503 (its work finishes in the '
             'background).\n\n'
             'Possible values:\n\n'
             '* 0.1 to 600\n'),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(kubernetes_group)
    conf.register_opts(kubernetes_opts, group=kubernetes_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(kubernetes_group, kubernetes_opts)]
