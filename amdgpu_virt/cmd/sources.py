"""The inventory options every fleet command takes, defined once.

``plan``, ``explain``, ``apply``, ``audit``, ``move`` and the ``nova``
commands read the hosts' inventories through
:mod:`amdgpu_virt.inventory.sources`, from:

``--fleet FILE``
    a fleet file of simulated hosts;
``--snapshot-dir DIR``
    one snapshot per host, ``DIR/<host>.json``, as ``amdgpu-virt inventory
    -f json`` writes it on each host;
``--sysfs-root DIR`` (with ``--hostname NAME``)
    one host read from a sysfs tree, replacing that host of the fleet or
    the snapshots.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.inventory import sources

FLEET_HELP = ('the hosts\' inventories from a fleet file of simulated '
              'hosts (the format of "simulate-host --fleet")')
SAMPLE_HELP = ('; default, when neither this, --snapshot-dir nor '
               '--sysfs-root is given: the embedded sample fleet')
SNAPSHOT_HELP = ('the hosts\' inventories from snapshot files '
                 'DIR/<host>.json (or .yaml), as "amdgpu-virt inventory -f '
                 'json" writes them on each host')
SYSFS_HELP = ('read one host from this sysfs tree (the host\'s /sys, or '
              'one written by "amdgpu-virt simulate-host"); it replaces '
              'the host of the same name from --fleet or --snapshot-dir')
HOSTNAME_HELP = ('the name of the host --sysfs-root (or the inventory '
                 'driver) reads, instead of [inventory] hostname (default: '
                 'this machine\'s name); for Nova, the compute node name')


def add_arguments(parser: argparse.ArgumentParser, live: bool = False,
                  hostname: bool = True, note: str = '',
                  sample: bool = True) -> None:
    """Add ``--fleet``, ``--snapshot-dir``, ``--sysfs-root`` (and
    ``--hostname``) to ``parser``.

    :param live: also ``--live`` (the host read through the configured
        inventory driver), which excludes ``--sysfs-root``.
    :param hostname: add ``--hostname`` too.
    :param note: appended to every help text (e.g. when the options
        apply).
    :param sample: without any of them, the command uses the sample
        fleet (say so in the help).
    """
    files = parser.add_mutually_exclusive_group()
    files.add_argument('--fleet', metavar='FILE', help=FLEET_HELP + (
        SAMPLE_HELP if sample else '') + note)
    files.add_argument('--snapshot-dir', metavar='DIR',
                       help=SNAPSHOT_HELP + note)
    host = parser.add_mutually_exclusive_group() if live else parser
    if live:
        host.add_argument(
            '--live', action='store_true',
            help='read the inventory of the GPU\'s host through the '
                 '[inventory] driver of this machine (its sysfs_root, '
                 'snapshot_path and hostname options), again at each '
                 'check, instead of from --fleet or --snapshot-dir; run the '
                 'move on that host, or set [inventory] hostname to its '
                 'name')
    host.add_argument('--sysfs-root', metavar='DIR', help=SYSFS_HELP + note)
    if hostname:
        parser.add_argument('--hostname', metavar='NAME',
                            help=HOSTNAME_HELP + note)


def source_of(args: argparse.Namespace) -> sources.Source:
    """The :class:`~amdgpu_virt.inventory.sources.Source` the options
    name."""
    live = None
    if getattr(args, 'sysfs_root', None):
        live = 'sysfs tree %s' % args.sysfs_root
    elif getattr(args, 'live', False):
        live = 'the [inventory] driver'
    return sources.Source(fleet=getattr(args, 'fleet', None),
                          snapshot_dir=getattr(args, 'snapshot_dir', None),
                          live=live)


def this_host(app: Any, args: argparse.Namespace) -> str:
    """The name of the host the command runs for: ``--hostname``, else
    ``[inventory] hostname``, else the machine's name."""
    conf = av_main.app_conf(app)
    return str(getattr(args, 'hostname', None) or conf.inventory.hostname
               or socket.gethostname())


def inventories(app: Any, args: argparse.Namespace,
                host: str | None = None) -> sources.Inventories:
    """The inventories the options name.

    :param host: the host ``--sysfs-root``/``--live`` must read (``move``:
        the GPU's host); default: whichever host it is (``--hostname``,
        ``[inventory] hostname`` or the machine's name).
    :raises DriverNotFound: the inventory driver cannot be loaded.
    """
    conf = av_main.app_conf(app)
    live = None
    root = getattr(args, 'sysfs_root', None)
    if root or getattr(args, 'live', False):
        name = getattr(args, 'hostname', None)
        if host is None and root:
            name = this_host(app, args)
        live = sources.LiveHost(conf, host, root, name)
    return sources.Inventories(source_of(args), live)
