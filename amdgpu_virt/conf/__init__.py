"""oslo.config options of amdgpu_virt, one module per option group.

Each module has ``register_opts(conf)`` and ``list_opts()``; the list of
modules lives in :mod:`amdgpu_virt.conf.opts`, which the sample config
generator also reads. Code receives a ``ConfigOpts`` object instead of
reading a global one, so tests and daemons can hold several.
"""

from __future__ import annotations

from collections.abc import Sequence

from oslo_config import cfg

from amdgpu_virt.conf import opts


class ConfigOpts(cfg.ConfigOpts):
    """``cfg.ConfigOpts`` whose groups are its own.

    oslo.config registers a shallow copy of an ``OptGroup``, so two
    ``ConfigOpts`` given the same module-level group share its option
    table, and ``set_override`` on one shows in the other. Registering a
    fresh group per instance keeps configurations independent.
    """

    def register_group(self, group: cfg.OptGroup) -> None:
        if group.name in self._groups:
            return
        super().register_group(cfg.OptGroup(
            group.name, title=group.title, help=group.help,
            dynamic_group_owner=group.dynamic_group_owner,
            driver_option=group.driver_option))


def register_opts(conf: cfg.ConfigOpts) -> cfg.ConfigOpts:
    for module in opts.modules():
        module.register_opts(conf)
    return conf


def new_conf(args: Sequence[str] | None = None,
             default_config_files: Sequence[str] | None = None
             ) -> cfg.ConfigOpts:
    """A fresh ``ConfigOpts`` with every option registered and parsed.

    :param args: command line arguments for oslo (not the CLI's own);
        ``[]`` by default, so a test runner's argv is never read.
    :param default_config_files: config files to read; None means none.
    :raises oslo_config.cfg.Error: on unreadable or invalid files.
    """
    conf = register_opts(ConfigOpts())
    conf(args=list(args or []), project='amdgpu_virt',
         default_config_files=list(default_config_files or []),
         validate_default_values=True)
    return conf
