"""Whole-GPU device types and zero-disk flavors, checked with Nova's code.

The device type of a whole GPU comes from the host: a simulated sysfs tree
is written, read back by the sysfs driver, and the rendered alias must be
matched by Nova's own PCI pool matching (``PciDeviceStats``, what the
``PciPassthroughFilter`` and the compute claim use) to the device as
nova-compute reports it. libvirt, hence Nova, reports ``type-PF`` for a
function whose ``sriov_totalvfs`` is above 0 (the rule of
``nova.pci.utils.is_physical_function``, which reads the machine's own
``/sys`` and is applied here to the simulated tree's file).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import unittest

import testtools

from tests.functional.fixtures import nova_env
from tests.functional.nova import novaquery

from amdgpu_virt import conf as av_conf
from amdgpu_virt import exception
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import sysfs
from amdgpu_virt.model import HostInventory
from amdgpu_virt.nova import audit
from amdgpu_virt.nova import flavors
from amdgpu_virt.nova import pci
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.nova.audit import FindingKind
from amdgpu_virt.nova.naming import Naming

if nova_env.AVAILABLE:
    from nova import objects
    from nova.pci import request as pci_request
    from nova.pci import stats as pci_stats
    from nova.pci import whitelist

    objects.register_all()


def _sysfs_dev_type(root: str, address: str) -> str:
    """Nova's rule for a PF, applied to the simulated tree."""
    path = os.path.join(root, 'bus/pci/devices', address, 'sriov_totalvfs')
    try:
        with open(path) as handle:
            return 'type-PF' if int(handle.read()) > 0 else 'type-PCI'
    except (OSError, ValueError):
        return 'type-PCI'


def _scan(inventory: HostInventory
          ) -> tuple[tempfile.TemporaryDirectory, str, HostInventory]:
    tmp = tempfile.TemporaryDirectory()
    root = tmp.name
    simulate.write_tree(inventory, root)
    found = sysfs.SysfsInventory(av_conf.new_conf(), root,
                                 inventory.hostname).scan()
    return tmp, root, found


@unittest.skipUnless(nova_env.AVAILABLE, nova_env.SKIP_REASON)
class TestWholeGpuDeviceType(testtools.TestCase):

    def setUp(self):
        super().setUp()
        designed = simulate.design_host(simulate.HostSpec(
            'dt-1', gpus=3, mode='vfio'))
        gpus = list(designed.gpus)
        # SR-IOV off in the firmware: no sriov_* files for the 2nd GPU
        gpus[1] = dataclasses.replace(gpus[1], sriov_totalvfs=None,
                                      sriov_numvfs=None)
        tmp, self.root, self.inventory = _scan(
            dataclasses.replace(designed, gpus=tuple(gpus)))
        self.addCleanup(tmp.cleanup)

    def _nova_matches(self, plan, aliases):
        """alias name -> addresses Nova's pool matching accepts."""
        specs = pci.device_specs(
            plan, all_functions=pci.host_functions(self.inventory))
        wl = whitelist.Whitelist([pci.dumps(s) for s in specs])
        stats = pci_stats.PciDeviceStats(None, dev_filter=wl)
        for gpu in self.inventory.gpus:
            stats.add_device(objects.PciDevice(
                compute_node_id=1, address=str(gpu.address),
                vendor_id='1002', product_id='%04x' % gpu.device_id,
                dev_type=_sysfs_dev_type(self.root, str(gpu.address)),
                status='available', instance_uuid=None, numa_node=0,
                parent_addr=None, request_id=None, extra_info={},
                dev_id='pci_%s' % str(gpu.address).replace(':', '_')
                .replace('.', '_'), label='label_1002_%04x' % gpu.device_id))
        result = {}
        with novaquery.nova_aliases(aliases):
            for alias in aliases:
                (request,) = pci_request._translate_alias_to_requests(
                    '%s:1' % alias['name'])
                pools = stats._filter_pools_for_spec(stats.pools, request)
                result[alias['name']] = sorted(
                    d.address for p in pools for d in p['devices'])
        return result

    def test_type_from_sriov_totalvfs_and_nova_matches_it(self):
        plan = nova_plan.plan_host(self.inventory, Naming(
            per_gpu_traits=False))
        self.assertEqual([8, None, 8], [g.sriov_totalvfs
                                        for g in self.inventory.gpus])
        self.assertEqual(['type-PF', 'type-PCI', 'type-PF'],
                         [o.device_type for o in plan.offers])
        self.assertEqual(
            [_sysfs_dev_type(self.root, str(o.address)) for o in plan.offers],
            [o.device_type for o in plan.offers])
        # Two types of one model: two aliases would share a name with
        # different types, which Nova refuses; we refuse first.
        err = self.assertRaises(exception.NovaConfigError, pci.aliases,
                                [pci.alias_of(o) for o in plan.offers])
        self.assertIn('amd-mi300x', str(err))
        # Each offer's own alias is matched by Nova to its device only.
        for offer in plan.offers:
            entry = pci.alias_of(offer).to_dict('preferred')
            matched = self._nova_matches(plan, [entry])[entry['name']]
            same = [str(o.address) for o in plan.offers
                    if o.device_type == offer.device_type]
            self.assertEqual(same, matched)
        self.assertEqual((), audit.device_type_findings(
            [plan], [self.inventory]))

    def test_forced_type_is_flagged_and_nova_never_matches(self):
        plan = nova_plan.plan_host(self.inventory, Naming(
            per_gpu_traits=False), device_type='type-PF')
        (entry,) = pci.aliases(pci.alias_of(o) for o in plan.offers)
        matched = self._nova_matches(plan, [entry])['amd-mi300x']
        self.assertEqual(['0000:05:00.0', '0000:45:00.0'], matched)
        (finding,) = audit.device_type_findings([plan], [self.inventory])
        self.assertEqual(FindingKind.WRONG_DEVICE_TYPE, finding.kind)
        self.assertEqual('dt-1_0000:25:00.0', finding.provider)
        self.assertIn('type-PCI', finding.expected)
        self.assertIn('type-PF (alias amd-mi300x)', finding.actual)


@unittest.skipUnless(nova_env.AVAILABLE, nova_env.SKIP_REASON)
class TestZeroDiskPolicy(testtools.TestCase):

    def test_policy_we_cite_is_novas_admin_only_default(self):
        from nova import context
        from nova import policy
        from nova.policies import servers
        from tests.functional.fixtures import nova_api

        nova_api.get_server()          # Nova's configuration, parsed
        policy.init()
        self.assertEqual(servers.ZERO_DISK_FLAVOR, flavors.ZERO_DISK_POLICY)
        target = {'project_id': 'p'}
        member = context.RequestContext(user_id='u', project_id='p',
                                        roles=['member', 'reader'])
        admin = context.RequestContext(user_id='a', project_id='p',
                                       roles=['admin', 'member', 'reader'])
        self.assertFalse(member.can(flavors.ZERO_DISK_POLICY, target,
                                    fatal=False))
        self.assertTrue(admin.can(flavors.ZERO_DISK_POLICY, target,
                                  fatal=False))
