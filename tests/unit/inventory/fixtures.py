"""Helpers shared by the inventory tests: simulated trees on disk."""

from __future__ import annotations

import dataclasses
import os

import fixtures

from amdgpu_virt import conf
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import sysfs
from amdgpu_virt.model import HostInventory

#: Kinds tested with all their GPUs: where the GPU count matters (the
#: 63-partition quirk, 64 VFs, mixed hosts).
FULL_SIZE = frozenset({'mi300x-cpx', 'mi300x-cpx-nps4', 'mi300x-gim-cpx',
                       'mi355x-cpx-nps2', 'mi325x-cpx-nps4', 'mi300x-mixed',
                       'mi300x-mixed-nps4', 'mi300x-spx'})


_CONF = None
#: Simulated trees have thousands of small files: a tmpfs is much faster.
TMPFS = '/dev/shm'


def temp_root() -> str | None:
    """Directory for temporary trees: a tmpfs if there is one."""
    if os.path.isdir(TMPFS) and os.access(TMPFS, os.W_OK):
        return TMPFS
    return None


def test_conf():
    """One parsed configuration for all inventory tests (defaults only)."""
    global _CONF
    if _CONF is None:
        _CONF = conf.new_conf()
    return _CONF


def spec_for_test(kind: str) -> simulate.HostSpec:
    """The kind's spec; two GPUs unless the count matters (faster)."""
    spec = simulate.KINDS[kind]
    if kind in FULL_SIZE or spec.gpu_modes:
        return spec
    return dataclasses.replace(spec, gpus=2)


class SimulatedHost(fixtures.Fixture):
    """A simulated sysfs tree in a temporary directory."""

    def __init__(self, spec: simulate.HostSpec | None = None,
                 inventory: HostInventory | None = None,
                 legacy_xcp_names: bool = False) -> None:
        super().__init__()
        self.spec = spec
        self.expected = inventory
        self.legacy_xcp_names = legacy_xcp_names

    def _setUp(self) -> None:
        self.root = self.useFixture(
            fixtures.TempDir(rootdir=temp_root())).path
        if self.expected is None:
            assert self.spec is not None
            self.expected = simulate.design_host(self.spec)
        simulate.write_tree(self.expected, self.root, self.legacy_xcp_names)

    def scan(self, hostname: str = 'host') -> HostInventory:
        return self.scan_root(self.root, hostname)

    @staticmethod
    def scan_root(root: str, hostname: str = 'host') -> HostInventory:
        """Scan the sysfs tree at ``root``."""
        return sysfs.SysfsInventory(test_conf(), root, hostname).scan()
