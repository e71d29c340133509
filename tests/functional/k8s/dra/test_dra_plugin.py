"""The DRA plugin end to end, against real parts.

A simulated MI300X host (sysfs tree), the plugin built from its options
and loaded through stevedore, the real ``kubernetes`` client against the
API server stand-in, the DRA kubelet stand-in over real unix sockets, and
the allocator stand-in in place of the kube-scheduler: slices published
-> claims allocated -> status written -> prepare -> CDI spec checked.
Mocked: nothing but the hardware (simulated tree) and the scheduler.
"""

from __future__ import annotations

import json
import os
import threading
import time

import fixtures
import kubernetes_validate
import testtools
from kubernetes.client import exceptions as kubernetes_exceptions

from amdgpu_virt import conf as av_conf
from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.cmd import dra as cmd_dra
from amdgpu_virt.k8s.dra import cdi
from amdgpu_virt.k8s.dra import classes
from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.dra import served as dra_served
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import cumask
from tests.functional.fixtures import cdiruntime
from tests.functional.fixtures import draallocator as da
from tests.functional.fixtures import drakubelet
from tests.functional.fixtures import kubeclient
from tests.unit.inventory import fixtures as inv_fixtures
from tests.unit.k8s.dra import helpers

DRIVER = 'gpu.amd.com'
NODE = 'gpu-node-1'
# cpx, qpx, gim-cpx, gim-cpx, vfio, cpx, cpx, cpx
ROLES = (Role.K8S_DEDICATED, Role.K8S_SHARED, Role.NOVA_VF, Role.NOVA_VF,
         Role.NOVA_DEDICATED, Role.K8S_DEDICATED, Role.K8S_SHARED,
         Role.IDLE)


def _raw(response):
    return json.loads(response.data)


class DraNode(fixtures.Fixture):
    """API server, simulated node, kubelet stand-in and the plugin."""

    def __init__(self, pod_uid='', version=(1, 36), dra=None, gates=None,
                 kubernetes=None):
        super().__init__()
        self.pod_uid = pod_uid
        self.version = version
        self.gates = gates
        self.dra = dict(dra or {})
        # no memory-limit library is installed here: shares are published
        # whatever enforces their memory, unless a test says otherwise
        # (test_dra_dmem)
        self.kubernetes = {'memory_enforcement': 'none',
                           **(kubernetes or {})}

    def _setUp(self):
        self.k8s = self.useFixture(kubeclient.ApiServerFixture(
            version=self.version, gates=self.gates))
        self.k8s.api.create_namespace({'metadata': {'name': 'default'}})
        self.k8s.api.create_namespace({'metadata': {'name': 'team'}})
        host = self.useFixture(inv_fixtures.SimulatedHost(
            inventory=helpers.host('mi300x-mixed-nps4')))
        self.sysfs = host.root
        self.tmp = self.useFixture(fixtures.TempDir(
            rootdir=inv_fixtures.temp_root())).path
        self.inventory = host.scan(NODE)
        self.ledger_path = os.path.join(self.tmp, 'ledger.yaml')
        self.write_ledger(ROLES)
        self.device_root = os.path.join(self.tmp, 'devroot')
        self.make_device_nodes()
        self.kubeconfig = self.k8s.write_kubeconfig(self.tmp)
        self.registration_dir = os.path.join(self.tmp, 'plugins_registry')
        self.kubelet = drakubelet.DraKubeletStandIn(
            self.registration_dir).start()
        self.addCleanup(self.kubelet.stop)
        self.plugin = None
        self.start_plugin()
        self.addCleanup(self.stop_plugin)
        for obj in classes.device_classes(DRIVER):
            self.k8s.resource.create_device_class(obj)

    def write_ledger(self, roles):
        av_ledger.save(helpers.roles(self.inventory, NODE, *roles),
                       self.ledger_path)

    def make_device_nodes(self):
        os.makedirs(os.path.join(self.device_root, 'dev', 'dri'),
                    exist_ok=True)
        open(os.path.join(self.device_root, 'dev', 'kfd'), 'w').close()
        for gpu in self.inventory.gpus:
            for part in gpu.partitions:
                for name in ('card%s' % part.card_minor,
                             'renderD%s' % part.render_minor):
                    open(os.path.join(self.device_root, 'dev', 'dri', name),
                         'w').close()

    def conf(self):
        conf = av_conf.new_conf()
        for group, values in {
            'kubernetes': {'kubeconfig': self.kubeconfig,
                           'node_name': NODE, 'ledger_source': 'file',
                           'ledger_file': self.ledger_path,
                           'device_root': self.device_root,
                           **self.kubernetes},
            'inventory': {'sysfs_root': self.sysfs, 'hostname': NODE},
            'dra': {'registration_dir': self.registration_dir,
                    'plugin_dir': os.path.join(self.tmp, 'plugin'),
                    'cdi_dir': os.path.join(self.tmp, 'cdi'),
                    'pod_uid': self.pod_uid, 'publish_interval': 1,
                    **self.dra},
        }.items():
            for name, value in values.items():
                conf.set_override(name, value, group=group)
        return conf

    def start_plugin(self):
        self.plugin = cmd_dra.load_plugin(self.conf(), self.inventory)
        self.plugin.start()
        return self.plugin

    def stop_plugin(self):
        if self.plugin is not None:
            self.plugin.stop()
            self.plugin = None

    # API side ------------------------------------------------------------
    def slices(self):
        return _raw(self.k8s.resource.list_resource_slice(
            _preload_content=False))['items']

    def allocate(self, name, requests, namespace='default',
                 constraints=()):
        """Create the claim, allocate it like the scheduler, write status.

        :returns: the stored claim, or None when it does not fit.
        """
        api = self.k8s.resource
        claims = _raw(api.list_resource_claim_for_all_namespaces(
            _preload_content=False))['items']
        # the scheduler has the API server's gates
        off = self.k8s.server.store.disabled_gates
        allocator = da.Allocator(self.slices(), classes.device_classes(
            DRIVER), [c for c in claims if c.get('status')],
            features={da.PARTITIONABLE, da.CONSUMABLE} - off)
        obj = da.claim(name, requests, namespace=namespace,
                       constraints=constraints)
        stored = _raw(api.create_namespaced_resource_claim(
            namespace, obj, _preload_content=False))
        allocation = allocator.allocate(stored, NODE)
        if allocation is None:
            return None
        stored['status'] = {'allocation': allocation}
        return _raw(api.replace_namespaced_resource_claim_status(
            name, namespace, stored, _preload_content=False))

    def set_status(self, claim):
        meta = claim['metadata']
        return _raw(self.k8s.resource.replace_namespaced_resource_claim_status(
            meta['name'], meta['namespace'], claim, _preload_content=False))

    def prepare(self, *claims, version=None):
        return self.kubelet.prepare(DRIVER, [
            (c['metadata']['namespace'], c['metadata']['uid'],
             c['metadata']['name']) for c in claims], version=version)

    def unprepare(self, *claims):
        return self.kubelet.unprepare(DRIVER, [
            (c['metadata']['namespace'], c['metadata']['uid'],
             c['metadata']['name']) for c in claims])

    def spec(self, claim):
        path = cdi.spec_path(os.path.join(self.tmp, 'cdi'), DRIVER,
                             claim['metadata']['uid'])
        with open(path) as handle:
            return json.load(handle)


container_of = cdiruntime.inject_all


def env_of(spec):
    return container_of(spec).env


def share_request(cus='76', memory='48Gi'):
    return da.request('share', 'share.' + DRIVER,
                      capacity={'computeUnits': cus, 'memory': memory})


class TestRegistration(testtools.TestCase):

    def test_registers_with_both_versions_and_health(self):
        node = self.useFixture(DraNode())
        plugin = node.kubelet.wait_for(DRIVER)
        self.assertEqual(node.plugin.dra_socket, plugin.endpoint)
        self.assertTrue(os.path.isabs(plugin.endpoint))
        self.assertEqual(('v1.DRAPlugin', 'v1beta1.DRAPlugin',
                          'v1alpha1.DRAResourceHealth',
                          'v1.DRAResourceHealth'), plugin.versions)
        self.assertEqual('v1', plugin.dra_version)
        # the DRA socket was served before kubelet could find the plugin
        self.assertTrue(plugin.endpoint_ready)
        self.assertEqual([], node.kubelet.refused)
        self.assertEqual(os.path.join(node.registration_dir,
                                      DRIVER + '-reg.sock'),
                         plugin.registration_socket)
        deadline = time.monotonic() + 5
        while not node.plugin.registered and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertTrue(node.plugin.registered)

    def test_per_pod_socket_names_and_sockets_removed_on_stop(self):
        node = self.useFixture(DraNode(pod_uid='0b9c-uid'))
        plugin = node.kubelet.wait_for(DRIVER)
        self.assertEqual('dra-0b9c-uid.sock',
                         os.path.basename(plugin.endpoint))
        self.assertEqual(DRIVER + '-0b9c-uid-reg.sock',
                         os.path.basename(plugin.registration_socket))
        node.stop_plugin()
        self.assertFalse(os.path.exists(plugin.endpoint))
        self.assertFalse(os.path.exists(plugin.registration_socket))

    def test_health_stream_lists_every_device(self):
        node = self.useFixture(DraNode())
        plugin = node.kubelet.wait_for(DRIVER)
        self.assertEqual('v1', plugin.health_version)
        names = {d['name'] for s in node.slices()
                 for d in s['spec'].get('devices', [])}
        deadline = time.monotonic() + 5
        while not plugin.health and time.monotonic() < deadline:
            time.sleep(0.02)
        first = plugin.health[-1]
        self.assertEqual(names, {name for name, _h, _m in first})
        self.assertEqual({'HEALTHY'}, {h for _n, h, _m in first})
        # a render node disappears: that partition, and its whole GPU,
        # become unhealthy
        gpu = node.inventory.gpus[0]
        os.unlink(os.path.join(node.device_root, 'dev', 'dri', 'renderD%d'
                               % gpu.partitions[2].render_minor))
        node.plugin.refresh()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and 'UNHEALTHY' not in {
                h for _n, h, _m in plugin.health[-1]}:
            time.sleep(0.02)
        bad = {n for n, h, _m in plugin.health[-1] if h == 'UNHEALTHY'}
        label = dra_devices.gpu_label(gpu.address)
        self.assertEqual({label, label + '-p2'}, bad)


class TestEndToEnd(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.node = self.useFixture(DraNode())

    def test_published_slices_are_valid_and_only_kubernetes_gpus(self):
        objs = self.node.slices()
        self.assertEqual({1}, {s['spec']['pool']['generation']
                               for s in objs})
        for obj in objs:
            obj.pop('status', None)
            for key in ('uid', 'resourceVersion', 'creationTimestamp'):
                obj['metadata'].pop(key, None)
            kubernetes_validate.validate(obj, '1.36.0', strict=True)
        gpus = {d['attributes']['pciAddress']['string'] for s in objs
                for d in s['spec'].get('devices', [])}
        inv = self.node.inventory.gpus
        self.assertEqual({str(inv[i].address) for i in (0, 1, 5, 6)}, gpus)
        # every device says which PCIe root complex its GPU sits behind,
        # as read from the node's sysfs tree
        roots = {(d['attributes']['pciAddress']['string'],
                  d['attributes']['resource.kubernetes.io/pcieRoot'][
                      'string'])
                 for s in objs for d in s['spec'].get('devices', [])}
        self.assertEqual({(str(inv[i].address),
                           'pci0000:%02x' % (inv[i].address.bus & 0xe0))
                          for i in (0, 1, 5, 6)}, roots)
        # nothing changed: a second publish writes nothing
        before = len(self.node.k8s.server.requests)
        self.assertFalse(self.node.plugin.refresh())
        writes = [r for r in self.node.k8s.server.requests[before:]
                  if not r.startswith('GET')]
        self.assertEqual([], writes)

    def test_whole_partition_and_share(self):
        node = self.node
        whole = node.allocate('whole', [da.request('gpu', DRIVER)])
        part = node.allocate('part', [da.request(
            'p', 'partition.' + DRIVER)])
        share = node.allocate('share', [share_request()])
        responses = node.prepare(whole, part, share)
        for claim in (whole, part, share):
            entry = responses[claim['metadata']['uid']]
            self.assertEqual('', entry.error)
            (device,) = entry.devices
            self.assertEqual(NODE, device.pool_name)
            result = claim['status']['allocation']['devices']['results'][0]
            self.assertEqual(result['device'], device.device_name)
            request = result['request']
            self.assertEqual([request], list(device.request_names))
            name = '%s-%s' % (claim['metadata']['uid'], result['device'])
            if result.get('shareID'):
                name += '-' + result['shareID']
            self.assertEqual([
                'k8s.gpu.amd.com/gpu=' + name,
                'k8s.gpu.amd.com/gpu=%s-req-%s' % (claim['metadata']['uid'],
                                                   request)],
                list(device.cdi_device_ids))
        share_id = responses[share['metadata']['uid']].devices[0].share_id
        self.assertEqual(share['status']['allocation']['devices'][
            'results'][0]['shareID'], share_id)
        # the whole GPU is all 8 partitions of the last k8s-dedicated GPU
        env = env_of(node.spec(whole))
        self.assertEqual(8, len(env['ROCR_VISIBLE_DEVICES'].split(',')))
        self.assertEqual(17, len(container_of(node.spec(whole)).devices))
        env = env_of(node.spec(share))
        mask = cumask.parse_hsa_cu_mask(env['HSA_CU_MASK'], 76)
        self.assertEqual(76, bin(mask.mask_for(0)).count('1'))
        self.assertEqual('49152m', env['HIP_DEVICE_MEMORY_LIMIT_0'])
        # unprepare removes the specs; a second time is fine too
        for _ in range(2):
            self.assertEqual({c['metadata']['uid']: '' for c in
                              (whole, part, share)},
                             {k: v.error for k, v in node.unprepare(
                                 whole, part, share).items()})
        self.assertFalse(os.path.exists(cdi.spec_path(
            os.path.join(node.tmp, 'cdi'), DRIVER, whole['metadata']['uid'])))

    def test_v1beta1_prepare_has_no_share_id(self):
        share = self.node.allocate('share', [share_request('8', '1Gi')])
        entry = self.node.prepare(share, version='v1beta1')[
            share['metadata']['uid']]
        self.assertEqual('', entry.error)
        self.assertFalse(hasattr(entry.devices[0], 'share_id'))

    def test_unknown_claim_unprepares(self):
        fake = {'metadata': {'namespace': 'default', 'name': 'gone',
                             'uid': 'f00'}}
        self.assertEqual({'f00': ''}, {k: v.error for k, v in
                                       self.node.unprepare(fake).items()})

    def test_plugin_restart_keeps_prepared_claims(self):
        node = self.node
        first = node.allocate('a', [share_request('30', '8Gi')])
        node.prepare(first)
        mask_a = cumask.parse_hsa_cu_mask(env_of(node.spec(first))[
            'HSA_CU_MASK'], 76).mask_for(0)
        node.stop_plugin()
        node.start_plugin()
        node.kubelet.wait_for(DRIVER)
        second = node.allocate('b', [share_request('30', '8Gi')])
        deadline = time.monotonic() + 5
        while True:
            try:
                node.prepare(second)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        mask_b = cumask.parse_hsa_cu_mask(env_of(node.spec(second))[
            'HSA_CU_MASK'], 76).mask_for(0)
        self.assertFalse(mask_a & mask_b)
        # a reboot emptied the CDI dir; kubelet prepares again
        os.unlink(cdi.spec_path(os.path.join(node.tmp, 'cdi'), DRIVER,
                                first['metadata']['uid']))
        self.assertEqual('', node.prepare(first)[
            first['metadata']['uid']].error)
        self.assertEqual(mask_a, cumask.parse_hsa_cu_mask(env_of(
            node.spec(first))['HSA_CU_MASK'], 76).mask_for(0))

    def test_kubelet_restart_discovers_the_plugin_again(self):
        node = self.node
        claim = node.allocate('a', [da.request('gpu', DRIVER)])
        node.prepare(claim)
        socket = node.plugin.registration_socket
        node.kubelet.restart()
        node.kubelet.wait_for(DRIVER)
        # GetInfo again on the same socket, as a restarted kubelet does
        self.assertEqual(2, node.kubelet.getinfo_calls[socket])
        self.assertEqual('', node.prepare(claim)[
            claim['metadata']['uid']].error)

    def test_removed_registration_socket_is_served_again(self):
        node = self.node
        os.unlink(node.plugin.registration_socket)
        node.plugin.watch_once()
        node.kubelet.wait_for(DRIVER)
        self.assertTrue(os.path.exists(node.plugin.registration_socket))

    def test_role_change_withdraws_and_raises_the_generation(self):
        node = self.node
        roles = list(ROLES)
        roles[5] = Role.NOVA_VF
        node.write_ledger(roles)
        self.assertTrue(node.plugin.refresh())
        objs = node.slices()
        self.assertEqual({2}, {s['spec']['pool']['generation']
                               for s in objs})
        self.assertEqual({len(objs)}, {s['spec']['pool'][
            'resourceSliceCount'] for s in objs})
        gone = str(node.inventory.gpus[5].address)
        self.assertNotIn(gone, {d['attributes']['pciAddress']['string']
                                for s in objs
                                for d in s['spec'].get('devices', [])})
        # every GPU withdrawn: no slice left
        node.write_ledger([Role.IDLE] * 8)
        node.plugin.refresh()
        self.assertEqual([], node.slices())

    def test_refreshes_do_not_overlap(self):
        # the loop and a caller of refresh() at once: the publisher reads
        # the node's slices and writes what differs, so two publishes
        # interleaved could each write from a stale read
        node = self.node
        publisher = node.plugin.publisher
        publish = publisher.publish
        inside = []
        overlaps = []

        def observed(*args, **kwargs):
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(len(inside))
            time.sleep(0.05)
            try:
                return publish(*args, **kwargs)
            finally:
                inside.pop()
        publisher.publish = observed
        roles = list(ROLES)
        roles[5] = Role.NOVA_VF
        node.write_ledger(roles)
        threads = [threading.Thread(target=node.plugin.refresh)
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        self.assertEqual([], overlaps)
        # the last word is the ledger's: one generation more, GPU 5 gone
        objs = node.slices()
        self.assertEqual({2}, {s['spec']['pool']['generation']
                               for s in objs})
        self.assertNotIn(str(node.inventory.gpus[5].address),
                         {d['attributes']['pciAddress']['string']
                          for s in objs for d in s['spec'].get('devices',
                                                              [])})

    def test_a_gate_turned_off_keeps_what_still_works(self):
        # the API server restarts with DRAPartitionableDevices off; the
        # plugin still believes counters are kept when the ledger changes
        node = self.node
        whole = node.allocate('w', [da.request('gpu', DRIVER)])
        node.k8s.server.store.set_release((1, 36), {
            'DRAPartitionableDevices': False})
        roles = list(ROLES)
        roles[6] = Role.K8S_DEDICATED
        node.write_ledger(roles)
        before = node.k8s.server.store.writes['resourceslices']
        self.assertTrue(node.plugin.refresh())
        objs = node.slices()
        types = helpers_types(objs)
        # whole GPUs and shares stay, partitions go, no counter anywhere
        self.assertEqual({'gpu', 'share'}, set(types.values()))
        self.assertEqual(3, list(types.values()).count('gpu'))
        self.assertFalse('counter' in json.dumps(objs).lower())
        # the dry run said so before anything was written: one write per
        # slice of the new generation, and the old ones deleted
        self.assertEqual({2}, {o['spec']['pool']['generation']
                               for o in objs})
        writes = node.k8s.server.store.writes['resourceslices'] - before
        self.assertLessEqual(writes, 3)
        self.assertFalse(node.plugin.refresh())
        # a whole GPU still allocates and prepares; so does the old claim
        again = node.allocate('w2', [da.request('gpu', DRIVER)])
        for claim in (whole, again):
            self.assertEqual('', node.prepare(claim)[
                claim['metadata']['uid']].error)
        # the gate comes back: the next probe finds it, partitions return
        node.k8s.server.store.set_release((1, 36))
        node.plugin.publisher.forget()
        self.assertTrue(node.plugin.refresh())
        self.assertIn('partition', helpers_types(node.slices()).values())


def all_of(name, device_class, selectors=()):
    """A request for every matching device (allocationMode All)."""
    request = da.request(name, device_class, selectors=selectors)
    request['exactly'].pop('count')
    request['exactly']['allocationMode'] = 'All'
    return request


class TestCdiPerDevice(testtools.TestCase):
    """One CDI device per claim device, one per request, as kubelet and
    the runtime use them: kubelet gives a container the ids of every
    device of its requests, the runtime resolves them in the spec."""

    def setUp(self):
        super().setUp()
        self.node = self.useFixture(DraNode())
        self.units = {(u.gpu_address, u.partition): u
                      for u in self.node.plugin.units}

    def prepared(self, claim):
        entry = self.node.prepare(claim)[claim['metadata']['uid']]
        self.assertEqual('', entry.error)
        return entry

    def container(self, claim, entry, request=''):
        return cdiruntime.inject([self.node.spec(claim)],
                                 drakubelet.container_cdi_ids(entry, request))

    def results(self, claim):
        return claim['status']['allocation']['devices']['results']

    def test_every_device_of_a_counted_request_has_its_own_cdi_device(self):
        claim = self.node.allocate('c', [da.request(
            'p', 'partition.' + DRIVER, count=3)])
        entry = self.prepared(claim)
        uid = claim['metadata']['uid']
        self.assertEqual([r['device'] for r in self.results(claim)],
                         [d.device_name for d in entry.devices])
        own = [list(d.cdi_device_ids)[0] for d in entry.devices]
        self.assertEqual(['k8s.gpu.amd.com/gpu=%s-%s' % (uid, r['device'])
                          for r in self.results(claim)], own)
        # the request's edits come once, with the first device
        self.assertEqual([2, 1, 1], [len(d.cdi_device_ids)
                                     for d in entry.devices])
        got = self.container(claim, entry, 'p')
        self.assertEqual([], got.clashes)
        state = self.node.plugin.state.load()[uid]
        units = [self.units[(d.gpu, d.partitions[0])] for d in state.devices]
        want = {'/dev/kfd': (237, 0)}
        for unit in units:
            want[unit.card_path] = (226, unit.card_minor)
            want[unit.render_path] = (226, unit.render_minor)
        self.assertEqual(want, got.devices)
        self.assertEqual(','.join(u.rocr_id for u in units),
                         got.env['ROCR_VISIBLE_DEVICES'])
        self.assertEqual('0,1,2', got.env['HIP_VISIBLE_DEVICES'])
        # a CDI device holds exactly its device's nodes
        spec = {d['name']: d for d in self.node.spec(claim)['devices']}
        for result, unit in zip(self.results(claim), units, strict=True):
            nodes = spec['%s-%s' % (uid, result['device'])][
                'containerEdits']['deviceNodes']
            self.assertEqual({unit.card_path, unit.render_path},
                             {n['path'] for n in nodes})

    def test_allocation_mode_all_of_one_gpu(self):
        gpu = self.node.inventory.gpus[0]
        claim = self.node.allocate('c', [all_of(
            'p', 'partition.' + DRIVER, selectors=[
                'device.attributes["%s"].pciAddress == "%s"' % (
                    DRIVER, gpu.address)])])
        entry = self.prepared(claim)
        self.assertEqual(len(gpu.partitions), len(entry.devices))
        got = self.container(claim, entry, 'p')
        self.assertEqual([], got.clashes)
        self.assertEqual(1 + 2 * len(gpu.partitions), len(got.devices))
        self.assertEqual(len(gpu.partitions), len(got.env[
            'ROCR_VISIBLE_DEVICES'].split(',')))

    def test_two_shares_in_one_request(self):
        claim = self.node.allocate('c', [da.request(
            's', 'share.' + DRIVER, count=2,
            capacity={'computeUnits': '12', 'memory': '2Gi'})])
        entry = self.prepared(claim)
        self.assertEqual(2, len(entry.devices))
        got = self.container(claim, entry, 's')
        self.assertEqual([], got.clashes)
        mask = cumask.parse_hsa_cu_mask(got.env['HSA_CU_MASK'], 38)
        for index in (0, 1):
            self.assertEqual(12, bin(mask.mask_for(index)).count('1'))
            self.assertEqual('2048m', got.env[
                'HIP_DEVICE_MEMORY_LIMIT_%d' % index])
        self.assertEqual(hami_library(), got.env['LD_AUDIT'])
        self.assertEqual([hami_library()], list(got.mounts))
        # each share's CDI device carries its own limit and its shareID
        uid = claim['metadata']['uid']
        spec = {d['name']: d for d in self.node.spec(claim)['devices']}
        for index, result in enumerate(self.results(claim)):
            name = '%s-%s-%s' % (uid, result['device'], result['shareID'])
            self.assertEqual(['HIP_DEVICE_MEMORY_LIMIT_%d=2048m' % index],
                             spec[name]['containerEdits']['env'])

    def test_one_shared_device_twice_in_one_claim(self):
        gpu = self.node.inventory.gpus[1]
        pin = ['device.attributes["%s"].pciAddress == "%s" && '
               'device.attributes["%s"].partitionIndex == 0' % (
                   DRIVER, gpu.address, DRIVER)]
        claim = self.node.allocate('c', [
            da.request(name, 'share.' + DRIVER, selectors=pin,
                       capacity={'computeUnits': '8', 'memory': '1Gi'})
            for name in ('a', 'b')])
        results = self.results(claim)
        self.assertEqual(1, len({r['device'] for r in results}))
        entry = self.prepared(claim)
        names = [list(d.cdi_device_ids)[0] for d in entry.devices]
        self.assertEqual(2, len(set(names)))
        masks = [cumask.parse_hsa_cu_mask(self.container(
            claim, entry, request).env['HSA_CU_MASK'], 38).mask_for(0)
            for request in ('a', 'b')]
        self.assertFalse(masks[0] & masks[1])

    def test_containers_of_two_requests_get_their_own_gpus(self):
        claim = self.node.allocate('c', [
            da.request('p', 'partition.' + DRIVER),
            da.request('s', 'share.' + DRIVER,
                       capacity={'computeUnits': '8', 'memory': '1Gi'})])
        entry = self.prepared(claim)
        part = self.container(claim, entry, 'p')
        share = self.container(claim, entry, 's')
        for got in (part, share):
            self.assertEqual([], got.clashes)
            self.assertEqual(3, len(got.devices))  # kfd, card, render
        self.assertNotIn('HSA_CU_MASK', part.env)
        self.assertIn('HSA_CU_MASK', share.env)
        self.assertNotEqual(part.env['ROCR_VISIBLE_DEVICES'],
                            share.env['ROCR_VISIBLE_DEVICES'])
        # a container that takes the whole claim gets both requests'
        # device nodes, but one ROCR_VISIBLE_DEVICES (the documented limit)
        whole = self.container(claim, entry)
        self.assertEqual(5, len(whole.devices))
        self.assertIn('ROCR_VISIBLE_DEVICES',
                      {name for name, _a, _b in whole.clashes})

    def test_every_id_resolves_after_a_reboot_too(self):
        claim = self.node.allocate('c', [da.request(
            'p', 'partition.' + DRIVER, count=2)])
        entry = self.prepared(claim)
        os.unlink(cdi.spec_path(os.path.join(self.node.tmp, 'cdi'), DRIVER,
                                claim['metadata']['uid']))
        again = self.prepared(claim)
        self.assertEqual([list(d.cdi_device_ids) for d in entry.devices],
                         [list(d.cdi_device_ids) for d in again.devices])
        self.container(claim, again)  # resolves every id


def hami_library():
    from amdgpu_virt.sharing import hami
    return hami.LD_AUDIT_LIBRARY


class TestLayouts(testtools.TestCase):
    """The slices follow the API server's release, across upgrades.

    The plugin's own loop is slowed down so that only the test publishes.
    """

    QUIET = {'publish_interval': 3600}
    GATES = {'DRAPartitionableDevices': True, 'DRAConsumableCapacity': True}

    def layout(self, node):
        objs = node.slices()
        mixed = [o for o in objs if o['spec'].get('devices') and
                 o['spec'].get('sharedCounters')]
        counters_only = [o for o in objs if not o['spec'].get('devices')]
        if mixed and not counters_only:
            return 'mixed'
        if counters_only and not mixed:
            return 'separate'
        return 'both? %r' % [o['metadata']['name'] for o in objs]

    def allocate_all_kinds(self, node):
        claims = [node.allocate('w', [da.request('gpu', DRIVER)]),
                  node.allocate('p', [da.request('p', 'partition.' +
                                                 DRIVER)]),
                  node.allocate('s', [share_request('8', '1Gi')])]
        self.assertNotIn(None, claims)
        for claim in claims:
            entry = node.prepare(claim)[claim['metadata']['uid']]
            self.assertEqual('', entry.error)
        return claims

    def test_1_34_gets_counters_beside_their_devices(self):
        node = self.useFixture(DraNode(version=(1, 34), dra=self.QUIET,
                                       gates=self.GATES))
        self.assertEqual('mixed', self.layout(node))
        (obj,) = node.slices()
        for key in ('uid', 'resourceVersion', 'creationTimestamp'):
            obj['metadata'].pop(key, None)
        kubernetes_validate.validate(obj, '1.34.0', strict=True)
        self.allocate_all_kinds(node)

    def test_upgrade_and_downgrade_replace_the_layout(self):
        node = self.useFixture(DraNode(version=(1, 34), dra=self.QUIET,
                                       gates=self.GATES))
        claims = self.allocate_all_kinds(node)
        server = node.k8s.server
        for version, layout, generation in (((1, 35), 'separate', 2),
                                            ((1, 34), 'mixed', 3)):
            server.store.set_release(version, self.GATES)
            before = len(server.requests)
            self.assertTrue(node.plugin.refresh())
            self.assertEqual(layout, self.layout(node))
            self.assertEqual(layout, node.plugin.publisher.layout.value)
            objs = node.slices()
            self.assertEqual({generation}, {
                o['spec']['pool']['generation'] for o in objs})
            self.assertEqual({len(objs)}, {
                o['spec']['pool']['resourceSliceCount'] for o in objs})
            # the old layout's slices went first, then the new were made
            writes = [r.split()[0] for r in server.requests[before:]
                      if not r.startswith('GET') and 'dryRun' not in r]
            # the new release was asked what it keeps first
            self.assertIn('dryRun=All', ' '.join(server.requests[before:]))
            self.assertEqual(['DELETE'], sorted(set(writes[:writes.index(
                'POST')])))
            self.assertNotIn('DELETE', writes[writes.index('POST'):])
            self.assertNotIn('PUT', writes)
            # nothing changed since: nothing written
            self.assertFalse(node.plugin.refresh())
        # prepared claims survive, and the devices are the same ones
        self.assertEqual({c['metadata']['uid'] for c in claims},
                         set(node.plugin.state.load()))
        more = node.allocate('p2', [da.request('p', 'partition.' + DRIVER)])
        self.assertNotEqual(
            claims[1]['status']['allocation']['devices']['results'][0][
                'device'],
            more['status']['allocation']['devices']['results'][0]['device'])

    def test_a_forced_layout_is_used_whatever_the_server_says(self):
        node = self.useFixture(DraNode(
            version=(1, 35), dra=dict(self.QUIET, slice_layout='mixed'),
            gates=self.GATES))
        server = node.k8s.server
        self.assertNotIn('GET /version/', server.requests)
        self.assertNotIn('GET /version', server.requests)
        # a 1.35 server refuses the forced layout's probe: what is
        # published is what needs no gated field, whole GPUs
        self.assertEqual({'gpu'}, set(helpers_types(node.slices()).values()))
        self.assertFalse('counter' in json.dumps(node.slices()).lower())
        server.store.set_release((1, 34), self.GATES)
        node.plugin.publisher.forget()
        self.assertTrue(node.plugin.refresh())
        self.assertEqual('mixed', self.layout(node))

    def test_an_unreadable_version_publishes_nothing(self):
        node = self.useFixture(DraNode(version=(1, 35), dra=self.QUIET))
        published = node.slices()
        node.k8s.server.store.version = (1, 'x')
        err = self.assertRaises(exception.KubernetesError,
                                node.plugin.refresh)
        self.assertIn('/version', str(err))
        self.assertEqual(published, node.slices())


class TestLearning(testtools.TestCase):
    """How the plugin learns what the API server keeps."""

    def test_a_write_that_loses_fields_is_written_again_without_them(self):
        # the probe says counters are kept, the server drops them on the
        # write itself (a gate turned off in between): the slices are
        # created (someone deleted them), so nothing of them is "in use"
        node = self.useFixture(DraNode(dra={'publish_interval': 3600}))
        publisher = node.plugin.publisher
        publisher.probe = lambda version, layout: dra_served.Served(
            True, True, layout)
        node.k8s.server.store.set_release((1, 36), {
            'DRAPartitionableDevices': False})
        for obj in node.slices():
            node.k8s.resource.delete_resource_slice(obj['metadata']['name'])
        self.assertTrue(node.plugin.refresh())
        objs = node.slices()
        self.assertFalse('counter' in json.dumps(objs).lower())
        self.assertEqual({'gpu', 'share'},
                         set(helpers_types(objs).values()))
        self.assertFalse(publisher.served.counters)
        # written twice: with the counters the server dropped, then
        # without what they were for
        self.assertEqual({2}, {o['spec']['pool']['generation']
                               for o in objs})
        self.assertEqual({len(objs)}, {o['spec']['pool'][
            'resourceSliceCount'] for o in objs})
        # prepare follows what was published
        self.assertNotIn('partition', {d.type.value for d in
                                       node.plugin.plan.devices})
        self.assertFalse(node.plugin.refresh())

    def test_a_refused_dry_run_gives_the_release_s_defaults(self):
        node = self.useFixture(DraNode(version=(1, 35), gates={
            'DRAPartitionableDevices': True, 'DRAConsumableCapacity': True},
            dra={'publish_interval': 3600}))
        # with its gates on, 1.35 keeps partitions and shares
        self.assertEqual({'gpu', 'partition', 'share'},
                         set(helpers_types(node.slices()).values()))
        api = node.plugin.publisher.api
        create = api.create_resource_slice

        def no_dry_run(*args, **kwargs):
            if kwargs.get('dry_run'):
                raise kubernetes_exceptions.ApiException(
                    status=400, reason='admission webhook "x" does not '
                    'support dry run')
            return create(*args, **kwargs)
        api.create_resource_slice = no_dry_run
        node.plugin.publisher.forget()
        self.assertTrue(node.plugin.refresh())
        self.assertEqual({'gpu'}, set(helpers_types(node.slices()).values()))
        # an API server that does not serve ResourceSlices is named
        api.get_api_resources = lambda **kw: (_ for _ in ()).throw(
            kubernetes_exceptions.ApiException(status=404))
        node.plugin.publisher.forget()
        err = self.assertRaises(exception.KubernetesError,
                                node.plugin.refresh)
        self.assertIn('does not serve ResourceSlices', str(err))


def _strip(obj):
    obj = dict(obj, metadata=dict(obj['metadata']))
    obj.pop('status', None)
    for key in ('uid', 'resourceVersion', 'creationTimestamp'):
        obj['metadata'].pop(key, None)
    return obj


class TestReleases(testtools.TestCase):
    """Each release with its default feature gates, end to end: the
    plugin publishes what that API server keeps, a scheduler with the
    same gates allocates, kubelet prepares. Whole GPUs everywhere;
    partitions and shares on 1.36 and later."""

    def idle_writes(self, node, seconds=2.5):
        """Slice writes (and probes) while the plugin's loop runs
        ``seconds`` with nothing changed."""
        server = node.k8s.server
        before = len(server.requests)
        writes = server.store.writes.get('resourceslices', 0)
        time.sleep(seconds)
        requests = server.requests[before:]
        # the loop did run (it reads the version every time)
        self.assertGreaterEqual(sum(r == 'GET /version/' or
                                    r == 'GET /version' for r in requests),
                                2)
        return (server.store.writes.get('resourceslices', 0) - writes,
                [r for r in requests if 'resourceslices' in r and
                 not r.startswith('GET')])

    def test_each_release_s_defaults(self):
        for version in ((1, 34), (1, 35), (1, 36), (1, 37)):
            node = self.useFixture(DraNode(version=version))
            full = version >= (1, 36)
            label = '1.%d' % version[1]
            # a plugin left running with nothing changed writes nothing
            self.assertEqual((0, []), self.idle_writes(node), label)
            objs = node.slices()
            for obj in objs:
                kubernetes_validate.validate(
                    _strip(obj), '%s.0' % label, strict=True)
            types = set(helpers_types(objs).values())
            self.assertEqual({'gpu', 'partition', 'share'} if full
                             else {'gpu'}, types, label)
            whole = node.allocate('whole', [da.request('gpu', DRIVER)])
            part = node.allocate('part', [da.request(
                'p', 'partition.' + DRIVER)])
            share = node.allocate('share', [share_request('8', '1Gi')])
            self.assertIsNotNone(whole, label)
            self.assertEqual(full, part is not None, label)
            self.assertEqual(full, share is not None, label)
            for claim in filter(None, (whole, part, share)):
                self.assertEqual('', node.prepare(claim)[
                    claim['metadata']['uid']].error, label)
            if full:
                env = env_of(node.spec(share))
                self.assertEqual('1024m', env['HIP_DEVICE_MEMORY_LIMIT_0'])

    def test_partitions_instead_of_whole_gpus(self):
        node = self.useFixture(DraNode(version=(1, 34), dra={
            'partitions_without_counters': 'partitions'}))
        self.assertEqual((0, []), self.idle_writes(node))
        objs = node.slices()
        self.assertEqual({'partition'}, set(helpers_types(objs).values()))
        self.assertFalse('counter' in json.dumps(objs).lower())
        self.assertIsNone(node.allocate('w', [da.request('gpu', DRIVER)]))
        part = node.allocate('p', [da.request('p', 'partition.' + DRIVER)])
        # a whole GPU: all of its partitions, of one GPU
        whole = node.allocate('all', [da.request(
            'g', 'partition.' + DRIVER, count=8)], constraints=[{
                'matchAttribute': DRIVER + '/pciAddress'}])
        for claim in (part, whole):
            self.assertEqual('', node.prepare(claim)[
                claim['metadata']['uid']].error)
        env = env_of(node.spec(whole))
        self.assertEqual(8, len(env['ROCR_VISIBLE_DEVICES'].split(',')))
        gpus = {r['device'].rsplit('-p', 1)[0] for r in whole['status'][
            'allocation']['devices']['results']}
        self.assertEqual(1, len(gpus))

    def test_an_upgrade_adds_partitions_and_shares(self):
        node = self.useFixture(DraNode(version=(1, 35), dra={
            'publish_interval': 3600}))
        whole = node.allocate('w', [da.request('gpu', DRIVER)])
        node.prepare(whole)
        node.k8s.server.store.set_release((1, 36))
        self.assertTrue(node.plugin.refresh())
        self.assertEqual({'gpu', 'partition', 'share'},
                         set(helpers_types(node.slices()).values()))
        # what was prepared before stays prepared, and the scheduler
        # (the allocator with 1.36's gates) charges the whole GPU's
        # counters: none of its partitions is handed out
        self.assertEqual('', node.prepare(whole)[
            whole['metadata']['uid']].error)
        taken = whole['status']['allocation']['devices']['results'][0][
            'device']
        for n in range(30):
            part = node.allocate('p%d' % n, [da.request(
                'p', 'partition.' + DRIVER)])
            if part is None:
                break
            self.assertFalse(part['status']['allocation']['devices'][
                'results'][0]['device'].startswith(taken + '-'))
        self.assertFalse(node.plugin.refresh())


class TestHostileClaims(testtools.TestCase):

    def setUp(self):
        super().setUp()
        self.node = self.useFixture(DraNode())

    def refused(self, claim, *words):
        entry = self.node.prepare(claim)[claim['metadata']['uid']]
        for word in words:
            self.assertIn(word, entry.error)
        self.assertEqual(0, len(entry.devices))
        self.assertFalse(os.path.exists(cdi.spec_path(
            os.path.join(self.node.tmp, 'cdi'), DRIVER,
            claim['metadata']['uid'])))
        self.assertEqual({}, self.node.plugin.state.load())

    def test_status_naming_another_driver(self):
        claim = self.node.allocate('c', [da.request('gpu', DRIVER)])
        claim['status']['allocation']['devices']['results'][0][
            'driver'] = 'gpu.example.com'
        claim = self.node.set_status(claim)
        self.refused(claim, 'default/c', 'gpu.example.com')

    def test_device_not_ours(self):
        claim = self.node.allocate('c', [da.request('gpu', DRIVER)])
        nova_gpu = self.node.inventory.gpus[2].address
        claim['status']['allocation']['devices']['results'][0][
            'device'] = helpers_label(nova_gpu)
        claim = self.node.set_status(claim)
        self.refused(claim, helpers_label(nova_gpu), 'does not publish')

    def test_share_id_that_cannot_name_a_cdi_device(self):
        claim = self.node.allocate('c', [share_request('8', '1Gi')])
        claim['status']['allocation']['devices']['results'][0][
            'shareID'] = '../../etc/x'
        claim = self.node.set_status(claim)
        self.refused(claim, 'shareID', 'not a UUID')

    def test_consumed_capacity_beyond_the_device(self):
        claim = self.node.allocate('c', [share_request('8', '1Gi')])
        claim['status']['allocation']['devices']['results'][0][
            'consumedCapacity'] = {'computeUnits': '77', 'memory': '1Gi'}
        claim = self.node.set_status(claim)
        self.refused(claim, 'computeUnits 77')

    def test_unallocated_and_missing_claims(self):
        stored = _raw(self.node.k8s.resource.create_namespaced_resource_claim(
            'default', da.claim('c', [da.request('gpu', DRIVER)]),
            _preload_content=False))
        self.refused(stored, 'not allocated')
        ghost = {'metadata': {'namespace': 'default', 'name': 'ghost',
                              'uid': 'a-b'}}
        self.refused(ghost, 'ghost')

    def test_corrupt_state_file(self):
        claim = self.node.allocate('c', [da.request('gpu', DRIVER)])
        with open(self.node.plugin.state.path, 'w') as handle:
            handle.write('{"version": 1, "claims": {"x": {"devices": 5}}}')
        entry = self.node.prepare(claim)[claim['metadata']['uid']]
        self.assertIn(self.node.plugin.state.path, entry.error)
        self.assertIn('claims[x]', entry.error)
        self.node.stop_plugin()
        self.assertRaises(exception.DraStateError, self.node.start_plugin)


def helpers_label(address):
    return dra_devices.gpu_label(address)


def helpers_types(objs):
    return {d['name']: d['attributes']['type']['string']
            for s in objs for d in s['spec'].get('devices', [])}
