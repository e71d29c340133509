"""Options of the ``[sharing]`` group."""

from __future__ import annotations

from oslo_config import cfg

sharing_group = cfg.OptGroup('sharing', title='sharing')

sharing_opts: list[cfg.Opt] = []


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(sharing_group)
    conf.register_opts(sharing_opts, group=sharing_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(sharing_group, sharing_opts)]
