"""Options of the ``[policy]`` group."""

from __future__ import annotations

from oslo_config import cfg

policy_group = cfg.OptGroup('policy', title='policy')

policy_opts: list[cfg.Opt] = []


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(policy_group)
    conf.register_opts(policy_opts, group=policy_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(policy_group, policy_opts)]
