"""One pool, two clouds: audit and move against both real APIs at once.

Placement is the real openstack-placement server of the fixture (providers
seeded the way nova-compute reports PCI devices); Kubernetes is the API
server stand-in with the real ``kubernetes`` client. The commands run
in-process through the cliff application, configured by a config file that
points at both. What nova-compute and the node agent would do when the
operator acts (remove a provider after a restart, register a GPU) the
tests do themselves, between the runs of ``amdgpu-virt move``.
"""

from __future__ import annotations

import io
import json
import os
import socket
import shutil
import unittest
import uuid

import fixtures
import testtools
import yaml

from amdgpu_virt import conf as conf_pkg
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.cmd import main as av_main
from amdgpu_virt.cmd import pool as cmd_pool
from amdgpu_virt.inventory import simulate
from amdgpu_virt.inventory import snapshot
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.nova import naming
from amdgpu_virt.nova import plan as nova_plan
from amdgpu_virt.pool import apply as pool_apply
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import kubeclient
from tests.functional.fixtures import nova_env
from tests.functional.fixtures import placement as placement_fixture

GPU0 = '0000:05:00.0'
GPU1 = '0000:25:00.0'


class PoolTestCase(testtools.TestCase):
    """Two hosts: ``<id>-vm`` (GIM, nova-vf) and ``<id>-k8s`` (amdgpu)."""

    def setUp(self):
        super().setUp()
        self.tmp = self.useFixture(fixtures.TempDir()).path
        self.server = placement_fixture.get_server()
        self.conn = self.server.connection()
        self.seeder = placement_fixture.NovaLikeSeeder(self.conn)
        self.k8s = self.useFixture(kubeclient.ApiServerFixture())
        self.make_hosts()

    def make_hosts(self):
        """Fresh hosts, ledger, snapshots and config file under
        ``self.tmp`` (a test may call it again with another ``tmp``)."""
        tag = uuid.uuid4().hex[:8]
        self.vm_host = 'p%s-vm' % tag
        self.k8s_host = 'p%s-k8s' % tag
        self.specs = {
            self.vm_host: simulate.HostSpec(self.vm_host, gpus=2,
                                            mode='gim-cpx'),
            self.k8s_host: simulate.HostSpec(self.k8s_host, gpus=2,
                                             mode='spx')}
        self.inventories = {h: simulate.design_host(s)
                            for h, s in self.specs.items()}
        self.fleet = os.path.join(self.tmp, 'fleet.yaml')
        with open(self.fleet, 'w') as handle:
            handle.write(yamlutil.dump({'hosts': [
                {'hostname': s.hostname, 'gpus': s.gpus, 'mode': s.mode}
                for s in self.specs.values()]}))
        self.snapshots = os.path.join(self.tmp, 'snapshots')
        os.makedirs(self.snapshots)
        for inventory in self.inventories.values():
            self.write_snapshot(inventory)
        self.ledger = av_ledger.build(
            [av_ledger.GpuAssignment(self.vm_host, PciAddress.parse(a),
                                     Role.NOVA_VF, 'MI300X', vf_count=8)
             for a in (GPU0, GPU1)]
            + [av_ledger.GpuAssignment(self.k8s_host, PciAddress.parse(a),
                                       Role.K8S_SHARED, 'MI300X')
               for a in (GPU0, GPU1)])
        self.ledger_path = os.path.join(self.tmp, 'ledger.yaml')
        av_ledger.save(self.ledger, self.ledger_path)
        self.conf_file = os.path.join(self.tmp, 'amdgpu-virt.conf')
        with open(self.conf_file, 'w') as handle:
            handle.write('[nova]\nplacement_endpoint = %s\ntoken = admin\n'
                         '[kubernetes]\nkubeconfig = %s\n' % (
                             self.server.url,
                             self.k8s.write_kubeconfig(self.tmp)))
        for host in self.specs:
            self.k8s.server.put_object('nodes', {
                'apiVersion': 'v1', 'kind': 'Node',
                'metadata': {'name': host}})

    # -- helpers --------------------------------------------------------------

    def write_snapshot(self, inventory):
        with open(os.path.join(self.snapshots,
                               inventory.hostname + '.json'), 'w') as handle:
            handle.write(snapshot.dumps(inventory))

    def run_cli(self, *argv):
        app = av_main.AmdgpuVirtApp()
        app.stdout = io.StringIO()
        app.stderr = io.StringIO()
        rc = app.run(['--config-file', self.conf_file] + list(argv))
        return rc, app.stdout.getvalue(), app.stderr.getvalue()

    def seed_nova(self, host=None, ledger=None):
        """Providers for the Nova GPUs of ``host``; name -> uuid."""
        host = host or self.vm_host
        plan = nova_plan.plan_host(self.inventories[host], naming.Naming(),
                                   ledger or self.ledger, host)
        return self.seeder.seed_offers(host, plan.offers)

    def allocate(self, rp_uuid):
        plan = nova_plan.plan_host(self.inventories[self.vm_host],
                                   naming.Naming(), self.ledger, self.vm_host)
        consumer = str(uuid.uuid4())
        self.seeder.allocate(consumer, rp_uuid,
                             {plan.offers[0].resource_class: 1})
        return consumer

    def free(self, consumer):
        response = self.conn.placement.request(
            '/allocations/%s' % consumer, 'DELETE', raise_exc=False)
        self.assertEqual(204, response.status_code)

    def register(self, host, infos):
        node = self.k8s.api.read_node(host)
        self.k8s.api.patch_node(host, {'metadata': {
            'resourceVersion': node.metadata.resource_version,
            'annotations': {
                hami.NODE_REGISTER: hami.encode_node_register(infos)}}})

    def register_k8s_host(self, host=None, gpus=None):
        host = host or self.k8s_host
        units = devices.units_from_inventory(self.inventories[host], gpus)
        infos = agent.registration(units, 10, {})
        self.register(host, infos)
        return infos

    def run_agent(self, host):
        """One registration by the node agent of ``host``, which reads its
        roles from the ledger ConfigMap (``ledger_source = configmap``)."""
        conf = conf_pkg.new_conf()
        conf.set_override('ledger_source', 'configmap', 'kubernetes')
        conf.set_override('node_name', host, 'kubernetes')
        node_agent = agent.from_conf(
            conf, self.inventories[host],
            store=agent.KubernetesNodeStore(host, self.k8s.api))
        # the health check looks for /dev/kfd and the DRM nodes, which a
        # machine without AMD GPUs lacks
        node_agent.health = lambda unit: True
        node_agent.sync_once()
        return self.registered(host)

    def registered(self, host):
        """GPU addresses in the node's registration."""
        node = self.k8s.server.get_object('nodes', host)
        value = (node['metadata'].get('annotations') or {}).get(
            hami.NODE_REGISTER)
        return [i.custominfo[hami.CUSTOMINFO_PCI_BDF] for i in
                hami.decode_node_register(value)] if value else []

    def push_ledger(self):
        ledgermap.write(self.k8s.api, self.ledger, ledgermap.Location(
            'kube-system', 'amdgpu-virt-ledger'))

    def foreign_info(self, address, device_id):
        return hami.DeviceInfo(
            id=device_id, count=10, devmem=196288, devcore=304,
            type='AMD Instinct MI300X', health=True, devicevendor='amd',
            custominfo={hami.CUSTOMINFO_PCI_BDF: address})

    def pod(self, host, name, device_ids, bound=True, namespace='default',
            annotations=None):
        """A pod holding ``device_ids`` of ``host`` (ids, or (id, MiB,
        CUs); 8192 MiB and 76 CUs by default): bound, or chosen by the
        extender and being bound (not yet on the node)."""
        sized = [(d, 8192, 76) if isinstance(d, str) else tuple(d)
                 for d in device_ids]
        value = hami.encode_pod_devices([[hami.ContainerDevice(
            d, 'AMD Instinct MI300X', mib, cus) for d, mib, cus in sized]])
        pod = {
            'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {'name': name, 'namespace': namespace,
                         'annotations': dict(annotations or {}, **{
                             hami.DEVICES_ALLOCATED: value})},
            'spec': {'nodeName': host, 'containers': [
                {'name': 'c', 'image': 'busybox'}]},
            'status': {'phase': 'Running'}}
        if not bound:
            del pod['spec']['nodeName']
            pod['status']['phase'] = 'Pending'
            pod['metadata']['labels'] = {hami.VGPU_NODE: host}
            pod['metadata']['annotations'].update({
                hami.DEVICES_TO_ALLOCATE: value, hami.VGPU_NODE: host,
                hami.BIND_PHASE: 'allocating'})
        return self.k8s.server.put_object('pods', pod)

    def audit(self, *extra):
        rc, stdout, stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet,
            '-f', 'json', *extra)
        return rc, json.loads(stdout), stderr

    @staticmethod
    def kinds(report, host=None, address=None):
        return sorted({f['kind'] for f in report['findings']
                       if (host is None or f['host'] == host)
                       and (address is None or f['address'] == address)})


class TestAudit(PoolTestCase):

    def test_consistent_pool_has_no_conflict(self):
        ids = self.seed_nova()
        self.allocate(ids['%s_%s' % (self.vm_host, GPU0.upper())])
        infos = self.register_k8s_host()
        self.pod(self.k8s_host, 'trainer', [infos[0].id])
        rc, report, _stderr = self.audit()
        self.assertEqual(0, rc, report)
        self.assertEqual(0, report['conflicts'])
        self.assertEqual({'nova': 2, 'k8s': 2}, report['offered'])
        self.assertEqual({'nova': 1, 'k8s': 1}, report['in_use'])
        self.assertEqual(['nova', 'k8s'], report['sides'])
        # the table says the same, and exits the same way
        rc, stdout, _stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet)
        self.assertEqual(0, rc)
        self.assertIn('0 conflict(s)', stdout)

    def test_double_booking_is_caught(self):
        ids = self.seed_nova()
        vm = self.allocate(ids['%s_%s' % (self.vm_host, GPU0.upper())])
        self.register_k8s_host()
        # the GIM host's first GPU is also registered in Kubernetes and a
        # pod holds it: one GPU, two tenants
        self.register(self.vm_host, [self.foreign_info(GPU0, 'rogue-0')])
        self.pod(self.vm_host, 'squatter', ['rogue-0'])
        rc, report, _stderr = self.audit()
        self.assertEqual(1, rc)
        self.assertEqual(['double-offer', 'double-use',
                          'use-against-ledger'],
                         self.kinds(report, self.vm_host, GPU0))
        (double,) = [f for f in report['findings']
                     if f['kind'] == 'double-use']
        self.assertEqual('conflict', double['severity'])
        self.assertIn(vm, double['message'])
        self.assertIn('default/squatter', double['message'])
        rc, stdout, _stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet,
            '--min-severity', 'conflict')
        self.assertEqual(1, rc)
        self.assertIn('double-use', stdout)
        self.assertNotIn('not-offered', stdout)
        # cliff's formatters: csv with chosen columns, counts on stderr
        rc, stdout, stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet,
            '--min-severity', 'conflict', '-f', 'csv', '-c', 'GPU',
            '-c', 'Finding')
        self.assertEqual(1, rc)
        lines = stdout.splitlines()
        self.assertEqual('"GPU","Finding"', lines[0])
        self.assertIn('"%s","double-use"' % GPU0, lines)
        self.assertIn('conflict(s)', stderr)
        self.assertNotIn('conflict(s)', stdout)
        rc, stdout, _stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet,
            '-f', 'yaml')
        self.assertIn('double-use', {f['kind'] for f in yaml.safe_load(
            stdout)['findings']})

    def test_every_conflict_kind(self):
        ids = self.seed_nova()
        self.allocate(ids['%s_%s' % (self.vm_host, GPU0.upper())])
        k8s_infos = self.register_k8s_host()
        self.register(self.vm_host, [self.foreign_info(GPU0, 'rogue-0'),
                                     self.foreign_info(GPU1, 'rogue-1')])
        self.pod(self.vm_host, 'squatter', ['rogue-0'])
        # Nova offers a Kubernetes GPU, with nobody on it...
        plan = nova_plan.plan_host(
            self.inventories[self.vm_host], naming.Naming(), self.ledger,
            self.vm_host)
        root = ids[self.vm_host]
        self.seeder.pci_device(root, self.k8s_host, GPU1,
                               plan.offers[0].resource_class, 8,
                               plan.offers[0].traits)
        # ...and a Nova instance sits on another one that a pod also uses
        rp = self.seeder.pci_device(root, self.k8s_host, GPU0,
                                    plan.offers[0].resource_class, 8,
                                    plan.offers[0].traits)
        self.allocate(rp)
        self.pod(self.k8s_host, 'trainer', [k8s_infos[0].id])
        rc, report, _stderr = self.audit()
        self.assertEqual(1, rc)
        conflicts = {f['kind'] for f in report['findings']
                     if f['severity'] == 'conflict'}
        self.assertEqual({'double-offer', 'double-use',
                          'offer-against-ledger', 'use-against-ledger'},
                         conflicts)
        self.assertEqual(['double-offer', 'offer-against-ledger'],
                         self.kinds(report, self.vm_host, GPU1))
        self.assertEqual(['double-offer', 'offer-against-ledger'],
                         self.kinds(report, self.k8s_host, GPU1))
        self.assertEqual(['double-offer', 'double-use',
                          'use-against-ledger'],
                         self.kinds(report, self.k8s_host, GPU0))

    def test_drift_and_one_sided_audit(self):
        # nothing is offered anywhere: stranded capacity, no conflict:
        # drift, with its own exit status
        rc, report, _stderr = self.audit()
        self.assertEqual(cmd_pool.EXIT_DRIFT, rc)
        self.assertEqual(['not-offered'], self.kinds(report))
        self.assertEqual(4, report['stranded'])
        # a deployment without Kubernetes: its GPUs are not reported
        rc, report, _stderr = self.audit('--no-k8s')
        self.assertEqual(cmd_pool.EXIT_DRIFT, rc)
        self.assertEqual(['nova'], report['sides'])
        self.assertEqual({self.vm_host},
                         {f['host'] for f in report['findings']})

    def test_configmap_that_differs_is_a_warning(self):
        ledgermap.write(self.k8s.api, self.ledger.restrict([self.vm_host]),
                        ledgermap.Location('kube-system',
                                           'amdgpu-virt-ledger'))
        rc, report, stderr = self.audit()
        self.assertEqual(cmd_pool.EXIT_DRIFT, rc)   # stranded, no conflict
        self.assertIn('configmap kube-system/amdgpu-virt-ledger holds '
                      'another ledger', stderr)
        self.assertEqual(1, len(report['warnings']))
        ledgermap.write(self.k8s.api, self.ledger, ledgermap.Location(
            'kube-system', 'amdgpu-virt-ledger'))
        rc, report, stderr = self.audit()
        self.assertEqual([], report['warnings'])

    def test_unreadable_annotations_are_warnings(self):
        self.seed_nova()
        self.register_k8s_host()
        self.pod(self.k8s_host, 'ghost', ['not-registered'])
        rc, report, stderr = self.audit()
        self.assertEqual(0, rc)
        self.assertIn('default/ghost holds device not-registered',
                      stderr)
        self.assertEqual(1, len(report['warnings']))

    def test_bad_ledger_names_the_gpu_and_field(self):
        # GIM runs the host in NPS4 (8 VFs); a pod GPU cannot be NPS1
        broken = self.ledger.replace(av_ledger.GpuAssignment(
            self.vm_host, PciAddress.parse(GPU1), Role.K8S_SHARED,
            'MI300X', compute_mode='SPX', memory_mode='NPS1'))
        av_ledger.save(broken, self.ledger_path)
        rc, stdout, stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet)
        self.assertEqual(65, rc)
        self.assertEqual('', stdout)
        self.assertIn('%s: host %s' % (self.ledger_path, self.vm_host),
                      stderr)
        self.assertIn('field memory_mode', stderr)
        self.assertIn('%s NPS1 (k8s-shared)' % GPU1, stderr)
        # a GPU the host does not have
        missing = self.ledger.replace(av_ledger.GpuAssignment(
            self.k8s_host, PciAddress.parse('0000:99:00.0'), Role.IDLE,
            'MI300X'))
        av_ledger.save(missing, self.ledger_path)
        rc, _stdout, stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet)
        self.assertEqual(65, rc)
        self.assertIn('host %s GPU 0000:99:00.0' % self.k8s_host, stderr)
        self.assertIn('field address', stderr)


class TestApply(PoolTestCase):

    def test_apply_renders_both_sides_and_pushes_the_configmap(self):
        out = os.path.join(self.tmp, 'out')
        args = ('apply', '--ledger', self.ledger_path, '--fleet', self.fleet,
                '--output-dir', out, '--push-configmap')
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(0, rc, stdout)
        self.assertIn('updated configmap kube-system/amdgpu-virt-ledger',
                      stdout)
        snippet = os.path.join(out, self.vm_host, pool_apply.NOVA_SNIPPET)
        with open(snippet) as handle:
            self.assertEqual(2, handle.read().count('device_spec = '))
        self.assertTrue(os.path.exists(os.path.join(
            out, self.vm_host, 'host/etc/gim_config')))
        # the Kubernetes side reads the ConfigMap: no configuration per
        # host, only the DRA slices to review
        self.assertEqual(['dra-resourceslices.yaml'], os.listdir(
            os.path.join(out, self.k8s_host, 'k8s')))
        self.assertTrue(os.path.exists(os.path.join(
            out, pool_apply.CONFIGMAP_FILE)))
        stored = ledgermap.read(self.k8s.api, ledgermap.Location(
            'kube-system', 'amdgpu-virt-ledger'))
        self.assertEqual(self.ledger, stored)
        self.assertEqual(2, len(ledgermap.k8s_gpus(stored, self.k8s_host)))
        # what a node agent reads for its node
        self.assertEqual((GPU0, GPU1), ledgermap.node_gpus(
            self.k8s.api, ledgermap.Location('kube-system',
                                             'amdgpu-virt-ledger'),
            self.k8s_host))
        self.assertEqual((), ledgermap.node_gpus(
            self.k8s.api, ledgermap.Location('kube-system',
                                             'amdgpu-virt-ledger'),
            self.vm_host))
        self.assertIsNone(ledgermap.node_gpus(
            self.k8s.api, ledgermap.Location('kube-system', 'other'),
            self.k8s_host))
        before = len(self.k8s.server.requests)
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(0, rc)
        self.assertIn('(nothing to do)', stdout)
        self.assertIn('unchanged configmap', stdout)
        writes = [r for r in self.k8s.server.requests[before:]
                  if not r.startswith('GET')]
        self.assertEqual([], writes)


@unittest.skipUnless(nova_env.AVAILABLE, nova_env.SKIP_REASON)
class TestApplyFlavors(PoolTestCase):

    def test_push_flavors_checks_aliases_against_the_ledger(self):
        from tests.functional.fixtures import nova_api
        server = nova_api.get_server()
        name = 'gpu.%s' % uuid.uuid4().hex[:8]
        flavors_file = os.path.join(self.tmp, 'flavors.yaml')
        with open(flavors_file, 'w') as handle:
            handle.write(yamlutil.dump({'flavors': [{
                'name': name, 'vcpus': 8, 'ram_mib': 65536, 'disk_gb': 40,
                'alias': 'amd-mi300x-cpx-vf', 'count': 1}]}))
        with open(self.conf_file, 'a') as handle:
            handle.write('[nova]\ncompute_endpoint = %s\ntoken = admin:admin'
                         '\nflavors_file = %s\n' % (server.url, flavors_file))
        args = ('apply', '--ledger', self.ledger_path, '--fleet', self.fleet,
                '--output-dir', os.path.join(self.tmp, 'out'),
                '--push-flavors')
        rc, stdout, stderr = self.run_cli(*args)
        self.assertEqual(0, rc, stderr)
        self.assertIn('flavor %s: created' % name, stdout)
        flavor = server.connection().compute.find_flavor(name)
        self.assertEqual('amd-mi300x-cpx-vf:1',
                         flavor.extra_specs['pci_passthrough:alias'])
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertIn('flavor %s: unchanged' % name, stdout)
        # a ledger without Nova VFs has no such alias: refused
        only_pods = av_ledger.build(
            a for a in self.ledger.assignments if a.host == self.k8s_host)
        av_ledger.save(only_pods, self.ledger_path)
        rc, _stdout, stderr = self.run_cli(*args)
        self.assertEqual(78, rc)
        self.assertIn('amd-mi300x-cpx-vf', stderr)


class TestMove(PoolTestCase):

    def move(self, *extra):
        return self.run_cli(
            'move', '--ledger', self.ledger_path, '--gpu',
            '%s:%s' % (self.vm_host, GPU1), '--to', 'k8s-shared',
            '--snapshot-dir', self.snapshots, '--state-dir',
            os.path.join(self.tmp, 'state'), '--output-dir',
            os.path.join(self.tmp, 'out'), *extra)

    def provider(self, address):
        name = naming.provider_name(self.vm_host, address)
        body = self.conn.placement.get(
            '/resource_providers', params={'name': name},
            microversion='1.39').json()
        found = body['resource_providers']
        return found[0]['uuid'] if found else None

    def test_move_from_nova_vf_to_k8s_shared(self):
        ids = self.seed_nova()
        vm = self.allocate(ids['%s_%s' % (self.vm_host, GPU1.upper())])
        snippet = os.path.join(self.tmp, 'out', self.vm_host,
                               pool_apply.NOVA_SNIPPET)
        # 1. a VM holds the GPU: refused, nothing changes
        rc, stdout, _stderr = self.move()
        self.assertEqual(1, rc, stdout)
        self.assertIn('still has consumers', stdout)
        self.assertIn(vm, stdout)
        self.assertFalse(os.path.exists(snippet))
        # 2. the VM is gone: Nova stops offering it, the move waits for
        #    nova-compute to drop the provider
        self.free(vm)
        rc, stdout, _stderr = self.move()
        self.assertEqual(75, rc, stdout)
        self.assertIn('step check-unused: ok', stdout)
        self.assertIn('step stop-offering: ok', stdout)
        self.assertIn('restart nova-compute', stdout)
        self.assertIn('waiting for nova to stop offering', stdout)
        with open(snippet) as handle:
            text = handle.read()
        self.assertEqual(1, text.count('device_spec = '))
        self.assertNotIn('0000:25:02', text)
        # nothing moves until Nova confirms
        rc, stdout, _stderr = self.move()
        self.assertEqual(75, rc)
        self.assertNotIn('step stop-offering', stdout)
        # 3. nova-compute restarted: the provider is gone; now the host
        #    must change
        self.seeder.delete(self.provider(GPU1))
        rc, stdout, _stderr = self.move()
        self.assertEqual(75, rc, stdout)
        self.assertIn('step confirm-withdrawn: ok', stdout)
        self.assertIn('change host %s' % self.vm_host, stdout)
        self.assertIn('reboot %s' % self.vm_host, stdout)
        gim_conf = os.path.join(self.tmp, 'out', self.vm_host,
                                'host/etc/modprobe.d/amdgpu-virt-gim.conf')
        with open(gim_conf) as handle:
            self.assertIn('enabled_devices=%s\n' % GPU0, handle.read())
        # 4. the host rebooted with the GPU under amdgpu: Kubernetes gets
        #    it through the ledger ConfigMap
        changed = simulate.design_host(simulate.HostSpec(
            self.vm_host, gpus=2, gpu_modes=('gim-cpx', 'spx')))
        self.write_snapshot(changed)
        rc, stdout, _stderr = self.move()
        self.assertEqual(75, rc, stdout)
        self.assertIn('step host-change: ok', stdout)
        self.assertIn('step offer: ok', stdout)
        self.assertIn('waiting for k8s to offer', stdout)
        stored = ledgermap.read(self.k8s.api, ledgermap.Location(
            'kube-system', 'amdgpu-virt-ledger'))
        self.assertEqual((GPU1,), ledgermap.k8s_gpus(stored, self.vm_host))
        # 5. the node agent registers what the ConfigMap gives it
        self.inventories[self.vm_host] = changed
        self.assertEqual([GPU1], self.run_agent(self.vm_host))
        rc, stdout, _stderr = self.move()
        self.assertEqual(0, rc, stdout)
        self.assertIn('step confirm-offered: ok', stdout)
        self.assertIn('is now k8s-shared', stdout)
        updated = av_ledger.load(self.ledger_path)
        self.assertEqual(Role.K8S_SHARED,
                         updated.get(self.vm_host, GPU1).role)
        self.assertEqual(Role.NOVA_VF, updated.get(self.vm_host, GPU0).role)
        self.assertIsNone(self.provider(GPU1))
        # the audit agrees: the GPU changed sides without a double offer
        with open(self.fleet, 'w') as handle:
            handle.write(yamlutil.dump({'hosts': [
                {'hostname': self.vm_host, 'gpus': 2,
                 'gpu_modes': ['gim-cpx', 'spx']}]}))
        rc, report, _stderr = self.audit()
        # the other host's k8s GPUs are stranded (drift), no conflict
        self.assertEqual(cmd_pool.EXIT_DRIFT, rc, report)
        self.assertEqual(0, report['conflicts'])
        self.assertEqual([], self.kinds(report, self.vm_host, GPU1))
        # done: the same command again changes nothing
        state = os.path.join(self.tmp, 'state',
                             'move-%s-0000-25-00.0.json' % self.vm_host)
        self.assertFalse(os.path.exists(state))
        self.assertTrue(os.path.exists(state + '.done'))
        rc, stdout, _stderr = self.move()
        self.assertEqual(0, rc)
        self.assertIn('already has role k8s-shared', stdout)

    def test_interrupted_move_resumes_without_repeating_steps(self):
        self.seed_nova()
        rc, _stdout, _stderr = self.move()
        self.assertEqual(75, rc)
        state = os.path.join(self.tmp, 'state',
                             'move-%s-0000-25-00.0.json' % self.vm_host)
        with open(state) as handle:
            recorded = json.load(handle)
        self.assertEqual(['check-unused', 'stop-offering'],
                         [r['step'] for r in recorded['history']])
        # another move of the same GPU cannot start over this one
        rc, _stdout, stderr = self.run_cli(
            'move', '--ledger', self.ledger_path, '--gpu',
            '%s:%s' % (self.vm_host, GPU1), '--to', 'idle',
            '--snapshot-dir', self.snapshots, '--state-dir',
            os.path.join(self.tmp, 'state'), '--output-dir',
            os.path.join(self.tmp, 'out'))
        self.assertEqual(1, rc)
        self.assertIn('records another move', stderr)
        # a VM lands on the GPU meanwhile (Nova still offers it): the
        # resumed move refuses at confirm-withdrawn, never skipping it
        vm = self.allocate(self.provider(GPU1))
        rc, stdout, _stderr = self.move()
        self.assertEqual(1, rc)
        self.assertIn(vm, stdout)
        self.free(vm)
        self.seeder.delete(self.provider(GPU1))
        rc, stdout, _stderr = self.move()
        self.assertEqual(75, rc)
        self.assertNotIn('step stop-offering', stdout)
        self.assertIn('step confirm-withdrawn: ok', stdout)
        with open(state) as handle:
            self.assertEqual(3, len(json.load(handle)['history']))

    def test_move_refuses_while_a_pod_is_chosen_but_not_bound(self):
        # the extender chose the GPU for the pod and is binding it: the
        # pod is not on the node yet, but the GPU is taken
        args = self.k8s_pod_on_gpu1('starting', bound=False)
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(1, rc, stdout)
        self.assertIn('k8s still has consumers', stdout)
        self.assertIn('default/starting (chosen by the extender, not bound '
                      'yet)', stdout)
        node = self.k8s.server.get_object('nodes', self.k8s_host)
        self.assertEqual(2, len(hami.decode_node_register(
            node['metadata']['annotations'][hami.NODE_REGISTER])))
        # audit counts it as a user of that GPU too
        _rc, report, _stderr = self.audit()
        self.assertEqual(1, report['in_use']['k8s'])
        self.k8s.api.delete_namespaced_pod('starting', 'default')
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(0, rc, stdout)

    def k8s_pod_on_gpu1(self, name, bound=True):
        """Offer both GPUs of the k8s host, put pod ``name`` on GPU1;
        :returns: the arguments of moving GPU1 to idle."""
        self.push_ledger()
        self.assertEqual([GPU0, GPU1], self.run_agent(self.k8s_host))
        node = self.k8s.server.get_object('nodes', self.k8s_host)
        infos = hami.decode_node_register(
            node['metadata']['annotations'][hami.NODE_REGISTER])
        self.pod(self.k8s_host, name, [infos[1].id], bound=bound)
        return ('move', '--ledger', self.ledger_path, '--gpu',
                '%s:%s' % (self.k8s_host, GPU1), '--to', 'idle',
                '--fleet', self.fleet, '--state-dir',
                os.path.join(self.tmp, 'state'))

    def test_move_from_k8s_shared_to_idle(self):
        args = self.k8s_pod_on_gpu1('trainer')
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(1, rc, stdout)
        self.assertIn('k8s still has consumers', stdout)
        self.assertIn('default/trainer', stdout)
        self.k8s.api.delete_namespaced_pod('trainer', 'default')
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(0, rc, stdout)
        self.assertIn('removed GPU %s from the registration' % GPU1, stdout)
        self.assertIn('step offer: not-applicable (the GPU goes idle)',
                      stdout)
        node = self.k8s.server.get_object('nodes', self.k8s_host)
        left = hami.decode_node_register(
            node['metadata']['annotations'][hami.NODE_REGISTER])
        self.assertEqual([GPU0], [i.custominfo[hami.CUSTOMINFO_PCI_BDF]
                                  for i in left])
        stored = ledgermap.read(self.k8s.api, ledgermap.Location(
            'kube-system', 'amdgpu-virt-ledger'))
        self.assertEqual((GPU0,), ledgermap.k8s_gpus(stored, self.k8s_host))
        self.assertEqual(Role.IDLE, av_ledger.load(self.ledger_path).get(
            self.k8s_host, GPU1).role)
        # the node agent's next registration agrees: it does not offer
        # the GPU again
        self.assertEqual([GPU0], self.run_agent(self.k8s_host))

    def test_pod_on_a_device_the_node_no_longer_registers_blocks(self):
        self.register_k8s_host()
        self.pod(self.k8s_host, 'orphan', ['gone-device'])
        rc, stdout, _stderr = self.run_cli(
            'move', '--ledger', self.ledger_path, '--gpu',
            '%s:%s' % (self.k8s_host, GPU0), '--to', 'idle',
            '--fleet', self.fleet, '--state-dir',
            os.path.join(self.tmp, 'state'))
        self.assertEqual(1, rc)
        self.assertIn('default/orphan (device gone-device not registered: '
                      'may be this GPU)', stdout)

    def test_allocated_dra_claim_blocks_the_move(self):
        self.push_ledger()
        self.assertEqual([GPU0, GPU1], self.run_agent(self.k8s_host))
        self.k8s.server.put_object('namespaces', {
            'apiVersion': 'v1', 'kind': 'Namespace',
            'metadata': {'name': 'team'}})
        self.k8s.server.put_object('resourceclaims', {
            'metadata': {'name': 'quarter', 'namespace': 'team'},
            'spec': {'devices': {'requests': []}},
            'status': {'allocation': {'devices': {'results': [{
                'request': 'share', 'driver': 'gpu.amd.com',
                'pool': self.k8s_host, 'device': 'gpu-0000-25-00-0-share',
                'shareID': str(uuid.uuid4()),
                'consumedCapacity': {'computeUnits': '76',
                                     'memory': '48Gi'}}]}}}})
        args = ('move', '--ledger', self.ledger_path, '--gpu',
                '%s:%s' % (self.k8s_host, GPU1), '--to', 'idle',
                '--fleet', self.fleet, '--state-dir',
                os.path.join(self.tmp, 'state'))
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(1, rc, stdout)
        self.assertIn('team/quarter (allocated ResourceClaim)', stdout)
        # the audit counts it as a consumer of that GPU too
        rc, stdout, _stderr = self.run_cli('audit', '--ledger',
                                           self.ledger_path, '-f', 'json')
        self.assertEqual(1, json.loads(stdout)['in_use']['k8s'])
        self.k8s.resource.delete_namespaced_resource_claim('quarter',
                                                           'team')
        rc, stdout, _stderr = self.run_cli(*args)
        self.assertEqual(0, rc, stdout)


class TestMoveLiveHost(PoolTestCase):
    """``move --sysfs-root``: the host change is seen in the host's sysfs
    tree (written by the simulator, rewritten as the operator's change and
    reboot would change it)."""

    def setUp(self):
        super().setUp()
        self.root = os.path.join(self.tmp, 'sys')
        self.write_tree(self.inventories[self.k8s_host])
        self.push_ledger()
        self.args = (
            'move', '--ledger', self.ledger_path, '--gpu',
            '%s:%s' % (self.k8s_host, GPU1), '--to', 'k8s-dedicated',
            '--compute-mode', 'CPX', '--memory-mode', 'NPS1',
            '--sysfs-root', self.root, '--state-dir',
            os.path.join(self.tmp, 'state'))

    def write_tree(self, inventory):
        shutil.rmtree(self.root, ignore_errors=True)
        simulate.write_tree(inventory, self.root)

    def test_host_change_is_read_from_the_live_tree(self):
        self.assertEqual([GPU0, GPU1], self.run_agent(self.k8s_host))
        rc, stdout, _stderr = self.run_cli(*self.args)
        self.assertEqual(75, rc, stdout)
        self.assertIn('step confirm-withdrawn: ok', stdout)
        self.assertIn('change host %s' % self.k8s_host, stdout)
        self.assertIn('--compute-partition CPX', stdout)
        self.assertEqual([GPU0], self.registered(self.k8s_host))
        # the tree is unchanged: still waiting
        rc, stdout, _stderr = self.run_cli(*self.args)
        self.assertEqual(75, rc, stdout)
        self.assertIn('change host %s' % self.k8s_host, stdout)
        # the host is down (no GPU readable): an error naming the tree;
        # the recorded steps stay, the move resumes when it is back
        shutil.rmtree(self.root)
        os.makedirs(self.root)
        rc, stdout, stderr = self.run_cli(*self.args)
        self.assertEqual(66, rc, stdout)
        self.assertIn('No AMD GPU could be read from %s' % self.root, stderr)
        state = os.path.join(self.tmp, 'state', 'move-%s-0000-25-00.0.json'
                             % self.k8s_host)
        with open(state) as handle:
            self.assertEqual(3, len(json.load(handle)['history']))
        # the operator set GPU1 to CPX and the host came back
        changed = simulate.design_host(simulate.HostSpec(
            self.k8s_host, gpus=2, gpu_modes=('spx', 'cpx')))
        self.write_tree(changed)
        rc, stdout, _stderr = self.run_cli(*self.args)
        self.assertEqual(75, rc, stdout)
        self.assertIn('step host-change: ok', stdout)
        self.assertIn('waiting for k8s to offer', stdout)
        # the node agent registers the GPU's partitions from the ConfigMap
        self.inventories[self.k8s_host] = changed
        self.assertEqual([GPU0] + [GPU1] * 8, self.run_agent(self.k8s_host))
        rc, stdout, _stderr = self.run_cli(*self.args)
        self.assertEqual(0, rc, stdout)
        self.assertIn('is now k8s-dedicated', stdout)
        self.assertEqual('CPX', av_ledger.load(self.ledger_path).get(
            self.k8s_host, GPU1).compute_mode)

    def test_the_tree_must_be_of_the_gpus_host(self):
        with open(self.conf_file, 'a') as handle:
            handle.write('[inventory]\nhostname = elsewhere\n')
        rc, _stdout, stderr = self.run_cli(*self.args)
        self.assertEqual(65, rc)
        self.assertIn('sysfs tree %s' % self.root, stderr)
        self.assertIn('it reads host elsewhere, not %s' % self.k8s_host,
                      stderr)
        self.assertIn('[inventory] hostname', stderr)


def _closed_port():
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


class TestUnreachable(PoolTestCase):
    """Placement or the Kubernetes API gone during audit or move: a clear
    error, its own exit status, nothing half-applied."""

    move = TestMove.move

    def _point(self, placement=None, kubernetes=None):
        with open(self.conf_file, 'w') as handle:
            handle.write('[nova]\nplacement_endpoint = %s\ntoken = admin\n'
                         '[kubernetes]\nkubeconfig = %s\n' % (
                             placement or self.server.url,
                             kubernetes or self.k8s.write_kubeconfig(
                                 self.tmp)))

    def _dead_kubeconfig(self):
        path = os.path.join(self.tmp, 'dead-kubeconfig')
        with open(path, 'w') as handle:
            handle.write(yamlutil.dump({
                'apiVersion': 'v1', 'kind': 'Config',
                'clusters': [{'name': 'c', 'cluster': {
                    'server': 'http://127.0.0.1:%d' % _closed_port()}}],
                'users': [{'name': 'u', 'user': {}}],
                'contexts': [{'name': 'c', 'context': {
                    'cluster': 'c', 'user': 'u'}}],
                'current-context': 'c'}))
        return path

    def _tree(self):
        found = {}
        for directory, _dirs, files in os.walk(self.tmp):
            for name in files:
                path = os.path.join(directory, name)
                with open(path, 'rb') as handle:
                    found[path] = handle.read()
        return found

    def test_audit_statuses_are_distinct(self):
        self.seed_nova()
        rc, _report, _stderr = self.audit()
        self.assertEqual(cmd_pool.EXIT_DRIFT, rc)   # k8s side stranded
        self._point(placement='http://127.0.0.1:%d' % _closed_port())
        rc, stdout, stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet)
        self.assertEqual(cmd_pool.EXIT_UNREACHABLE, rc, stdout)
        self.assertIn('Placement', stderr)
        self.assertEqual('', stdout)
        self._point(kubernetes=self._dead_kubeconfig())
        rc, stdout, stderr = self.run_cli(
            'audit', '--ledger', self.ledger_path, '--fleet', self.fleet)
        self.assertEqual(cmd_pool.EXIT_UNREACHABLE, rc, stdout)
        self.assertIn('Kubernetes request', stderr)
        self.assertEqual(
            4, len({cmd_pool.EXIT_OK, cmd_pool.EXIT_REFUSED,
                    cmd_pool.EXIT_DRIFT, cmd_pool.EXIT_UNREACHABLE}))

    def test_move_with_placement_gone_changes_nothing(self):
        ids = self.seed_nova()
        vm = self.allocate(ids['%s_%s' % (self.vm_host, GPU1.upper())])
        rc, stdout, _stderr = self.move()
        self.assertEqual(cmd_pool.EXIT_REFUSED, rc, stdout)
        self._point(placement='http://127.0.0.1:%d' % _closed_port())
        before = self._tree()
        rc, stdout, stderr = self.move()
        self.assertEqual(cmd_pool.EXIT_UNREACHABLE, rc, stdout)
        self.assertIn('Placement', stderr)
        self.assertEqual(before, self._tree())   # nothing half-applied
        # Placement is back: the move goes on from where it was
        self._point()
        self.free(vm)
        rc, stdout, _stderr = self.move()
        self.assertEqual(cmd_pool.EXIT_WAITING, rc, stdout)
        self.assertIn('step stop-offering: ok', stdout)
