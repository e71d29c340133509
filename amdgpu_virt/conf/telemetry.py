"""Options of the ``[telemetry]`` group: the node's Prometheus metrics.

The node agent serves per-GPU telemetry (VRAM, load, temperatures,
power, RAS counts, health), per-container VRAM from the dmem cgroup
controller and the allocation record's view on its own listener.
"""

from __future__ import annotations

from oslo_config import cfg

telemetry_group = cfg.OptGroup(
    'telemetry', title='Node telemetry',
    help='The node agent\'s Prometheus metrics (GET /metrics, /healthz).')

telemetry_opts: list[cfg.Opt] = [
    cfg.StrOpt(
        'metrics_host', default='0.0.0.0',  # noqa: S104
        help='Address of the node agent\'s metrics listener.\n\n'
             'Possible values:\n\n'
             '* 0.0.0.0: every address of the pod (Prometheus scrapes the '
             'pod address)\n'
             '* an IP address or host name\n\n'
             'Related options:\n\n'
             '* metrics_port\n'),
    cfg.IntOpt(
        'metrics_port', default=9394, min=-1, max=65535,
        help='Port of the node agent\'s metrics listener (HAMi\'s vGPU '
             'monitor uses 9394).\n\n'
             'Possible values:\n\n'
             '* -1: no metrics\n'
             '* 0: a free port (tests)\n'
             '* a TCP port\n\n'
             'Related options:\n\n'
             '* metrics_host\n'),
    cfg.IntOpt(
        'min_read_interval', default=5, min=0, max=300,
        help='Seconds a scrape reuses the previous read of the node\'s '
             'files and pods (two Prometheus replicas, or a client that '
             'scrapes in a loop, cost one read per interval).\n\n'
             'Possible values:\n\n'
             '* 0: read on every scrape\n'
             '* 1 to 300\n'),
    cfg.IntOpt(
        'max_containers', default=512, min=1, max=65536,
        help='Container series (per-container VRAM used and limit) the node '
             'exports at most; the rest are dropped and counted in '
             'amdgpu_virt_node_telemetry_dropped_series_total.\n\n'
             'Possible values:\n\n'
             '* 1 to 65536\n\n'
             'Related options:\n\n'
             '* max_containers_per_pod\n'),
    cfg.IntOpt(
        'max_containers_per_pod', default=16, min=1, max=1024,
        help='Container series of one pod at most (a pod with many '
             'containers cannot crowd out the others).\n\n'
             'Possible values:\n\n'
             '* 1 to 1024\n\n'
             'Related options:\n\n'
             '* max_containers\n'),
    cfg.IntOpt(
        'max_pods', default=512, min=1, max=65536,
        help='Pods of the allocation record the node exports grants of at '
             'most (the oldest bookings first).\n\n'
             'Possible values:\n\n'
             '* 1 to 65536\n'),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(telemetry_group)
    conf.register_opts(telemetry_opts, group=telemetry_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(telemetry_group, telemetry_opts)]
