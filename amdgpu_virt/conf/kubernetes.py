"""Options of the ``[kubernetes]`` group."""

from __future__ import annotations

from oslo_config import cfg

kubernetes_group = cfg.OptGroup('kubernetes', title='kubernetes')

kubernetes_opts: list[cfg.Opt] = []


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(kubernetes_group)
    conf.register_opts(kubernetes_opts, group=kubernetes_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(kubernetes_group, kubernetes_opts)]
