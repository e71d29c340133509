"""A simulated node while it runs: GPU load, RAS errors, container cgroups.

:func:`~amdgpu_virt.inventory.simtree.write_tree` lays out a host at
rest (idle telemetry, RAS counts of 0). The functions here change it the
way a running node does, below the same root:

* :func:`set_gpu` writes VRAM in use, load, temperatures and power;
* :func:`set_ras` writes a block's RAS counts (an uncorrectable error);
* :func:`enable_dmem` gives the cgroup hierarchy (``fs/cgroup``) the
  ``dmem`` controller with a region per GPU, and :func:`add_container`
  makes a container cgroup below a pod cgroup as kubelet does (systemd or
  cgroupfs driver, any QoS class) with its ``dmem.current``/``dmem.max``;
* :func:`plant` replaces a file with one of the :data:`HOSTILE` things a
  broken or hostile node can show in its place.

Values are written in the kernel's formats (see
:mod:`amdgpu_virt.inventory.readings`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from collections.abc import Sequence

from amdgpu_virt import exception
from amdgpu_virt.inventory import layout
from amdgpu_virt.inventory import podcgroups
from amdgpu_virt.inventory import readings
from amdgpu_virt.inventory import simtree
from amdgpu_virt.model import RasCount

#: what :func:`plant` can put in place of a file
HOSTILE = ('fifo', 'huge', 'garbage', 'binary', 'negative', 'inaccessible',
           'directory', 'dangling', 'loop', 'empty')
#: controllers a cgroup v2 root lists besides dmem
CONTROLLERS = 'cpuset cpu io memory hugetlb pids rdma misc'


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.islink(path) or os.path.isdir(path):
        _remove(path)
    with open(path, 'w', encoding='ascii') as out:
        out.write(text + '\n')


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def device_dir(root: str, address: str) -> str:
    """The PCI device directory of a GPU (following the bus link)."""
    return os.path.realpath(os.path.join(root, layout.PCI_DEVICES, address))


def hwmon_dir(root: str, address: str) -> str:
    """The GPU's ``hwmon/hwmon<N>`` directory.

    :raises SimulationError: the GPU has none (not bound to amdgpu).
    """
    base = os.path.join(device_dir(root, address), layout.HWMON_DIR)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        names = []
    if not names:
        raise exception.SimulationError(
            reason='GPU %s has no hwmon directory (is it bound to amdgpu?)'
            % address)
    return os.path.join(base, names[0])


def set_gpu(root: str, address: str, *, vram_used: int | None = None,
            busy: int | None = None, memory_busy: int | None = None,
            temperatures: Mapping[str, float] | None = None,
            power_watts: float | None = None) -> None:
    """Write what a busy GPU shows (only the values given).

    :param temperatures: sensor label (``junction``, ``mem``, ``edge``) ->
        degrees Celsius; a label the GPU has no sensor for is an error.
    :raises SimulationError: naming the GPU and the sensor.
    """
    directory = device_dir(root, address)
    if vram_used is not None:
        _write(os.path.join(directory, layout.MEM_INFO_VRAM_USED),
               str(vram_used))
    if busy is not None:
        _write(os.path.join(directory, layout.GPU_BUSY_PERCENT), str(busy))
    if memory_busy is not None:
        _write(os.path.join(directory, layout.MEM_BUSY_PERCENT),
               str(memory_busy))
    if temperatures is None and power_watts is None:
        return
    monitor = hwmon_dir(root, address)
    labels = {}
    for name in os.listdir(monitor):
        if name.startswith('temp') and name.endswith('_label'):
            with open(os.path.join(monitor, name), encoding='ascii') as f:
                labels[f.read().strip()] = name[:-len('_label')]
    for label, celsius in (temperatures or {}).items():
        if label not in labels:
            raise exception.SimulationError(
                reason='GPU %s has no %s sensor (it has %s)' % (
                    address, label, ', '.join(sorted(labels))))
        _write(os.path.join(monitor, labels[label] + '_input'),
               str(int(round(celsius * 1000))))
    if power_watts is not None:
        name = layout.POWER_INPUT if os.path.exists(os.path.join(
            monitor, layout.POWER_INPUT)) else layout.POWER_AVERAGE
        _write(os.path.join(monitor, name), str(int(power_watts * 1e6)))


def ras_path(root: str, address: str, block: str) -> str:
    return os.path.join(device_dir(root, address), layout.RAS_DIR,
                        block + layout.RAS_COUNT_SUFFIX)


def set_ras(root: str, address: str, block: str, uncorrectable: int = 0,
            correctable: int = 0, deferred: int = 0) -> None:
    """Write the RAS counts of one block of a GPU."""
    _write(ras_path(root, address, block), simtree.ras_text(RasCount(
        block, uncorrectable, correctable, deferred)))


def enable_dmem(root: str, capacities: Mapping[str, int]) -> str:
    """Give the cgroup hierarchy below ``root`` the dmem controller.

    :param capacities: GPU PCI address -> VRAM bytes (``dmem.capacity``).
    :returns: the cgroup root.
    """
    cgroup_root = os.path.join(root, layout.CGROUP_ROOT)
    _write(os.path.join(cgroup_root, layout.CGROUP_CONTROLLERS),
           CONTROLLERS + ' dmem')
    _write(os.path.join(cgroup_root, layout.DMEM_CAPACITY), '\n'.join(
        '%s %d' % (readings.vram_region(a), b)
        for a, b in sorted(capacities.items())))
    return cgroup_root


def add_container(root: str, pod_uid: str, container_id: str, *,
                  qos: podcgroups.QosClass = podcgroups.QosClass.BURSTABLE,
                  driver: podcgroups.Driver = podcgroups.Driver.SYSTEMD,
                  kubelet_root: Sequence[str] = (),
                  runtime: str = 'cri-containerd',
                  current: Mapping[str, int] | None = None,
                  limit: Mapping[str, int | None] | None = None) -> str:
    """Make a container cgroup as kubelet and the runtime do (the names
    of :mod:`amdgpu_virt.inventory.podcgroups`).

    :param kubelet_root: kubelet's ``--cgroup-root`` as name parts.
    :param current: GPU address -> bytes in use (``dmem.current``).
    :param limit: GPU address -> bytes or None for ``max`` (``dmem.max``).
    :returns: the container cgroup directory.
    :raises SimulationError: a QoS class or driver that is none.
    """
    try:
        qos, driver = podcgroups.QosClass(qos), podcgroups.Driver(driver)
    except ValueError as err:
        raise exception.SimulationError(reason=str(err)) from None
    directory = os.path.join(
        root, layout.CGROUP_ROOT,
        *podcgroups.pod_cgroup(driver, qos, pod_uid, kubelet_root),
        podcgroups.container_cgroup_name(driver, container_id, runtime))
    os.makedirs(directory, exist_ok=True)
    if current is not None:
        _write(os.path.join(directory, layout.DMEM_CURRENT), '\n'.join(
            '%s %d' % (readings.vram_region(a), b)
            for a, b in sorted(current.items())))
    if limit is not None:
        _write(os.path.join(directory, layout.DMEM_MAX), '\n'.join(
            '%s %s' % (readings.vram_region(a), 'max' if b is None else b)
            for a, b in sorted(limit.items())))
    return directory


def plant(path: str, variant: str) -> None:
    """Replace the file ``path`` with a :data:`HOSTILE` variant.

    ``fifo``: a named pipe (a reader that opens it blocks); ``huge``: 1 MiB
    of digits; ``garbage``: text that is no value; ``binary``: bytes that
    are not ASCII; ``negative``: ``-1``; ``inaccessible``: what a RAS file
    reads during recovery; ``directory``: a directory; ``dangling``: a
    link to nothing; ``loop``: a link to itself; ``empty``: no content.
    """
    if variant not in HOSTILE:
        raise exception.SimulationError(
            reason='no hostile variant %r; known: %s' % (
                variant, ', '.join(HOSTILE)))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _remove(path)
    if variant == 'fifo':
        os.mkfifo(path)
    elif variant == 'huge':
        with open(path, 'w', encoding='ascii') as out:
            out.write('9' * (1 << 20))
    elif variant == 'garbage':
        _write(path, 'ue: lots\nce: ???\n%s' % ('x' * 100))
    elif variant == 'binary':
        with open(path, 'wb') as out:
            out.write(b'\xff\xfe\x00\x01ue: 1')
    elif variant == 'negative':
        _write(path, '-1')
    elif variant == 'inaccessible':
        _write(path, 'Query currently inaccessible')
    elif variant == 'directory':
        os.makedirs(path)
    elif variant == 'dangling':
        os.symlink(os.path.join(os.path.dirname(path), 'no-such-file'),
                   path)
    elif variant == 'loop':
        os.symlink(os.path.basename(path), path)
    else:
        open(path, 'w').close()
