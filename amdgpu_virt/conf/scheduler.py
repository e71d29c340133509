"""Options of the ``[scheduler]`` group: the kube-scheduler extender."""

from __future__ import annotations

from oslo_config import cfg

from amdgpu_virt.sharing import packing

scheduler_group = cfg.OptGroup(
    'scheduler', title='Kubernetes scheduler extender',
    help='The HTTP extender kube-scheduler calls to filter, prioritize and '
         'bind pods that request AMD GPUs (HAMi protocol).')

scheduler_opts: list[cfg.Opt] = [
    cfg.HostAddressOpt(
        'host', default='127.0.0.1',
        help='Address the extender listens on.\n\n'
             'Possible values:\n\n'
             '* 127.0.0.1: only kube-scheduler in the same pod reaches it '
             '(kubelet probes and Prometheus use metrics_port)\n'
             '* 0.0.0.0 or another address: for other layouts; then set '
             'cert_file, key_file and client_ca_file so that only '
             'kube-scheduler may call filter and bind\n\n'
             'Related options:\n\n'
             '* port, metrics_port, cert_file, client_ca_file\n'),
    cfg.PortOpt(
        'port', default=8888,
        help='Port of the extender (HTTP, or HTTPS with cert_file; the '
             'KubeSchedulerConfiguration urlPrefix names it).\n\n'
             'Possible values:\n\n'
             '* a TCP port; 0 picks a free one (tests)\n\n'
             'Related options:\n\n'
             '* host\n'),
    cfg.StrOpt(
        'cert_file',
        help='PEM certificate of the extender, to serve HTTPS instead of '
             'HTTP (for layouts where kube-scheduler is not in the same '
             'pod). Reloaded for new connections when the file changes.'
             '\n\nPossible values:\n\n'
             '* unset: plain HTTP (the default, with host 127.0.0.1)\n'
             '* a path, usually mounted from a TLS secret\n\n'
             'Related options:\n\n'
             '* key_file, client_ca_file\n'),
    cfg.StrOpt(
        'key_file',
        help='PEM private key of cert_file.\n\n'
             'Possible values:\n\n'
             '* a path; required with cert_file\n\n'
             'Related options:\n\n'
             '* cert_file\n'),
    cfg.StrOpt(
        'client_ca_file',
        help='PEM CA certificates that sign the client certificate '
             'kube-scheduler presents (the KubeSchedulerConfiguration '
             'extender tlsConfig certFile/keyFile); a client without a '
             'valid certificate is refused in the TLS handshake.\n\n'
             'Possible values:\n\n'
             '* unset: no client authentication\n'
             '* a path; requires cert_file\n\n'
             'Related options:\n\n'
             '* cert_file\n'),
    cfg.HostAddressOpt(
        'metrics_host',
        help='Address of the extender\'s second listener, which serves '
             'only GET /healthz, /readyz and /metrics: kubelet probes and '
             'Prometheus reach it on the pod address while the extender '
             'port stays on 127.0.0.1.\n\n'
             'Possible values:\n\n'
             '* unset (the default): the address in the environment '
             'variable POD_IP (the chart sets it to the pod\'s IP from the '
             'downward API), else 127.0.0.1; never every address of the '
             'host\n'
             '* an IP address or host name\n\n'
             'Related options:\n\n'
             '* metrics_port\n'),
    cfg.IntOpt(
        'metrics_port', default=8889, min=-1, max=65535,
        help='Port of the probe and metrics listener.\n\n'
             'Possible values:\n\n'
             '* -1: no such listener (probes and metrics only on port)\n'
             '* 0: a free port (tests)\n'
             '* a TCP port\n\n'
             'Related options:\n\n'
             '* metrics_host, port\n'),
    cfg.StrOpt(
        'node_scheduler_policy', default='binpack',
        choices=[('binpack', 'the busiest node that fits'),
                 ('spread', 'the idlest node that fits')],
        help='Node policy for pods without the annotation '
             'hami.io/node-scheduler-policy.\n\n'
             'Related options:\n\n'
             '* gpu_scheduler_policy\n'),
    cfg.StrOpt(
        'gpu_scheduler_policy', default='spread',
        choices=[('spread', 'the idlest GPU that fits'),
                 ('binpack', 'the busiest GPU that fits'),
                 ('numa', 'as spread, and a container\'s GPUs on one NUMA '
                          'node'),
                 ('topology-aware', 'ordered as spread'),
                 ('mutex', 'ordered as spread')],
        help='GPU policy for pods without the annotation '
             'hami.io/gpu-scheduler-policy. Whatever the policy, GPUs whose '
             'free CUs hold the request in one range come first.\n\n'
             'Related options:\n\n'
             '* node_scheduler_policy\n'
             '* [sharing] cu_strategy\n'),
    cfg.IntOpt(
        'node_lock_timeout', default=300, min=1, max=86400,
        help='Seconds after which a node lock (hami.io/mutex.lock) has '
             'expired and may be taken over.\n\n'
             'Possible values:\n\n'
             '* 1 to 86400; HAMi uses 300\n'),
    cfg.FloatOpt(
        'node_lock_wait', default=10.0, min=0.0, max=25.0,
        help='Seconds a bind waits for a node lock held by another pod '
             '(or behind this extender\'s other binds of the node) before '
             'it fails (kube-scheduler then retries the pod). The wait '
             'ends as soon as the node watch shows the lock released.\n\n'
             'Possible values:\n\n'
             '* 0 to 25; keep it well below the extender httpTimeout '
             '(30s)\n'),
    cfg.BoolOpt(
        'packing', default=True,
        help='Place binpack pods (the default node policy) by the '
             'fragmentation score: among the nodes whose free CUs, free '
             'memory, free slots and idle GPUs can hold the pod, the '
             'placement that least increases the free capacity the '
             'recent request mix could not use (after "Beware of '
             'Fragmentation", USENIX ATC \'23), ties to the tightest fit. '
             'Pods that name their GPU policy keep it on the chosen node; '
             'spread pods keep HAMi\'s order.\n\n'
             'Possible values:\n\n'
             '* true: the fragmentation score\n'
             '* false: HAMi\'s order (the busiest node that fits)\n\n'
             'Related options:\n\n'
             '* packing_window, packing_prior, packing_prior_weight, '
             'packing_candidates\n'),
    cfg.IntOpt(
        'packing_window', default=500, min=1, max=1000000,
        help='How many recent pod requests make the request mix the '
             'fragmentation score is measured against.\n\n'
             'Possible values:\n\n'
             '* 1 to 1000000; smaller follows changes of the workload '
             'faster\n\n'
             'Related options:\n\n'
             '* packing, packing_prior_weight\n'),
    cfg.ListOpt(
        'packing_prior', default=list(packing.DEFAULT_PRIOR),
        help='The request mix assumed before (and besides) what pods ask, '
             'as SIZE:WEIGHT items: a SIZE below 1 is a share of one GPU '
             '(its CUs and memory in proportion), a whole number that '
             'many whole GPUs.\n\n'
             'Possible values:\n\n'
             '* a list such as 0.1:2,0.5:2,1:2,8:1\n\n'
             'Related options:\n\n'
             '* packing_prior_weight\n'),
    cfg.FloatOpt(
        'packing_prior_weight', default=30.0, min=0.0, max=1000000.0,
        help='How many requests the prior mix weighs once pods have been '
             'seen.\n\n'
             'Possible values:\n\n'
             '* 0: only what pods ask (the prior until the first pod)\n'
             '* a positive number of requests\n\n'
             'Related options:\n\n'
             '* packing_prior, packing_window\n'),
    cfg.IntOpt(
        'packing_candidates', default=256, min=1, max=100000,
        help='Most nodes that fit compared per decision, tightest first '
             '(bounds the decision time on large clusters).\n\n'
             'Possible values:\n\n'
             '* 1 (the tightest node that fits) to 100000\n\n'
             'Related options:\n\n'
             '* packing\n'),
    cfg.ListOpt(
        'gpuless_namespaces', default=[],
        help='Namespaces whose pods that ask no AMD GPU /prioritize scores '
             'by the GPU capacity their CPU and memory requests would leave '
             'a node unable to feed (kube-scheduler calls /prioritize for '
             'them only through an extender entry without '
             'managedResources; the chart renders one when '
             'scheduler.gpulessPods.namespaces is set). The score uses the '
             'fragmentation score\'s request mix (packing).\n\n'
             'Possible values:\n\n'
             '* empty: such pods get the same score everywhere (no '
             'preference)\n'
             '* namespace names\n'
             '* ``*``: every namespace\n\n'
             'Related options:\n\n'
             '* packing\n'),
    cfg.IntOpt(
        'watch_timeout', default=300, min=10, max=3600,
        help='Seconds one node or pod watch request lasts before the '
             'extender renews it from the last version seen.\n\n'
             'Possible values:\n\n'
             '* 10 to 3600\n'),
    cfg.StrOpt(
        'leader_lease', default='',
        help='Name of the kube-scheduler leader Lease (in [kubernetes] '
             'namespace) the extender fences itself on: /filter and /bind '
             'answer only while the kube-scheduler of this pod holds it. '
             'The allocation records already keep two extenders from '
             'booking the same GPU; this is a second line.\n\n'
             'Possible values:\n\n'
             '* empty: no fencing (one replica, or tests)\n'
             '* the KubeSchedulerConfiguration leaderElection.resourceName, '
             'e.g. amdgpu-virt-scheduler\n\n'
             'Related options:\n\n'
             '* leader_identity\n'
             '* [kubernetes] namespace\n'),
    cfg.StrOpt(
        'leader_identity', default='',
        help='Holder identity of this pod\'s kube-scheduler in the leader '
             'Lease; a holder equal to it or starting with it and "_" '
             'matches (kube-scheduler writes <hostname>_<uuid>).\n\n'
             'Possible values:\n\n'
             '* empty: the POD_NAME environment variable, else the host '
             'name\n\n'
             'Related options:\n\n'
             '* leader_lease\n'),
    cfg.FloatOpt(
        'record_sweep_interval', default=120.0, min=1.0, max=3600.0,
        help='Seconds between two sweeps of the allocation records that '
             'remove the bookings of pods that are gone, finished, or '
             'unbound for longer than node_lock_timeout, and the bookings '
             'of an unbound pod older than its current one (on the node '
             'its hami.io/vgpu-node annotation names).\n\n'
             'Possible values:\n\n'
             '* 1 to 3600\n\n'
             'Related options:\n\n'
             '* node_lock_timeout\n'),
    cfg.FloatOpt(
        'node_lock_grace', default=5.0, min=0.0, max=300.0,
        help='Seconds after it was taken that a node lock whose pod exists '
             'but is not bound to the node counts as stale, so that a '
             'failed bind whose release was lost does not hold the node '
             'for the whole node_lock_timeout. The lock of a pod that is '
             'gone, or replaced by a pod of another UID under its name, is '
             'never stale by this grace (its late Allocate is refused by '
             'the device plugin, which then releases it); it expires after '
             'node_lock_timeout.\n\n'
             'Possible values:\n\n'
             '* 0 to 300; keep it below node_lock_wait\n\n'
             'Related options:\n\n'
             '* node_lock_timeout\n'
             '* node_lock_wait\n'),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(scheduler_group)
    conf.register_opts(scheduler_opts, group=scheduler_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(scheduler_group, scheduler_opts)]
