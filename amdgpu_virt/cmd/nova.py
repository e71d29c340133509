"""``amdgpu-virt nova ...``: Nova PCI passthrough of AMD GPUs.

* ``nova config``: the compute host's ``[pci]`` snippet;
* ``nova aliases``: ``[pci] alias`` for API/scheduler/conductor hosts;
* ``nova gim-config``: GIM / vfio-pci files for the host's next boot;
* ``nova flavors``: create or update flavors (openstacksdk);
* ``nova audit``: compare Placement with the plan (read-only);
* ``nova drain-check``: refuse a role change while the GPU is in use.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from cliff import command
from cliff import lister

from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt import inventory as inventory_pkg
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import plugins
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.cmd import sources as cmd_sources
from amdgpu_virt.model import HostInventory
from amdgpu_virt.model import PciAddress
from amdgpu_virt.nova import flavors
from amdgpu_virt.nova import gim
from amdgpu_virt.nova import pci
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.driver import NovaBackend

BACKEND_NAMESPACE = 'amdgpu_virt.backends'


def load_backend(app: Any) -> NovaBackend:
    """The ``nova`` backend (stevedore, ``amdgpu_virt.backends``)."""
    backend: NovaBackend = plugins.load_driver(BACKEND_NAMESPACE, 'nova',
                                               av_main.app_conf(app))
    return backend


def _add_inventory_args(parser: argparse.ArgumentParser,
                        only_without_ledger: bool = False) -> None:
    cmd_sources.add_arguments(
        parser, note=' (only without --ledger)' if only_without_ledger
        else '', sample=False)


def _add_ledger_args(parser: argparse.ArgumentParser,
                     host: bool = True) -> None:
    parser.add_argument('--ledger', metavar='FILE',
                        help='role ledger (YAML); without it, roles follow '
                             'the drivers the GPUs are bound to')
    if host:
        parser.add_argument('--host', metavar='NAME',
                            help='this host\'s name in the ledger (default: '
                                 'the inventory\'s host name, see '
                                 '--hostname); a name the ledger lacks '
                                 'offers nothing and is warned about')


def _from_files(parsed_args: argparse.Namespace) -> bool:
    return bool(parsed_args.fleet or parsed_args.snapshot_dir)


def _scan(app: Any, parsed_args: argparse.Namespace) -> HostInventory:
    """This host's inventory: from ``--fleet``/``--snapshot-dir`` by name
    (``--hostname``, else ``--host``, else ``[inventory] hostname`` or the
    machine's name), else read through ``--sysfs-root`` or the
    ``[inventory]`` driver."""
    conf = av_main.app_conf(app)
    if _from_files(parsed_args) and not parsed_args.sysfs_root:
        name = (parsed_args.hostname or getattr(parsed_args, 'host', None)
                or cmd_sources.this_host(app, parsed_args))
        found = cmd_sources.inventories(app, parsed_args).of(name)
    else:
        if parsed_args.sysfs_root:
            conf.set_override('sysfs_root', parsed_args.sysfs_root,
                              group='inventory')
        if parsed_args.hostname:
            conf.set_override('hostname', parsed_args.hostname,
                              group='inventory')
        found = inventory_pkg.load_driver(conf).scan()
    for warning in found.warnings:
        app.stderr.write('warning: %s\n' % warning)
    return found


def _every(app: Any, parsed_args: argparse.Namespace
           ) -> list[HostInventory]:
    """Every host of ``--fleet``/``--snapshot-dir``, else this host."""
    if _from_files(parsed_args):
        return cmd_sources.inventories(app, parsed_args).every()
    return [_scan(app, parsed_args)]


def _ledger(parsed_args: argparse.Namespace) -> av_ledger.Ledger | None:
    return av_ledger.load(parsed_args.ledger) if parsed_args.ledger else None


def warn_if_not_in_ledger(app: Any, ledger: av_ledger.Ledger | None,
                          host: str | None, inventory: HostInventory,
                          path: str | None) -> None:
    """Warn when the host is not in the ledger: nothing would be offered.

    Rendering then leaves every GPU out, which is safe but most often a
    wrong ``--host``/``--hostname``, so say which names the ledger has.
    """
    name = host or inventory.hostname
    if ledger is None or name in ledger.hosts:
        return
    app.stderr.write(
        'warning: host %s is not in ledger %s (hosts: %s), so no GPU is '
        'offered to Nova; give the ledger\'s name with --host\n' % (
            name, path, ', '.join(ledger.hosts) or 'none'))


def _emit(app: Any, text: str, output: str | None) -> None:
    if not output:
        app.stdout.write(text)
        return
    changed = fileutil.write_if_changed(output, text)
    app.stderr.write('%s %s\n' % ('wrote' if changed else 'unchanged',
                                  output))


class NovaConfig(command.Command):
    """Render the [pci] device_spec/alias snippet of this compute host."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _add_inventory_args(parser)
        _add_ledger_args(parser)
        where = parser.add_mutually_exclusive_group()
        where.add_argument(
            '--output', metavar='FILE',
            help='write here (only when the content changes) instead of '
                 'printing')
        where.add_argument(
            '--write', action='store_true',
            help='write [nova] output_dir/%s (only when the content '
                 'changes)' % pci.CONFIG_FILE_NAME)
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        backend = load_backend(self.app)
        inventory = _scan(self.app, parsed_args)
        ledger = _ledger(parsed_args)
        warn_if_not_in_ledger(self.app, ledger, parsed_args.host, inventory,
                              parsed_args.ledger)
        text = backend.render_compute(inventory, ledger, parsed_args.host)
        output = parsed_args.output
        if parsed_args.write:
            output = os.path.join(av_main.app_conf(self.app).nova.output_dir,
                                  pci.CONFIG_FILE_NAME)
        _emit(self.app, text, output)
        return 0


class NovaAliases(command.Command):
    """Render [pci] alias entries for Nova API, scheduler and conductor.

    With --ledger, the aliases of every Nova GPU of the ledger; without it,
    those of this host's GPUs (read as "nova config" reads them).
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _add_inventory_args(parser, only_without_ledger=True)
        _add_ledger_args(parser, host=False)
        parser.add_argument('--output', metavar='FILE',
                            help='write here (only when changed)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        backend = load_backend(self.app)
        ledger = _ledger(parsed_args)
        inventories = [] if ledger else _every(self.app, parsed_args)
        _emit(self.app, backend.render_aliases(ledger, inventories),
              parsed_args.output)
        return 0


class NovaGimConfig(command.Command):
    """Render GIM and vfio-pci host files for the next boot (never applied).
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _add_inventory_args(parser)
        _add_ledger_args(parser)
        parser.add_argument(
            '--output-dir', metavar='DIR',
            help='write each file below DIR at its absolute path (only when '
                 'changed), e.g. DIR/etc/modprobe.d/...; default: print')
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        backend = load_backend(self.app)
        inventory = _scan(self.app, parsed_args)
        ledger = _ledger(parsed_args)
        warn_if_not_in_ledger(self.app, ledger, parsed_args.host, inventory,
                              parsed_args.ledger)
        config = backend.render_host_config(inventory, ledger,
                                            parsed_args.host)
        if not parsed_args.output_dir:
            self.app.stdout.write(gim.render_text(config))
            return 0
        for note in config.notes:
            self.app.stderr.write('note: %s\n' % note)
        for stale in fileutil.remove_stale_temps({os.path.dirname(
                os.path.join(parsed_args.output_dir, item.path.lstrip('/')))
                for item in config.files}):
            self.app.stderr.write('removed %s (left by an interrupted '
                                  'run)\n' % stale)
        for item in config.files:
            path = os.path.join(parsed_args.output_dir,
                                item.path.lstrip('/'))
            changed = fileutil.write_if_changed(path, item.content, item.mode)
            self.app.stderr.write('%s %s\n' % (
                'wrote' if changed else 'unchanged', path))
        return 0


class NovaFlavors(lister.Lister):
    """Create or update the GPU flavors of [nova] flavors_file."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument('--file', metavar='FILE',
                            help='flavor definitions instead of [nova] '
                                 'flavors_file')
        parser.add_argument('--ledger', metavar='FILE',
                            help='check every flavor\'s alias against the '
                                 'aliases this ledger renders')
        parser.add_argument('--replace', action='store_true',
                            help='delete and re-create flavors whose vCPUs, '
                                 'RAM or disk differ')
        parser.add_argument('--allow-zero-disk', action='store_true',
                            help='accept flavors with disk_gb 0 (missing or '
                                 '0), with a warning: Nova\'s default policy '
                                 '%s lets only admins boot them from an '
                                 'image, so they suit volume-backed '
                                 'instances only; refused by default'
                                 % flavors.ZERO_DISK_POLICY)
        return parser

    def take_action(self, parsed_args: argparse.Namespace
                    ) -> tuple[Sequence[str], Iterable[Sequence[Any]]]:
        conf = av_main.app_conf(self.app)
        path = parsed_args.file or conf.nova.flavors_file
        if not path:
            raise exception.ConfigError(
                option='[nova] flavors_file',
                reason='no flavor file given (--file or the option)')
        backend = load_backend(self.app)
        ledger = _ledger(parsed_args)
        known = None
        if ledger is not None:
            known = [a['name'] for a in backend.alias_entries(ledger)]
        specs = flavors.load(path, conf.nova.numa_policy, known,
                             parsed_args.allow_zero_disk)
        spread = [s.name for s in specs if s.gpus]
        if spread and not conf.nova.per_gpu_traits:
            raise exception.ConfigError(
                option='[nova] per_gpu_traits',
                reason='is False, so no per-GPU alias exists for flavor(s) '
                '%s with "gpus"' % ', '.join(spread))
        for name in flavors.zero_disk(specs):
            self.app.stderr.write(
                'warning: flavor %s has disk 0: only admins may boot it '
                'from an image (Nova policy %s); use it for volume-backed '
                'instances\n' % (name, flavors.ZERO_DISK_POLICY))
        changes = backend.sync_flavors(specs, parsed_args.replace)
        return (('Flavor', 'Action', 'Details'),
                [(c.name, c.action, '; '.join(c.details)) for c in changes])


class NovaAudit(lister.Lister):
    """Compare Nova's PCI providers in Placement with the plan (read-only).

    Also checks every whole GPU's alias device_type against the host's
    sriov_totalvfs (type-PF above 0, else type-PCI) when a host is read:
    without --ledger, or with --ledger and --sysfs-root. Exit status 1 when
    there is drift.
    """

    drift = False

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _add_inventory_args(parser)
        _add_ledger_args(parser, host=False)
        parser.add_argument('--usage', action='store_true',
                            help='list usage per GPU instead of findings')
        return parser

    def take_action(self, parsed_args: argparse.Namespace
                    ) -> tuple[Sequence[str], Iterable[Sequence[Any]]]:
        backend = load_backend(self.app)
        ledger = _ledger(parsed_args)
        inventories: list[HostInventory] = []
        if ledger is None or parsed_args.sysfs_root or \
                _from_files(parsed_args):
            inventories = _every(self.app, parsed_args)
        if ledger is not None:
            plans = nova_plan.plan_from_ledger(
                ledger, backend.naming,
                av_main.app_conf(self.app).nova.dedicated_device_type)
        else:
            plans = tuple(backend.plan(inventory)
                          for inventory in inventories)
        report = backend.audit(plans, inventories)
        self.drift = bool(report.findings)
        self.app.stderr.write('%d host(s), %d finding(s), %d Placement '
                              'call(s)\n' % (len(report.hosts),
                                             len(report.findings),
                                             report.api_calls))
        if parsed_args.usage:
            return (('Host', 'GPU', 'Provider', 'Resource class', 'Total',
                     'Used'),
                    [(u.host, u.address, u.provider, u.resource_class,
                      u.total, u.used) for u in report.usage])
        return (('Host', 'Provider', 'Finding', 'Expected', 'Actual'),
                [(f.host, f.provider, f.kind.value, f.expected, f.actual)
                 for f in report.findings])

    def run(self, parsed_args: argparse.Namespace) -> int:
        result = super().run(parsed_args)
        return 1 if self.drift and not result else int(result)


class NovaDrainCheck(command.Command):
    """Refuse a role change while Placement shows the GPU in use.

    Otherwise print the ordered steps of a safe role change.
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument('--gpu', required=True, metavar='ADDR',
                            help='PCI address of the GPU (its PF), e.g. '
                                 '0000:85:00.0')
        parser.add_argument('--host', metavar='NAME',
                            help='compute node name (default: [inventory] '
                                 'hostname or this machine\'s name)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        # A mistyped address is refused before any request is made.
        gpu = PciAddress.parse(parsed_args.gpu)
        backend = load_backend(self.app)
        conf = av_main.app_conf(self.app)
        host = (parsed_args.host or conf.inventory.hostname
                or socket.gethostname())
        try:
            result = backend.drain_check(host, gpu)
        except exception.UnsafeRoleChange as err:
            self.app.stderr.write('%s\n' % err)
            return 1
        self.app.stdout.write('%s\n' % result)
        return 0
