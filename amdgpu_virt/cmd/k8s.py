"""``amdgpu-virt k8s ...``: the Kubernetes daemons.

``k8s device plugin`` runs the kubelet device plugin on a node,
``k8s agent`` keeps the node's GPU registration up to date,
``k8s webhook`` serves the admission webhook and ``k8s scheduler`` the
kube-scheduler extender. Each runs until SIGTERM or SIGINT and then shuts
down cleanly.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from cliff import command

from amdgpu_virt import inventory as inventory_pkg
from amdgpu_virt.cmd import main as av_main

LOG = logging.getLogger(__name__)


def _until_signalled() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        LOG.info('Signal %d received; stopping', signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def run_until_signalled(service: Any) -> int:
    """``service.start()``, wait for SIGTERM/SIGINT, ``service.stop()``."""
    stop = _until_signalled()
    service.start()
    try:
        stop.wait()
    finally:
        service.stop()
    return 0


class DevicePlugin(command.Command):
    """Serve the kubelet device plugin for this node's AMD GPUs.

    Runs until SIGTERM/SIGINT. Reads [inventory] (which GPUs this node
    has), [kubernetes] (resource name, plugin directory and socket,
    share_count slots per GPU, allocation_mode, vgpu_library, ledger_source
    and the kubeconfig used to read pods), [pool] (the ledger ConfigMap)
    and [sharing] cu_strategy (how CUs are chosen for shared requests).
    Set the options in the file given with --config-file.
    """

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        from amdgpu_virt.k8s.node import deviceplugin

        conf = av_main.app_conf(self.app)
        inventory = inventory_pkg.load_driver(conf).scan()
        plugin = deviceplugin.from_conf(conf, inventory)
        return run_until_signalled(plugin)


class Agent(command.Command):
    """Register this node's AMD GPUs for the scheduler (HAMi protocol).

    Runs until SIGTERM/SIGINT, writing hami.io/node-amd-register and the
    amd.com/gpu.* node labels every [kubernetes] registration_interval
    seconds, with each GPU's health ([health]: device nodes, RAS
    counters, optionally AMD's exporter); an unhealthy GPU is registered
    health: false and shown on the node (label amdgpu-virt.io/gpu-health,
    condition AMDGPUUnhealthy, an Event). Serves the node's Prometheus
    metrics on [telemetry] metrics_port. Reads [inventory], [kubernetes]
    (node_name, kubeconfig, share_count, allocation_mode, vgpu_library,
    memory_enforcement, cgroup_root, ledger_source), [health], [telemetry]
    and [pool] (the ledger ConfigMap). Each GPU's memory enforcement level
    (kernel, hook, kernel+hook or none) is registered and the weakest
    labels the node (amdgpu-virt.io/memory-enforcement); when the GPUs do
    not meet memory_enforcement it registers whole GPUs only and records a
    Warning event on the node saying why. Without a loadable vgpu_library
    it also labels the node amdgpu-virt.io/memory-hook=unavailable.
    """

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        from amdgpu_virt.k8s.node import agent
        from amdgpu_virt.k8s.node import enforcement
        from amdgpu_virt.k8s.node import memhook

        conf = av_main.app_conf(self.app)
        inventory = inventory_pkg.load_driver(conf).scan()
        node_agent = agent.from_conf(conf, inventory)
        memhook.publish(node_agent)
        enforcement.publish(node_agent)
        return run_until_signalled(node_agent)


class Webhook(command.Command):
    """Serve the admission webhook for pods requesting AMD GPUs.

    Runs until SIGTERM/SIGINT. Reviews pod CREATE and UPDATE (the
    ephemeral containers of kubectl debug included); turns a pod's
    gpu.amd.com/workload annotation, or each container's
    workload.gpu.amd.com/<container>, into resources with the policy
    engine. Reads [kubernetes] (webhook_host, webhook_port,
    webhook_cert_file, webhook_key_file, scheduler_name,
    webhook_managed_resources, isolated_namespace_label,
    webhook_exempt_namespaces, webhook_allocation_writers) and [policy].
    """

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        from amdgpu_virt.k8s.admission import webhook

        conf = av_main.app_conf(self.app)
        server = webhook.from_conf(conf)
        stop = _until_signalled()
        thread = threading.Thread(target=server.serve_forever, daemon=True,
                                  name='webhook')
        thread.start()
        LOG.info('Webhook listening on %s:%d', *server.server_address[:2])
        try:
            stop.wait()
        finally:
            server.shutdown()
            server.server_close()
        return 0


class Scheduler(command.Command):
    """Serve the kube-scheduler extender (filter, prioritize, bind).

    Runs until SIGTERM/SIGINT with a watch-fed cache of nodes and pods.
    Reads [scheduler] (host, port, default node and GPU policies, node
    lock timeout and wait, watch timeout),
    [kubernetes] (kubeconfig, resource_name) and [sharing] cu_strategy.
    """

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        from amdgpu_virt.k8s.scheduler import service as extender

        conf = av_main.app_conf(self.app)
        service = extender.Service(conf)
        return run_until_signalled(service)


class InstallHook(command.Command):
    """Install the memory-limit hook library (LD_AUDIT) on this node.

    Checks --from (a loadable ELF shared object for this host), then
    makes --to hold it: nothing is written when it already holds the
    same bytes; otherwise a temporary copy in the same directory is
    written, synced, checked and renamed over it, so no process ever
    loads half a library. The directory of --to must exist and must not
    be a symbolic link. Exit statuses: 0 installed or up to date; 65 the
    source is not a usable library; 66 the source cannot be read; 73 the
    target cannot be written; 75 another install held the directory's
    lock. With --best-effort a failure is reported and the status is 0
    (the node then offers whole GPUs only, and says why).
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument('--from', dest='source', metavar='SRC',
                            required=True,
                            help='the library to install (e.g. in an '
                                 'image)')
        parser.add_argument('--to', dest='target', metavar='DST',
                            required=True,
                            help='where processes load it: [kubernetes] '
                                 'vgpu_library on the host')
        parser.add_argument('--best-effort', action='store_true',
                            help='report a failure and exit 0, so that the '
                                 'node pods start and offer whole GPUs')
        parser.add_argument('--message-file', metavar='FILE',
                            help='also write the outcome (one line) here, '
                                 'e.g. /dev/termination-log')
        parser.add_argument('--lock-timeout', type=float, metavar='SECONDS',
                            default=30.0,
                            help='how long to wait for another install '
                                 '(default: 30)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        from amdgpu_virt import exception
        from amdgpu_virt.k8s.node import hookinstall

        if not 0 <= parsed_args.lock_timeout <= 3600:
            raise exception.UsageError(option='--lock-timeout',
                                       reason='0 to 3600 seconds')
        try:
            done = hookinstall.install(
                parsed_args.source, parsed_args.target,
                lock_timeout=parsed_args.lock_timeout)
        except exception.HookInstallError as err:
            if not parsed_args.best_effort:
                _write_message(parsed_args.message_file, str(err))
                raise
            outcome = '%s; %s' % (err, _left_behind(parsed_args.target))
            self.app.stderr.write('warning: %s\n' % outcome)
            _write_message(parsed_args.message_file, outcome)
            return 0
        self.app.stdout.write('%s\n' % done)
        _write_message(parsed_args.message_file, str(done))
        return 0


def _left_behind(target: str) -> str:
    """What a failed install leaves at ``target``, for its message."""
    from amdgpu_virt.k8s.node import memhook

    status = memhook.check(target)
    if status.usable:
        return 'the library already at %s is kept' % target
    return ('nothing was changed, and without a usable library at %s the '
            'node offers whole GPUs only' % target)


def _write_message(path: str | None, text: str) -> None:
    """The outcome for ``kubectl describe pod`` (kubelet keeps 4 KiB)."""
    if not path:
        return
    try:
        with open(path, 'w', encoding='utf-8') as stream:
            stream.write(text[:4096])
    except OSError as err:
        LOG.warning('cannot write the outcome to %s: %s', path,
                    err.strerror)


class DmemHook(command.Command):
    """Cap a container's VRAM: the CDI createRuntime hook of DRA shares.

    The container runtime runs it on the host once it created the
    container's cgroup and before the container's process runs, with the
    container's OCI state on standard input. It finds the container's
    cgroup (/proc/<pid>/cgroup), enables the dmem controller down to it
    and writes each --cap into its dmem.max, read back. It exits non-zero
    (and the runtime fails the container's creation) when it cannot.
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            '--cap', action='append', default=[], metavar='REGION=BYTES',
            help='a VRAM cap, e.g. drm/0000:85:00.0/vram=8589934592 '
                 '(repeat for several GPUs; repeats of a region add up)')
        parser.add_argument(
            '--root', default='/',
            help='where the host\'s proc/ and sys/fs/cgroup are (default '
                 '/; [dra] dmem_hook_root)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        from amdgpu_virt.k8s.node import ocihook

        caps = ocihook.parse_caps(parsed_args.cap)
        state = sys.stdin.read(ocihook.MAX_STATE + 1)
        where, written = ocihook.run(state, caps, parsed_args.root)
        LOG.info('VRAM caps %s on %s', 'written' if written
                 else 'already in place', where)
        return 0
