"""Options of the ``[pool]`` group: one GPU pool shared by two clouds."""

from __future__ import annotations

from oslo_config import cfg

pool_group = cfg.OptGroup(
    'pool', title='GPU pool shared by Nova and Kubernetes',
    help='Where "amdgpu-virt apply", "audit" and "move" keep what they '
         'render and record, and where the role ledger lives in '
         'Kubernetes.')

_NAME_RE = r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'

pool_opts: list[cfg.Opt] = [
    cfg.StrOpt(
        'output_dir', default='amdgpu-virt-out',
        help='Directory "amdgpu-virt apply" and "amdgpu-virt move" render '
             'the per-host files into (``<output_dir>/<host>/...``).\n\n'
             'Possible values:\n\n'
             '* a directory path (created when missing)\n\n'
             'Related options:\n\n'
             '* state_dir\n'),
    cfg.StrOpt(
        'state_dir', default='amdgpu-virt-moves',
        help='Directory holding the state file of each GPU move, so that '
             'an interrupted move resumes where it stopped.\n\n'
             'Possible values:\n\n'
             '* a directory path (created when missing)\n\n'
             'Related options:\n\n'
             '* output_dir\n'),
    cfg.IntOpt(
        'progress_every', default=100, min=0, max=1000000,
        help='"amdgpu-virt apply" reports its progress on stderr every '
             'this many hosts.\n\n'
             'Possible values:\n\n'
             '* 0: no progress lines\n'
             '* a positive number of hosts\n'),
    cfg.StrOpt(
        'configmap_namespace', default='kube-system', regex=_NAME_RE,
        help='Namespace of the ConfigMap that holds the role ledger for '
             'the Kubernetes side ("amdgpu-virt apply --push-configmap" and '
             '"amdgpu-virt move" write it; node agents and device plugins '
             'read their roles from it with [kubernetes] ledger_source = '
             'configmap).'
             '\n\nPossible values:\n\n'
             '* a Kubernetes namespace name\n\n'
             'Related options:\n\n'
             '* configmap_name\n'
             '* [kubernetes] ledger_source\n'),
    cfg.StrOpt(
        'configmap_name', default='amdgpu-virt-ledger', regex=_NAME_RE,
        help='Name of the ConfigMap that holds the role ledger.\n\n'
             'Possible values:\n\n'
             '* a Kubernetes object name\n\n'
             'Related options:\n\n'
             '* configmap_namespace\n'
             '* [kubernetes] ledger_source\n'),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(pool_group)
    conf.register_opts(pool_opts, group=pool_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(pool_group, pool_opts)]
