"""Options of the ``[sharing]`` group: how GPUs are shared by CU masks."""

from __future__ import annotations

from oslo_config import cfg

sharing_group = cfg.OptGroup(
    'sharing', title='CU and memory sharing',
    help='How one GPU is shared among pods by CU masks and memory limits.')

sharing_opts: list[cfg.Opt] = [
    cfg.StrOpt('cu_strategy', default='first-fit',
               help="""
How free compute units are chosen for a new consumer; a plugin of the
``amdgpu_virt.sharing.strategies`` namespace.

Possible values:

* first-fit: the lowest free CU ids (HAMi's choice)

Related options:

* none
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(sharing_group)
    conf.register_opts(sharing_opts, group=sharing_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(sharing_group, sharing_opts)]
