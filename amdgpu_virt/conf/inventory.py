"""Options of the ``[inventory]`` group: how GPUs are discovered."""

from __future__ import annotations

from oslo_config import cfg

inventory_group = cfg.OptGroup(
    'inventory', title='GPU inventory',
    help='How amdgpu_virt discovers GPUs, partitions and VFs on a host.')

inventory_opts = [
    cfg.StrOpt('driver', default='sysfs',
               choices=[('sysfs', 'read /sys (default; no extra software)'),
                        ('amdsmi', 'ask ROCm through the amdsmi library'),
                        ('snapshot', 'load a saved inventory file')],
               help="""
Inventory driver, loaded from the ``amdgpu_virt.inventory`` entry point
namespace. ``sysfs`` reads PCI, amdgpu and KFD files below ``sysfs_root``;
``amdsmi`` needs ROCm's libamd_smi.so; ``snapshot`` loads ``snapshot_path``
as written by ``amdgpu-virt inventory -f json``.

Related options:

* sysfs_root, snapshot_path
"""),
    cfg.StrOpt('sysfs_root', default='/sys',
               help="""
Directory that holds the sysfs tree (``bus/pci/devices``,
``class/kfd/kfd/topology`` ...). Point it at a simulated tree written by
``amdgpu-virt simulate-host`` to test without hardware.

Related options:

* driver
"""),
    cfg.StrOpt('snapshot_path',
               help="""
Path of a saved inventory (JSON or YAML) for the ``snapshot`` driver.

Related options:

* driver
"""),
    cfg.HostnameOpt('hostname',
                    help="""
Name reported for this host. Defaults to the machine's host name. It must
match the compute node name Nova uses and the Kubernetes node name.
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(inventory_group)
    conf.register_opts(inventory_opts, group=inventory_group)


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    return [(inventory_group, inventory_opts)]
