"""Where the hosts' inventories come from.

Every command that needs the inventories of several hosts (``plan``,
``explain``, ``apply``, ``audit``, ``move`` and the ``nova`` commands)
reads them through :class:`Inventories`, from one :class:`Source`:

* a fleet file of simulated hosts (``--fleet FILE``, the format of
  ``simulate-host --fleet``), or the embedded sample fleet when no source
  is given at all;
* a directory of inventory snapshots (``--snapshot-dir DIR``), one per
  host, ``DIR/<host>.json`` (or ``.yaml``/``.yml``) as ``amdgpu-virt
  inventory -f json`` writes it on each host;
* one host read live (``--sysfs-root DIR``, or the configured inventory
  driver): it replaces (or adds to) the host of the same name from the
  fleet file or the snapshots.

Loading a fleet file or a snapshot directory is pure apart from reading
the files; the live host is a callable given by the caller (it is built
on an inventory driver, see :class:`LiveHost`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt import inventory as inventory_pkg
from amdgpu_virt.inventory import fleet as av_fleet
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.model import HostInventory

SNAPSHOT_SUFFIXES = ('.json', '.yaml', '.yml')
#: the most snapshot files one directory may hold (a crafted directory
#: must not make a command read without end)
MAX_SNAPSHOTS = 100_000
#: the most skipped entries of a snapshot directory reported one by one
MAX_SKIPPED = 100


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the inventories come from (at most one of ``fleet`` and
    ``snapshot_dir``; ``live`` may come with either).

    :param fleet: fleet file of simulated hosts.
    :param snapshot_dir: directory of snapshot files ``<host>.json``.
    :param live: a description of the host read live (``sysfs tree
        DIR``), for messages; the reader itself is given to
        :class:`Inventories`.
    """

    fleet: str | None = None
    snapshot_dir: str | None = None
    live: str | None = None

    def __post_init__(self) -> None:
        if self.fleet and self.snapshot_dir:
            raise exception.InventoryError(
                source='--fleet %s' % self.fleet,
                reason='give either a fleet file or --snapshot-dir %s, not '
                'both' % self.snapshot_dir)

    @property
    def sample(self) -> bool:
        """True when the embedded sample fleet is used."""
        return not (self.fleet or self.snapshot_dir or self.live)

    def __str__(self) -> str:
        parts = []
        if self.snapshot_dir:
            parts.append('--snapshot-dir %s' % self.snapshot_dir)
        elif self.fleet:
            parts.append('--fleet %s' % self.fleet)
        elif self.sample:
            parts.append('the sample fleet')
        if self.live:
            parts.append(self.live)
        return ' and '.join(parts)


def snapshot_path(directory: str, host: str) -> str | None:
    """The snapshot file of ``host`` in ``directory``, if there is one."""
    if not host or host.startswith('.') or os.sep in host or (
            os.altsep and os.altsep in host):
        return None
    for suffix in SNAPSHOT_SUFFIXES:
        path = os.path.join(directory, host + suffix)
        if os.path.isfile(path):
            return path
    return None


def _check_dir(directory: str) -> None:
    """:raises FileInputError: ``directory`` is missing or is not one."""
    if not os.path.isdir(directory):
        raise exception.FileInputError(
            what='--snapshot-dir', path=directory,
            reason='it is not a directory' if os.path.exists(directory)
            else 'no such directory')


def snapshot_files(directory: str, skipped: list[str] | None = None
                   ) -> list[tuple[str, str]]:
    """``(host, path)`` of every snapshot file of ``directory``, by host.

    Files whose names do not end in a snapshot suffix, hidden files and
    entries that are not regular files are not snapshots and are left
    out.

    :param skipped: gets one sentence per entry left out, naming it.

    :raises InventoryError: not a directory, too many files, or two files
        for one host (naming both).
    """
    _check_dir(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError as err:
        raise exception.InventoryError(
            source='--snapshot-dir %s' % directory,
            reason='cannot list it: %s' % (err.strerror or err)) from None
    found: dict[str, str] = {}
    for name in names:
        stem, suffix = os.path.splitext(name)
        path = os.path.join(directory, name)
        if suffix not in SNAPSHOT_SUFFIXES or not stem or \
                name.startswith('.'):
            if skipped is not None and len(skipped) < MAX_SKIPPED:
                skipped.append('%s: skipped, not a snapshot (a snapshot is '
                               '<host>%s)' % (path, '|'.join(
                                   SNAPSHOT_SUFFIXES)))
            continue
        if not os.path.isfile(path):
            if skipped is not None and len(skipped) < MAX_SKIPPED:
                skipped.append('%s: skipped, not a regular file' % path)
            continue
        if stem in found:
            raise exception.InventoryError(
                source=path, reason='a second snapshot of host %s (%s is '
                'the first)' % (stem, found[stem]))
        found[stem] = path
        if len(found) > MAX_SNAPSHOTS:
            raise exception.InventoryError(
                source='--snapshot-dir %s' % directory,
                reason='more than %d snapshot files' % MAX_SNAPSHOTS)
    return sorted(found.items())


def load_snapshot(path: str, host: str) -> HostInventory:
    """The snapshot ``path``, which must be of ``host``.

    :raises SnapshotError: unusable file, naming the field.
    :raises InventoryError: the snapshot is of another host.
    """
    inventory = snapshot.load(path)
    if inventory.hostname != host:
        raise exception.InventoryError(
            source=path, reason='it is a snapshot of host %s, but the file '
            'name says %s (name it %s.json)' % (inventory.hostname, host,
                                                inventory.hostname))
    return inventory


def load_snapshot_dir(directory: str, skipped: list[str] | None = None
                      ) -> list[HostInventory]:
    """Every host's inventory in ``directory``, sorted by host name.

    :param skipped: gets the entries that are not snapshots (see
        :func:`snapshot_files`) and, when given, the snapshot files that
        cannot be used (unreadable, not a snapshot, of another host), one
        sentence each naming the file and what is wrong: their hosts are
        left out. Without it such a file stops the load, as it does when
        no snapshot at all is usable.
    :raises AmdgpuVirtError: naming the directory or the file at fault.
    """
    hosts = []
    first: exception.InventoryError | None = None
    for host, path in snapshot_files(directory, skipped):
        try:
            hosts.append(load_snapshot(path, host))
        except exception.InventoryError as err:
            if skipped is None:
                raise
            first = first or err
            if len(skipped) < MAX_SKIPPED:
                skipped.append('%s: skipped, host %s left out: %s' % (
                    path, host, err))
    if first is not None and not hosts:
        raise first
    return hosts


class LiveHost:
    """One host read through an inventory driver, scanned on each call.

    :param conf: the configuration (``[inventory]`` options).
    :param host: the host the inventory must be of; None: whichever host
        the driver reports (``hostname``, ``[inventory] hostname`` or the
        machine's name).
    :param sysfs_root: use the sysfs driver on this tree instead of
        ``[inventory] driver``.
    :param hostname: the name the sysfs tree's host has, instead of
        ``[inventory] hostname`` (default: ``host``).
    :raises DriverNotFound: the inventory driver cannot be loaded.
    """

    def __init__(self, conf: cfg.ConfigOpts, host: str | None = None,
                 sysfs_root: str | None = None,
                 hostname: str | None = None) -> None:
        self.host = host
        name = hostname or conf.inventory.hostname or host
        if sysfs_root:
            self.where = 'sysfs tree %s' % sysfs_root
            self.driver = inventory_pkg.load_driver(
                conf, 'sysfs', root=sysfs_root, hostname=name)
        else:
            self.where = '[inventory] driver %s' % conf.inventory.driver
            self.driver = inventory_pkg.load_driver(conf)

    def __str__(self) -> str:
        return self.where

    def scan(self) -> HostInventory:
        """The host's inventory as it is now.

        :raises InventoryError: it cannot be read, or it is of another host
            (naming ``[inventory] hostname``).
        """
        inventory: HostInventory = self.driver.scan()
        if self.host is not None and inventory.hostname != self.host:
            raise exception.InventoryError(
                source=self.where, reason='it reads host %s, not %s (run '
                'the move on %s or set [inventory] hostname)' % (
                    inventory.hostname, self.host, self.host))
        return inventory


class Inventories:
    """The hosts' inventories from one :class:`Source`, read again on each
    call (a fresh snapshot after a reboot is what is checked).

    :param source: the fleet file or snapshot directory.
    :param live: reads one host live (its inventory replaces that host's
        from the fleet or the snapshots); its ``host`` attribute, when set,
        names the host it must read.
    """

    def __init__(self, source: Source,
                 live: LiveHost | None = None) -> None:
        self.source = source
        self.live = live
        #: entries of the snapshot directory the last read skipped
        self.skipped: list[str] = []
        self._read: str | None = None

    def _live(self) -> HostInventory | None:
        return self.live.scan() if self.live is not None else None

    def _others(self) -> list[HostInventory]:
        if self.source.snapshot_dir:
            self.skipped = []
            return load_snapshot_dir(self.source.snapshot_dir, self.skipped)
        if self.source.fleet or self.source.sample:
            return av_fleet.load_fleet(self.source.fleet)
        return []

    def every(self) -> list[HostInventory]:
        """Every host of the source, the live host last.

        :raises AmdgpuVirtError: an input is unusable (naming it).
        """
        live = self._live()
        self._read = live.hostname if live is not None else None
        hosts = [inv for inv in self._others()
                 if live is None or inv.hostname != live.hostname]
        if live is not None:
            hosts.append(live)
        return hosts

    def warnings(self, hosts: Iterable[HostInventory]) -> list[str]:
        """What was odd in the last :meth:`every` of ``hosts``: the
        snapshot files skipped, and the inventory warnings of the hosts
        read from snapshots or live (simulated hosts have none worth
        telling)."""
        result = list(self.skipped)
        if len(self.skipped) >= MAX_SKIPPED:
            result.append('--snapshot-dir %s: more entries skipped, not '
                          'listed' % self.source.snapshot_dir)
        for inv in hosts:
            if not (self.source.snapshot_dir or inv.hostname == self._read):
                continue
            result.extend('inventory of host %s (%s): %s: %s' % (
                inv.hostname, inv.source or 'snapshot', w.culprit,
                w.message) for w in inv.warnings)
        return result

    def all(self, hosts: Iterable[str]) -> dict[str, HostInventory]:
        """Inventories of those of ``hosts`` that have one.

        :raises AmdgpuVirtError: an input is unusable (naming it).
        """
        wanted = list(dict.fromkeys(hosts))
        result: dict[str, HostInventory] = {}
        live = self.live
        if live is not None and (live.host is None or live.host in wanted):
            found = live.scan()
            if found.hostname in wanted:
                result[found.hostname] = found
        rest = [h for h in wanted if h not in result]
        if not rest:
            return result
        directory = self.source.snapshot_dir
        if directory:
            _check_dir(directory)
            for host in rest:
                path = snapshot_path(directory, host)
                if path is not None:
                    result[host] = load_snapshot(path, host)
        elif self.source.fleet or self.source.sample:
            names = set(rest)
            result.update({inv.hostname: inv for inv in
                           av_fleet.load_fleet(self.source.fleet)
                           if inv.hostname in names})
        return result

    def of(self, host: str) -> HostInventory:
        """The inventory of ``host`` as it is now.

        :raises InventoryError: there is none (naming where it looked).
        """
        found = self.all([host]).get(host)
        if found is None:
            raise exception.InventoryError(
                source=host, reason='no inventory in %s' % self.source)
        return found

