"""Options of the ``[health]`` group: when a GPU is unhealthy.

The node side (device plugin, node agent, DRA plugin) judges each GPU by
what the node can read: its device nodes, its RAS error counters and,
optionally, AMD's device metrics exporter. ``audit`` and ``plan`` with
live state judge the RAS counts of host snapshots with the same
``max_uncorrectable``.
"""

from __future__ import annotations

from oslo_config import cfg

health_group = cfg.OptGroup(
    'health', title='GPU health',
    help='When a GPU is unhealthy: its units are listed Unhealthy to '
         'kubelet, the DRA plugin stops offering it, the node is labelled '
         'and gets an Event, and the planner keeps new work off it.')

health_opts: list[cfg.Opt] = [
    cfg.IntOpt(
        'max_uncorrectable', default=0, min=0, max=1000000,
        help='Uncorrectable RAS errors (the sum of ``ue`` over the blocks '
             'of ``ras/<block>_err_count``, counted since the driver '
             'loaded) a GPU may have and still be healthy.\n\n'
             'Possible values:\n\n'
             '* 0: the first uncorrectable error makes the GPU unhealthy '
             '(AMD\'s exporter does the same by default)\n'
             '* a larger number: tolerate that many\n\n'
             'Related options:\n\n'
             '* max_correctable_per_hour\n'),
    cfg.IntOpt(
        'max_correctable_per_hour', default=0, min=0, max=100000000,
        help='Correctable RAS errors per hour, over correctable_window, '
             'above which a GPU is unhealthy (a burst of correctable '
             'errors often comes before an uncorrectable one).\n\n'
             'Possible values:\n\n'
             '* 0: correctable errors never make a GPU unhealthy\n'
             '* a rate in errors per hour\n\n'
             'Related options:\n\n'
             '* correctable_window\n'),
    cfg.IntOpt(
        'correctable_window', default=3600, min=60, max=7 * 86400,
        help='Seconds over which the correctable error rate is measured.'
             '\n\nPossible values:\n\n'
             '* 60 to 604800\n\n'
             'Related options:\n\n'
             '* max_correctable_per_hour\n'),
    cfg.URIOpt(
        'exporter_url', schemes=['http', 'https'],
        help='The /metrics URL of AMD\'s device metrics exporter on this '
             'node; a GPU whose ``gpu_health`` is 0 there is unhealthy. '
             'The exporter\'s ``gpu_id`` is taken as the GPU\'s position '
             'among the node\'s amdgpu GPUs in PCI address order (series '
             'of partitions other than 0 are ignored). An exporter that '
             'does not answer makes no GPU unhealthy (the failure is '
             'counted in amdgpu_virt_node_telemetry_errors_total).\n\n'
             'Possible values:\n\n'
             '* unset: do not ask the exporter\n'
             '* a URL such as http://amd-metrics-exporter.kube-amd-gpu:5000'
             '/metrics (the exporter listens on port 5000)\n\n'
             'Related options:\n\n'
             '* exporter_timeout\n'),
    cfg.FloatOpt(
        'exporter_timeout', default=2.0, min=0.1, max=30.0,
        help='Seconds to wait for the device metrics exporter.\n\n'
             'Possible values:\n\n'
             '* 0.1 to 30\n\n'
             'Related options:\n\n'
             '* exporter_url\n'),
    cfg.IntOpt(
        'interval', default=10, min=1, max=3600,
        help='Seconds a GPU\'s verdict is reused before its files are read '
             'again (the device plugin asks every second).\n\n'
             'Possible values:\n\n'
             '* 1 to 3600\n'),
    cfg.BoolOpt(
        'open_render_nodes', default=True,
        help='Open each render node (``/dev/dri/renderD<N>`` under '
             '[kubernetes] device_root) read-only to see that its driver '
             'answers: an unplugged or unbound GPU answers ENODEV or ENXIO. '
             'A container without access to the device (EPERM, EACCES) '
             'falls back to checking that the node exists.\n\n'
             'Possible values:\n\n'
             '* true: open render nodes (never card nodes, never /dev/kfd)\n'
             '* false: only check that the device nodes exist\n'),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(health_group)
    conf.register_opts(health_opts, group=health_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(health_group, health_opts)]
