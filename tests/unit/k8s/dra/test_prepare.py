"""Prepare and unprepare: claims, CU choice, state file, CDI specs.

The plugin runs in-process (no sockets: the gRPC side is in the
functional tests) over a simulated sysfs tree; claims come from a dict
and are allocated by the allocator stand-in.
"""

from __future__ import annotations

import json
import os

import fixtures
import testtools

from amdgpu_virt import exception
from amdgpu_virt.k8s.dra import cdi
from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import plugin as dra_plugin
from amdgpu_virt.k8s.dra import slices
from amdgpu_virt.k8s.dra import state as dra_state
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import cumask
from tests.functional.fixtures import cdiruntime
from tests.functional.fixtures import draallocator as da
from tests.unit.inventory import fixtures as inv_fixtures
from tests.unit.k8s.dra import helpers

DRIVER = helpers.DRIVER
NODE = 'node-1'


class LedgerSource:

    def __init__(self, ledger):
        self.ledger = ledger

    def read(self):
        return self.ledger

    def __str__(self):
        return 'test ledger'


class PluginFixture(fixtures.Fixture):
    """A DraPlugin over a simulated tree, with claims in a dict."""

    def __init__(self, kind='mi300x-spx', roles=None):
        super().__init__()
        self.kind = kind
        self.role_list = roles

    def _setUp(self):
        host = self.useFixture(inv_fixtures.SimulatedHost(
            inventory=helpers.host(self.kind)))
        self.sysfs = host.root
        self.inventory = host.scan(NODE)
        self.dir = self.useFixture(fixtures.TempDir(
            rootdir=inv_fixtures.temp_root())).path
        self.claims = {}
        source = None
        if self.role_list:
            source = LedgerSource(helpers.roles(self.inventory, NODE,
                                                *self.role_list))
        self.source = source
        self.plugin = self.make()
        self.plugin.refresh()
        self.allocator = da.Allocator(
            slices.build(self.plugin.plan, DRIVER),
            classes.device_classes(DRIVER))
        self.uids = 0

    def make(self):
        return dra_plugin.DraPlugin(
            self.inventory, NODE, self.read, driver=DRIVER,
            registration_dir=os.path.join(self.dir, 'reg'),
            plugin_dir=os.path.join(self.dir, 'plugin'),
            cdi_dir=os.path.join(self.dir, 'cdi'),
            numbers=cdi.sysfs_numbers(self.sysfs),
            ledger_source=self.source,
            strategy=allocator.BestFitStrategy())

    def read(self, namespace, name):
        return self.claims[(namespace, name)]

    def claim(self, name, requests, constraints=()):
        """An allocated claim (None when it does not fit)."""
        obj = da.claim(name, requests, constraints)
        allocation = self.allocator.allocate(obj, NODE)
        if allocation is None:
            return None
        self.uids += 1
        obj['metadata']['uid'] = '%08d-0000-4000-8000-000000000000' % \
            self.uids
        obj['status'] = {'allocation': allocation}
        self.claims[('default', name)] = obj
        return obj

    def prepare(self, obj, plugin=None):
        meta = obj['metadata']
        return (plugin or self.plugin).prepare(meta['namespace'],
                                               meta['name'], meta['uid'])

    def spec(self, obj):
        path = cdi.spec_path(os.path.join(self.dir, 'cdi'), DRIVER,
                             obj['metadata']['uid'])
        with open(path) as handle:
            return json.load(handle)


container_of = cdiruntime.inject_all


def env_of(spec):
    return container_of(spec).env


def share(cus, memory):
    return da.request('s', 'share.' + DRIVER,
                      capacity={'computeUnits': str(cus), 'memory': memory})


class TestPrepareWhole(testtools.TestCase):

    def test_whole_gpu_cdi_spec(self):
        fx = self.useFixture(PluginFixture())
        obj = fx.claim('w', [da.request('gpu', DRIVER)])
        prepared = fx.prepare(obj)
        (device,) = prepared.devices
        # whole GPUs are handed out from the far end
        self.assertEqual(str(fx.inventory.gpus[-1].address), device.gpu)
        spec = fx.spec(obj)
        self.assertEqual('k8s.gpu.amd.com/gpu', spec['kind'])
        self.assertEqual('0.5.0', spec['cdiVersion'])
        # one CDI device for the GPU, one for the request
        uid = obj['metadata']['uid']
        (cdev, creq) = spec['devices']
        self.assertEqual('%s-%s' % (uid, device.device), cdev['name'])
        self.assertEqual(uid + '-req-gpu', creq['name'])
        unit = [u for u in fx.plugin.units
                if u.gpu_address == device.gpu][0]
        self.assertEqual(
            {unit.card_path: (226, unit.card_minor),
             unit.render_path: (226, unit.render_minor)},
            {n['path']: (n['major'], n['minor'])
             for n in cdev['containerEdits']['deviceNodes']})
        self.assertEqual(
            [('/dev/kfd', 237, 0)],
            [(n['path'], n['major'], n['minor'])
             for n in creq['containerEdits']['deviceNodes']])
        self.assertNotIn('env', cdev['containerEdits'])
        env = env_of(spec)
        self.assertEqual(unit.rocr_id, env['ROCR_VISIBLE_DEVICES'])
        self.assertNotIn('HSA_CU_MASK', env)
        self.assertNotIn('LD_AUDIT', env)
        self.assertEqual({}, container_of(spec).mounts)

    def test_partitioned_whole_gpu_gets_every_partition(self):
        fx = self.useFixture(PluginFixture('mi300x-qpx-nps4'))
        obj = fx.claim('w', [da.request('gpu', DRIVER)])
        fx.prepare(obj)
        env = env_of(fx.spec(obj))
        self.assertEqual(4, len(env['ROCR_VISIBLE_DEVICES'].split(',')))
        part = fx.claim('p', [da.request('one', 'partition.' + DRIVER)])
        fx.prepare(part)
        self.assertEqual(1, len(env_of(fx.spec(part))[
            'ROCR_VISIBLE_DEVICES'].split(',')))

    def test_prepare_is_idempotent_and_recreates_the_spec(self):
        fx = self.useFixture(PluginFixture())
        obj = fx.claim('w', [da.request('gpu', DRIVER)])
        first = fx.prepare(obj)
        path = cdi.spec_path(os.path.join(fx.dir, 'cdi'), DRIVER,
                             obj['metadata']['uid'])
        os.unlink(path)  # a reboot empties /var/run/cdi
        del fx.claims[('default', 'w')]  # and the API need not be asked
        self.assertEqual(first, fx.prepare(obj))
        self.assertTrue(os.path.exists(path))

    def test_unprepare_releases_and_unknown_claims_succeed(self):
        fx = self.useFixture(PluginFixture())
        obj = fx.claim('w', [da.request('gpu', DRIVER)])
        fx.prepare(obj)
        fx.plugin.unprepare(obj['metadata']['uid'])
        fx.plugin.unprepare(obj['metadata']['uid'])
        fx.plugin.unprepare('never-seen')
        self.assertEqual({}, fx.plugin.state.load())
        self.assertFalse(os.path.exists(cdi.spec_path(
            os.path.join(fx.dir, 'cdi'), DRIVER, obj['metadata']['uid'])))


class TestPrepareShares(testtools.TestCase):

    def fixture(self):
        return self.useFixture(PluginFixture(
            roles=[Role.K8S_SHARED] + [Role.K8S_DEDICATED] * 7))

    def test_four_shares_get_disjoint_masks_and_limits(self):
        fx = self.fixture()
        masks = 0
        for i in range(4):
            obj = fx.claim('s%d' % i, [share(76, '48Gi')])
            self.assertIsNotNone(obj)
            fx.prepare(obj)
            env = env_of(fx.spec(obj))
            mask = cumask.parse_hsa_cu_mask(env['HSA_CU_MASK'],
                                            304).mask_for(0)
            self.assertEqual(76, bin(mask).count('1'))
            self.assertFalse(masks & mask)
            masks |= mask
            self.assertEqual('49152m', env['HIP_DEVICE_MEMORY_LIMIT_0'])
            self.assertIn('LD_AUDIT', env)
            # the library is the request's, the memory limit the share's
            cshare, creq = fx.spec(obj)['devices']
            (mount,) = creq['containerEdits']['mounts']
            self.assertIn('ro', mount['options'])
            self.assertEqual(['HIP_DEVICE_MEMORY_LIMIT_0=49152m'],
                             cshare['containerEdits']['env'])
        self.assertIsNone(fx.claim('s5', [share(76, '48Gi')]))

    def test_masks_survive_a_plugin_restart(self):
        fx = self.fixture()
        first = fx.claim('a', [share(100, '8Gi')])
        fx.prepare(first)
        restarted = fx.make()
        restarted.refresh()
        second = fx.claim('b', [share(100, '8Gi')])
        prepared = fx.prepare(second, restarted)
        mine = dict(prepared.devices[0].masks)[0]
        theirs = dict(fx.plugin.state.load()[first['metadata'][
            'uid']].devices[0].masks)[0]
        self.assertFalse(mine & theirs)

    def test_granted_capacity_not_request_is_used(self):
        fx = self.fixture()
        obj = fx.claim('a', [share(75, '1000Mi')])
        # the allocator rounded memory up to the 256 MiB step
        res = obj['status']['allocation']['devices']['results'][0]
        self.assertEqual('1Gi', res['consumedCapacity']['memory'])
        fx.prepare(obj)
        self.assertEqual('1024m', env_of(fx.spec(obj))[
            'HIP_DEVICE_MEMORY_LIMIT_0'])


class TestHostileClaims(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.fx = self.useFixture(PluginFixture(
            roles=[Role.K8S_SHARED] + [Role.K8S_DEDICATED] * 7))

    def assertRefused(self, obj, *words):
        err = self.assertRaises(exception.DraClaimError, self.fx.prepare,
                                obj)
        for word in words:
            self.assertIn(word, str(err))
        self.assertEqual({}, self.fx.plugin.state.load())

    def result(self, obj):
        return obj['status']['allocation']['devices']['results'][0]

    def test_other_driver_only(self):
        obj = self.fx.claim('c', [da.request('gpu', DRIVER)])
        self.result(obj)['driver'] = 'gpu.example.com'
        self.assertRefused(obj, 'default/c', 'no result of driver',
                           'gpu.example.com')

    def test_other_drivers_results_are_ignored(self):
        obj = self.fx.claim('c', [da.request('gpu', DRIVER)])
        other = dict(self.result(obj), driver='gpu.example.com',
                     device='whatever')
        obj['status']['allocation']['devices']['results'].append(other)
        self.assertEqual(1, len(self.fx.prepare(obj).devices))

    def test_device_not_ours(self):
        obj = self.fx.claim('c', [da.request('gpu', DRIVER)])
        self.result(obj)['device'] = 'gpu-0000-ff-00-0'
        self.assertRefused(obj, 'gpu-0000-ff-00-0', 'does not publish')

    def test_other_pool(self):
        obj = self.fx.claim('c', [da.request('gpu', DRIVER)])
        self.result(obj)['pool'] = 'node-2'
        self.assertRefused(obj, "'node-2'")

    def test_consumed_capacity_beyond_the_device(self):
        obj = self.fx.claim('c', [share(8, '1Gi')])
        self.result(obj)['consumedCapacity']['computeUnits'] = '400'
        self.assertRefused(obj, 'computeUnits 400')
        self.result(obj)['consumedCapacity'] = {'computeUnits': '8',
                                                'memory': '1Ti'}
        self.assertRefused(obj, 'memory 1Ti')
        self.result(obj)['consumedCapacity'] = {'computeUnits': 'lots',
                                                'memory': '1Gi'}
        self.assertRefused(obj, 'not a quantity')
        del self.result(obj)['consumedCapacity']
        self.assertRefused(obj, 'no consumedCapacity')

    def test_overcommitted_memory_fails_closed(self):
        big = self.fx.claim('a', [share(8, '150Gi')])
        self.fx.prepare(big)
        obj = self.fx.claim('b', [share(8, '8Gi')])
        self.result(obj)['consumedCapacity']['memory'] = '100Gi'
        err = self.assertRaises(exception.DraClaimError, self.fx.prepare,
                                obj)
        self.assertIn('already prepared', str(err))

    def test_a_forged_second_holder_of_a_whole_gpu(self):
        first = self.fx.claim('a', [da.request('gpu', DRIVER)])
        self.fx.prepare(first)
        second = self.fx.claim('b', [da.request('gpu', DRIVER)])
        self.result(second)['device'] = self.result(first)['device']
        err = self.assertRaises(exception.DraClaimError, self.fx.prepare,
                                second)
        self.assertIn('held by both', str(err))

    def test_uid_mismatch_and_unallocated(self):
        obj = self.fx.claim('c', [da.request('gpu', DRIVER)])
        err = self.assertRaises(exception.DraClaimError,
                                self.fx.plugin.prepare, 'default', 'c',
                                'another-uid')
        self.assertIn('another-uid', str(err))
        del obj['status']
        self.assertRefused(obj, 'not allocated')

    def test_bad_request_names_and_uids(self):
        obj = self.fx.claim('c', [da.request('gpu', DRIVER)])
        for bad in ('../x', 'A', '', 'a/b/c', 'x' * 64):
            self.result(obj)['request'] = bad
            self.assertRefused(obj, 'not a request name')
        for uid in ('../../etc/passwd', '', 'a/b', '-x', 'u' * 65):
            err = self.assertRaises(exception.DraClaimError,
                                    self.fx.plugin.prepare, 'default', 'c',
                                    uid)
            self.assertIn('claim UID', str(err))
            self.assertRaises(exception.DraClaimError,
                              self.fx.plugin.unprepare, uid)

    def test_corrupt_state_file_fails_closed(self):
        obj = self.fx.claim('c', [da.request('gpu', DRIVER)])
        self.fx.prepare(obj)
        path = self.fx.plugin.state.path
        good = dra_state.dumps(self.fx.plugin.state.load())
        for text, word in (('{"version": 1, "claims": [', 'not valid JSON'),
                           ('{"version": 1, "claims": %s1%s}' % (
                               '[' * 5000, ']' * 5000),
                            'nested deeper than 100 levels'),
                           ('{"version": 2, "claims": {}}', 'version'),
                           (None, 'overlap')):
            if text is None:
                data = json.loads(good)
                uid = next(iter(data['claims']))
                entry = data['claims'][uid]
                entry['devices'][0]['masks'] = {'0': '0xff'}
                twin = json.loads(json.dumps(entry))
                data['claims']['twin'] = twin
                text = json.dumps(data)
            with open(path, 'w') as handle:
                handle.write(text)
            err = self.assertRaises(exception.DraStateError,
                                    self.fx.plugin.prepare, 'default', 'c',
                                    'x')
            self.assertIn(path, str(err))
            self.assertIn(word, str(err))
            self.assertRaises(exception.DraStateError,
                              self.fx.make().start)
