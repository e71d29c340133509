"""Options of the ``[nova]`` group."""

from __future__ import annotations

from oslo_config import cfg

nova_group = cfg.OptGroup('nova', title='nova')

nova_opts: list[cfg.Opt] = []


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(nova_group)
    conf.register_opts(nova_opts, group=nova_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(nova_group, nova_opts)]
