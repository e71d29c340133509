"""``amdgpu-virt k8s dra-slices`` and ``amdgpu-virt k8s dra-plugin``.

``k8s dra-slices`` prints, without any cluster, the ResourceSlices (and
with ``--classes`` the DeviceClasses) the DRA plugin would publish for a
host; ``k8s dra-plugin`` runs the DRA kubelet plugin until SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import yaml
from cliff import command

from amdgpu_virt import exception
from amdgpu_virt import inventory as inventory_pkg
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import plugins
from amdgpu_virt.cmd import k8s as cmd_k8s
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.k8s.dra import served

LOG = logging.getLogger(__name__)

#: stevedore namespace of DRA plugin implementations ([dra] plugin)
PLUGIN_NAMESPACE = 'amdgpu_virt.k8s.dra'


def load_plugin(conf: Any, inventory: Any) -> Any:
    """The DRA plugin named by ``[dra] plugin`` (stevedore).

    :raises DriverNotFound: naming the plugin and the known ones.
    """
    return plugins.load_driver(PLUGIN_NAMESPACE, conf.dra.plugin, conf,
                               inventory)


class DraSlices(command.Command):
    """Print the ResourceSlices the DRA plugin would publish for a host.

    Reads the host with the inventory driver ([inventory], or --sysfs-root
    / --snapshot) and the roles of its GPUs from --ledger: only GPUs whose
    role is k8s-dedicated or k8s-shared are published; without --ledger
    every amdgpu-driven GPU is k8s-dedicated. What is published depends on
    the Kubernetes release the slices are for (--release, with its default
    feature gates, changed by --feature-gates): whole GPUs always;
    partitions beside their whole GPU where DRAPartitionableDevices is on
    (1.36 and later), else as [dra] partitions_without_counters says;
    shares of k8s-shared GPUs where DRAConsumableCapacity is on (1.36 and
    later). Every device carries the PCIe root complex read from the
    sysfs tree (not from a snapshot). Reads [dra] driver_name,
    partition_devices, partitions_without_counters, memory_step_mib,
    slice_layout and, with --classes, extended_resource_name. Prints YAML
    documents (resource.k8s.io/v1) after a comment saying what the
    release keeps; what a GPU does not offer there is a warning.
    """

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        source = parser.add_mutually_exclusive_group()
        source.add_argument(
            '--sysfs-root', metavar='DIR',
            help='read this sysfs tree instead of [inventory] sysfs_root '
                 '(/sys), e.g. one written by "amdgpu-virt simulate-host"')
        source.add_argument(
            '--snapshot', metavar='FILE',
            help='load this saved inventory ("amdgpu-virt inventory -f '
                 'json") instead of scanning')
        parser.add_argument(
            '--ledger', metavar='FILE',
            help='role ledger (YAML); only its k8s-* GPUs of this host are '
                 'published. Default: every amdgpu-driven GPU, as '
                 'k8s-dedicated (whole, and partitioned GPUs\' partitions '
                 'where the release keeps counters)')
        parser.add_argument(
            '--node', metavar='NAME',
            help='node (and ledger host) name; default: the inventory\'s '
                 'host name ([inventory] hostname or this machine\'s)')
        parser.add_argument(
            '--generation', metavar='N', type=int, default=1,
            help='pool generation to write (default 1)')
        parser.add_argument(
            '--release', metavar='X.Y', default='%d.%d' % served.NEWEST,
            help='the Kubernetes release of the API server, e.g. 1.34: its '
                 'default feature gates and its counter layout decide what '
                 'is published. Default: %d.%d (the same for later '
                 'releases)' % served.NEWEST)
        parser.add_argument(
            '--feature-gates', metavar='GATES', default='',
            help='feature gates of the API server that differ from the '
                 'release\'s defaults, as kube-apiserver takes them: '
                 '"DRAPartitionableDevices=true,DRAConsumableCapacity='
                 'true"')
        parser.add_argument(
            '--layout', choices=('mixed', 'separate'),
            help='where counter sets go: "mixed" (beside the devices that '
                 'consume them, Kubernetes 1.34) or "separate" (slices of '
                 'their own, 1.35 and later). Default: [dra] slice_layout, '
                 'and the release\'s when that is "auto"')
        parser.add_argument(
            '--classes', action='store_true',
            help='also print the three DeviceClasses (whole GPU, partition, '
                 'share)')
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        from amdgpu_virt.k8s.dra import classes
        from amdgpu_virt.k8s.dra import devices
        from amdgpu_virt.k8s.dra import slices

        conf = av_main.app_conf(self.app)
        release = served.parse_release(parsed_args.release)
        gates = served.parse_gates(parsed_args.feature_gates)
        if release < served.OLDEST:
            raise exception.UsageError(
                option='--release', reason='DRA (resource.k8s.io/v1) needs '
                'Kubernetes %d.%d or later' % served.OLDEST)
        name = None
        if parsed_args.sysfs_root:
            conf.set_override('sysfs_root', parsed_args.sysfs_root,
                              group='inventory')
        if parsed_args.snapshot:
            conf.set_override('snapshot_path', parsed_args.snapshot,
                              group='inventory')
            name = 'snapshot'
        found = inventory_pkg.load_driver(conf, name).scan()
        for warning in found.warnings:
            self.app.stderr.write('warning: %s\n' % warning)
        node = parsed_args.node or found.hostname
        assignments = None
        if parsed_args.ledger:
            ledger = av_ledger.load(parsed_args.ledger)
            if node not in ledger.hosts:
                self.app.stderr.write(
                    'warning: host %s is not in ledger %s (hosts: %s), so '
                    'no GPU is published; give the ledger\'s name with '
                    '--node\n' % (node, parsed_args.ledger,
                                  ', '.join(ledger.hosts) or 'none'))
            assignments = ledger.for_host(node)
        group = conf.dra
        roots = None
        if name is None:
            from amdgpu_virt.inventory import sysfs
            roots = sysfs.pcie_roots(conf.inventory.sysfs_root,
                                     (g.address for g in found.gpus))
        layout = parsed_args.layout or group.slice_layout
        kept = served.for_release(
            release, gates,
            None if layout == 'auto' else served.Layout(layout))
        plan = devices.plan(node, found, assignments,
                            partition_devices=group.partition_devices,
                            pcie_roots=roots, served=kept,
                            without_counters=group.partitions_without_counters)
        for held in plan.withheld:
            self.app.stderr.write('warning: %s (Kubernetes %d.%d)\n'
                                  % ((held,) + release))
        docs = slices.build(plan, group.driver_name,
                            generation=parsed_args.generation,
                            memory_step_mib=group.memory_step_mib,
                            layout=kept.layout)
        if parsed_args.classes:
            docs = classes.device_classes(
                group.driver_name, group.extended_resource_name) + docs
        if not docs:
            self.app.stderr.write('warning: node %s offers no GPU through '
                                  'DRA\n' % node)
            return 0
        self.app.stdout.write(
            '# Kubernetes %d.%d%s keeps %s.\n' % (
                release + (' with %s' % parsed_args.feature_gates
                           if gates else '', kept.describe())))
        self.app.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
        return 0


class DraPlugin(command.Command):
    """Serve the DRA kubelet plugin for this node's AMD GPUs.

    Runs until SIGTERM/SIGINT: registers with kubelet in [dra]
    registration_dir, serves the DRA and health services on a socket in
    [dra] plugin_dir, publishes the node's ResourceSlices and prepares
    claims (CDI specs in [dra] cdi_dir, state in [dra] state_file). Reads
    [dra], [inventory], [kubernetes] (node_name, kubeconfig,
    ledger_source, vgpu_library, device_root), [pool] (the ledger
    ConfigMap) and [sharing] cu_strategy.
    """

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        conf = av_main.app_conf(self.app)
        inventory = inventory_pkg.load_driver(conf).scan()
        return cmd_k8s.run_until_signalled(load_plugin(conf, inventory))
