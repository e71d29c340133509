"""``amdgpu-virt inventory``: list the AMD GPUs of this host.

The table is for people. ``-f json`` and ``-f yaml`` print the whole
inventory document instead (the form the ``snapshot`` driver reads), not
just the table rows. Warnings go to stderr; the exit status is non-zero
only when no GPU could be read.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

from cliff import lister

from amdgpu_virt import catalog
from amdgpu_virt import inventory as inventory_pkg
from amdgpu_virt import plugins
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.model import Driver
from amdgpu_virt.model import Gpu
from amdgpu_virt.model import HostInventory

COLUMNS = ('Address', 'Model', 'Driver', 'Mode', 'CUs', 'VRAM GiB',
           'Partitions', 'VFs', 'NUMA')
#: Formatters that print the full inventory document.
DOCUMENT_FORMATS = ('json', 'yaml')
MIB_PER_GIB = 1024


def _gib(mib: int | None) -> str:
    if mib is None:
        return ''
    return '%.1f' % (mib / MIB_PER_GIB)


def mode_of(gpu: Gpu) -> str:
    """Compute/memory mode, the VF mode under GIM, or how it is bound."""
    if gpu.driver is Driver.GIM:
        mode = catalog.VF_COUNT_MODES.get(len(gpu.vfs), '?')
        return '%s (%d VF%s)' % (mode, len(gpu.vfs),
                                 '' if len(gpu.vfs) == 1 else 's')
    if gpu.driver is Driver.VFIO_PCI:
        return 'passthrough'
    if gpu.compute_partition:
        return '%s/%s' % (gpu.compute_partition,
                          gpu.memory_partition or '?')
    return ''


def row_of(gpu: Gpu) -> tuple[Any, ...]:
    cus: str = '' if gpu.compute_units is None else str(gpu.compute_units)
    vram = _gib(gpu.vram_mib)
    if gpu.driver is Driver.GIM and gpu.vfs:
        vf_cus, vf_mib = catalog.vf_size(gpu.model, len(gpu.vfs))
        cus = '' if vf_cus is None else '%d per VF' % vf_cus
        vram = '' if vf_mib is None else '%s per VF' % _gib(vf_mib)
    return (str(gpu.address), gpu.model.name, gpu.driver.value,
            mode_of(gpu), cus, vram, len(gpu.partitions), len(gpu.vfs),
            '' if gpu.numa_node is None else gpu.numa_node)


class Inventory(lister.Lister):
    """List the AMD GPUs, partitions and VFs of this host.

    Warnings about odd files go to stderr. "-f json" and "-f yaml" print the
    whole inventory, the form the snapshot driver reads back. Exit status 1
    only when no AMD GPU could be read at all.
    """

    inventory: HostInventory | None = None

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--sysfs-root', metavar='DIR',
            help='sysfs driver: read this tree instead of [inventory] '
                 'sysfs_root (/sys), e.g. one written by "amdgpu-virt '
                 'simulate-host"')
        parser.add_argument(
            '--driver', metavar='NAME',
            choices=plugins.available(inventory_pkg.NAMESPACE) or None,
            help='inventory driver: sysfs (reads /sys), amdsmi (needs ROCm '
                 'and the amdsmi package) or snapshot (loads --snapshot); '
                 'default: [inventory] driver (sysfs)')
        parser.add_argument(
            '--snapshot', metavar='PATH',
            help='snapshot driver: the file to load (written by '
                 '"amdgpu-virt inventory -f json" or -f yaml) instead of '
                 '[inventory] snapshot_path')
        parser.add_argument(
            '--hostname', metavar='NAME',
            help='host name to report instead of [inventory] hostname '
                 '(default: this machine\'s name)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace
                    ) -> tuple[Sequence[str], Iterable[Sequence[Any]]]:
        conf = av_main.app_conf(self.app)
        for option, value in (('sysfs_root', parsed_args.sysfs_root),
                              ('snapshot_path', parsed_args.snapshot),
                              ('hostname', parsed_args.hostname)):
            if value:
                conf.set_override(option, value, group='inventory')
        driver = inventory_pkg.load_driver(conf, parsed_args.driver)
        found = driver.scan()
        self.inventory = found
        for warning in found.warnings:
            self.app.stderr.write('warning: %s\n' % warning)
        return COLUMNS, [row_of(gpu) for gpu in found.gpus]

    def produce_output(self, parsed_args: argparse.Namespace,
                       column_names: Sequence[str], data: Any) -> int:
        if (parsed_args.formatter in DOCUMENT_FORMATS
                and self.inventory is not None):
            self.app.stdout.write(snapshot.dumps(self.inventory,
                                                 parsed_args.formatter))
            return 0
        return super().produce_output(parsed_args, column_names, data)
