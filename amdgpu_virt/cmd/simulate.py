"""``amdgpu-virt simulate-host``: write the sysfs tree of a simulated host.

The tree can then be read with ``amdgpu-virt inventory --sysfs-root DIR``
(or ``[inventory] sysfs_root = DIR``), without any GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil

from cliff import command

from amdgpu_virt import catalog
from amdgpu_virt import exception
from amdgpu_virt.inventory import fleet
from amdgpu_virt.inventory import simulate

#: Top-level directories a simulated tree consists of; --force removes
#: only these from the output directory.
TREE_DIRS = ('bus', 'class', 'devices', 'kernel', 'module')


def _gpu_count(value: str) -> int:
    """``--gpus``: an integer in 1..MAX_GPUS (checked before anything is
    built from it)."""
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            '%r is not an integer' % value[:40]) from None
    if not 1 <= count <= simulate.MAX_GPUS:
        raise argparse.ArgumentTypeError(
            '%s is out of range; allowed: 1..%d' % (value[:40],
                                                    simulate.MAX_GPUS))
    return count


class SimulateHost(command.Command):
    """Write a realistic sysfs tree for a simulated GPU host."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--model', default='MI300X', type=str.upper,
            metavar='MODEL',
            help='GPU model (%s); default MI300X' % ', '.join(
                catalog.names()))
        parser.add_argument('--gpus', type=_gpu_count, default=8,
                            help='number of GPUs (1..%d); default 8'
                            % simulate.MAX_GPUS)
        parser.add_argument(
            '--mode', default='spx', type=str.lower,
            choices=simulate.MODES,
            help='mode of every GPU: a bare-metal compute mode (amdgpu), '
                 'gim-<mode> (GIM with 1/2/4/8 VFs) or vfio (passthrough); '
                 'default spx')
        parser.add_argument(
            '--nps', default='nps1', type=str.lower,
            choices=simulate.NPS_MODES,
            help='memory mode of the bare-metal GPUs; default nps1')
        parser.add_argument(
            '--gpu-modes', metavar='M1,M2,...',
            help='one mode per GPU (a mixed host); overrides --mode and '
                 'sets --gpus to their number')
        parser.add_argument('--hostname', default='simulated-host',
                            help='host name of the simulated host; '
                                 'default simulated-host')
        parser.add_argument(
            '--legacy-xcp-names', action='store_true',
            help='name partition devices amdgpu_xcp.<i> as older kernels '
                 'do (default amdgpu_xcp_<i>)')
        parser.add_argument(
            '--fleet', metavar='PATH',
            help='write every host of this fleet file ("sample" for the '
                 'embedded sample fleet) into DIR/<hostname>, instead of '
                 'one host from the options above')
        parser.add_argument('--out', required=True, metavar='DIR',
                            help='directory to write the tree into '
                                 '(created if missing; a non-empty one is '
                                 'refused unless --force)')
        parser.add_argument(
            '--force', action='store_true',
            help='write into a non-empty DIR; a simulated tree already '
                 'there (%s) is removed first' % ', '.join(TREE_DIRS))
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        if parsed_args.fleet:
            path = None if parsed_args.fleet == 'sample' else \
                parsed_args.fleet
            specs = fleet.load_specs(path)
            for spec in specs:   # every host is possible before any is
                fleet.design(spec, path or 'the sample fleet')
            try:
                self._prepare(parsed_args.out, parsed_args.force)
            except OSError as err:
                raise exception.OutputError(
                    path=parsed_args.out, reason=err.strerror or str(err)
                ) from None
            for spec in specs:
                self._write(spec, os.path.join(parsed_args.out,
                                               spec.hostname),
                            parsed_args.legacy_xcp_names, force=True)
            return 0
        gpu_modes: tuple[str, ...] = ()
        gpus = parsed_args.gpus
        if parsed_args.gpu_modes:
            gpu_modes = tuple(m.strip().lower()
                              for m in parsed_args.gpu_modes.split(','))
            gpus = len(gpu_modes)
        spec = simulate.HostSpec(
            hostname=parsed_args.hostname, model=parsed_args.model,
            gpus=gpus, mode=parsed_args.mode, nps=parsed_args.nps,
            gpu_modes=gpu_modes)
        self._write(spec, parsed_args.out, parsed_args.legacy_xcp_names,
                    parsed_args.force)
        return 0

    @staticmethod
    def _prepare(out: str, force: bool) -> None:
        """Refuse a non-empty ``out`` unless forced; clear an old tree."""
        if os.path.isdir(out) and os.listdir(out):
            if not force:
                raise exception.SimulationError(
                    reason='--out %s is not empty; use --force to write '
                    'into it' % out)
            for name in TREE_DIRS:
                path = os.path.join(out, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
        elif os.path.exists(out) and not os.path.isdir(out):
            raise exception.SimulationError(
                reason='--out %s is not a directory' % out)

    def _write(self, spec: simulate.HostSpec, out: str,
               legacy_xcp_names: bool, force: bool) -> None:
        inventory = simulate.design_host(spec)
        try:
            self._prepare(out, force)
            simulate.write_tree(inventory, out, legacy_xcp_names)
        except OSError as err:
            raise exception.OutputError(
                path=err.filename or out,
                reason='%s (--out %s)' % (err.strerror or err, out)
            ) from None
        self.app.stdout.write(
            'Wrote %s: %d x %s, %d partitions, %d VFs, to %s\n' % (
                spec.hostname, len(inventory.gpus), spec.model,
                inventory.partition_count, inventory.vf_count, out))
