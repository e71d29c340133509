"""``amdgpu-virt move``: change the role of one GPU safely (resumable).

The workflow is :mod:`amdgpu_virt.pool.move`; this command wires it to
the real adapters (Nova snippet and Placement, the Kubernetes ledger
ConfigMap and node registration, the host's inventory) and to the state
file, and turns its outcome into the exit statuses of
:mod:`amdgpu_virt.cmd.exitcodes`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from cliff import command

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.cmd import nova as cmd_nova
from amdgpu_virt.cmd import pool as cmd_pool
from amdgpu_virt.cmd import sources as cmd_sources
from amdgpu_virt.model import Role
from amdgpu_virt.pool import hostchange
from amdgpu_virt.pool import move as pool_move


def parse_gpu(text: str) -> tuple[str, str]:
    """``HOST:ADDR`` -> (host, address text).

    :raises UsageError: naming the option and the value.
    """
    host, sep, address = text.partition(':')
    if not sep or not host or not address:
        raise exception.UsageError(option='--gpu %s' % text,
                                   reason='expected HOST:ADDR, e.g. '
                                   'gim-0:0000:05:00.0')
    return host, address


def target(old: av_ledger.GpuAssignment, args: argparse.Namespace,
           source: str) -> av_ledger.GpuAssignment:
    """The new assignment of the GPU, validated as a ledger entry.

    :raises PlanError: naming the option that is wrong.
    """
    raw: dict[str, Any] = {'address': str(old.address), 'model': old.model,
                           'role': args.to}
    for option in ('vf_count', 'compute_mode', 'memory_mode'):
        value = getattr(args, option)
        if value is not None:
            raw[option] = value
    data = {'version': av_ledger.LEDGER_VERSION,
            'hosts': {old.host: {'gpus': [raw]}}}
    (new,) = av_ledger.from_dict(data, source='%s (--to %s)' % (
        source, args.to)).assignments
    return new


class Move(command.Command):
    """Change the role of one GPU safely: drain, withdraw, change, offer.

    Runs the steps that can run now and says where it waits; run it again
    to continue. Exit status: 0 done; 1 refused (the GPU is in use, or
    another move of it is recorded); 69 Placement, Nova or the Kubernetes
    API unreachable (the step was not recorded: run again when it is
    back); 75 waiting for a side or the host; other errors as in
    amdgpu-virt --help (64 usage, 65 bad input, 66 missing input, 70
    internal, 76 API error, 78 configuration).
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument('--ledger', metavar='FILE', required=True,
                            help='the role ledger (YAML); updated when the '
                                 'move completes')
        parser.add_argument('--gpu', metavar='HOST:ADDR', required=True,
                            help='the GPU, e.g. gim-0:0000:05:00.0')
        parser.add_argument('--to', required=True,
                            choices=[r.value for r in Role],
                            help='the new role')
        parser.add_argument('--vf-count', type=int, metavar='N',
                            help='VFs of the GPU (role nova-vf)')
        parser.add_argument('--compute-mode', metavar='MODE',
                            help='compute partition mode (k8s roles)')
        parser.add_argument('--memory-mode', metavar='MODE',
                            help='memory (NPS) mode')
        parser.add_argument('--state-dir', metavar='DIR',
                            help='where the move records its steps '
                                 '(default: [pool] state_dir, itself '
                                 '"amdgpu-virt-moves" by default)')
        parser.add_argument('--output-dir', metavar='DIR',
                            help='where re-rendered files go (default: '
                                 '[pool] output_dir, itself '
                                 '"amdgpu-virt-out" by default)')
        cmd_sources.add_arguments(parser, live=True)
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        conf = av_main.app_conf(self.app)
        out = self.app.stdout
        host, address = parse_gpu(parsed_args.gpu)
        inventories = cmd_sources.inventories(self.app, parsed_args, host)
        ledger, _found = cmd_pool.load_ledger(parsed_args.ledger, inventories)
        state_dir = parsed_args.state_dir or conf.pool.state_dir
        output_dir = parsed_args.output_dir or conf.pool.output_dir
        old = ledger.get(host, address)
        if old is None:
            raise exception.PlanError(
                source=parsed_args.ledger, reason='no GPU %s in the ledger'
                % parsed_args.gpu)
        os.makedirs(state_dir, exist_ok=True)
        state = os.path.join(state_dir, 'move-%s-%s.json' % (
            host, str(old.address).replace(':', '-')))
        new = target(old, parsed_args, parsed_args.ledger)
        if old == new:
            if os.path.exists(state):
                # the ledger was updated but the run ended before the
                # state file was closed
                os.replace(state, state + '.done')
            out.write('%s already has role %s; nothing to do\n' % (
                old.gpu, new.role.value))
            return 0
        after = ledger.replace(new)
        av_ledger.check_hardware(after, inventories.all([host]).values(),
                                 '%s (after the move)' % parsed_args.ledger)
        sides: dict[str, Any] = {}
        needed = {old.role.side, new.role.side} - {None}
        renderer = None
        if 'nova' in needed or any(a.role.side == 'nova'
                                   for a in after.for_host(host)):
            from amdgpu_virt.nova import pool as nova_pool
            backend = cmd_nova.load_backend(self.app)
            renderer = nova_pool.NovaRenderer(backend)
            if 'nova' in needed:
                sides['nova'] = nova_pool.NovaPool(
                    backend, ledger, inventories.of, output_dir)
        if 'k8s' in needed:
            from amdgpu_virt.k8s.pool import side as k8s_pool
            sides['k8s'] = k8s_pool.KubernetesPool(
                cmd_pool.core_api(self.app), cmd_pool.location(self.app),
                ledger, dra_driver=av_main.app_conf(self.app).dra.driver_name)
        host_adapter = hostchange.InventoryHost(inventories.of, ledger,
                                                renderer, output_dir)
        work = pool_move.Move(state, old, new, sides, host_adapter)
        before = len(work.history)
        result = work.run()
        for record in result.history[before:]:
            out.write('step %s: %s%s\n' % (record.step.value, record.outcome,
                                           ' (%s)' % record.note
                                           if record.note else ''))
        for side in sides.values():
            for note in side.notes:
                out.write('  %s\n' % note)
        out.write('%s\n' % result.message)
        if result.status is pool_move.Status.REFUSED:
            out.write('nothing was changed; state in %s\n' % state)
            return cmd_pool.EXIT_REFUSED
        if result.status is pool_move.Status.WAITING:
            out.write('waiting at step %s; run the same command again to '
                      'continue (state in %s)\n' % (
                          result.step.value if result.step else '-', state))
            return cmd_pool.EXIT_WAITING
        data = yamlutil.load_file(parsed_args.ledger)
        extra = {k: v for k, v in data.items() if k not in ('version',
                                                            'hosts')} \
            if isinstance(data, Mapping) else {}
        if av_ledger.save(after, parsed_args.ledger, extra):
            out.write('updated %s\n' % parsed_args.ledger)
        os.replace(state, state + '.done')
        return 0
