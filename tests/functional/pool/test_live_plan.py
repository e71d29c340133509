"""``plan --running-from k8s,placement``: planning around what really runs.

Kubernetes is the API server stand-in with the real ``kubernetes``
client: node registrations as the node agent writes them, pods holding
devices (bound, and chosen by the extender but not bound yet), the
allocation record booked through the extender's own code, an allocated
ResourceClaim, and the ledger ConfigMap. Placement is the real
openstack-placement server, seeded the way nova-compute reports PCI
devices, with instances allocated VFs. The command runs in-process
through the cliff application.
"""

from __future__ import annotations

import json
import os
import uuid

from kubernetes import client

from amdgpu_virt import ledger as av_ledger
from amdgpu_virt import yamlutil
from amdgpu_virt.cmd import exitcodes
from amdgpu_virt.k8s.node import agent
from amdgpu_virt.k8s.node import devices
from amdgpu_virt.k8s.node.enforcement import Level
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.model import PciAddress
from amdgpu_virt.model import Role
from amdgpu_virt.sharing import hami
from tests.functional.k8s import cluster
from tests.functional.pool import test_pool

GPU0 = test_pool.GPU0
GPU1 = test_pool.GPU1
TYPE = 'AMD Instinct MI300X'


class LivePlanTestCase(test_pool.PoolTestCase):
    """``<id>-vm``: GIM, both GPUs nova-vf (8 VFs); ``<id>-k8s``: GPU0
    k8s-shared, GPU1 k8s-dedicated."""

    def setUp(self):
        super().setUp()
        self.ledger = self.ledger.replace(av_ledger.GpuAssignment(
            self.k8s_host, PciAddress.parse(GPU1), Role.K8S_DEDICATED,
            'MI300X'))
        av_ledger.save(self.ledger, self.ledger_path)
        self.workloads = os.path.join(self.tmp, 'workloads.yaml')
        with open(self.workloads, 'w') as handle:
            handle.write(yamlutil.dump({'workloads': [
                {'name': 'new-slice', 'platform': 'pod',
                 'tenancy': 'trusted', 'memory': '8GiB', 'compute': 38},
                {'name': 'new-whole', 'platform': 'pod',
                 'tenancy': 'trusted', 'gpus': 1},
                {'name': 'new-vm', 'platform': 'vm', 'memory': '20GiB',
                 'compute': 38}]}))
        for namespace in ('team', 'amdgpu-virt'):
            self.k8s.api.create_namespace({'metadata': {'name': namespace}})

    # -- the live state -------------------------------------------------------

    def hami_pod(self, name, host, devices, bound=True, cus=None):
        """A pod of namespace team holding ``devices`` ((uuid, MiB, CUs))
        of ``host``, with ``cus`` as its CU annotation."""
        return self.pod(host, name, devices, bound, namespace='team',
                        annotations={hami.CU_ALLOCATED: json.dumps(cus)}
                        if cus else None)

    def claim(self, name, host, device, consumed=None):
        api = client.ResourceV1Api(self.k8s.api.api_client)
        made = api.create_namespaced_resource_claim('team', {
            'apiVersion': 'resource.k8s.io/v1', 'kind': 'ResourceClaim',
            'metadata': {'name': name, 'namespace': 'team'},
            'spec': {'devices': {'requests': [{'name': 'gpu', 'exactly': {
                'deviceClassName': 'gpu.amd.com'}}]}}},
            _preload_content=False)
        body = json.loads(made.data)
        result = {'request': 'gpu', 'driver': 'gpu.amd.com',
                  'pool': host, 'device': device}
        if consumed:
            result['consumedCapacity'] = consumed
        body['status'] = {'allocation': {'devices': {'results': [result]}}}
        api.replace_namespaced_resource_claim_status(
            name, 'team', body, _preload_content=False)

    def vms(self, gpu, *vfs):
        """Instances holding ``vfs`` VFs each of ``gpu`` of the GIM host."""
        ids = self.seed_nova()
        rp = ids['%s_%s' % (self.vm_host, gpu.upper())]
        plan_rc = 'CUSTOM_AMD_MI300X_CPX_VF'
        result = []
        for count in vfs:
            consumer = str(uuid.uuid4())
            self.seeder.allocate(consumer, rp, {plan_rc: count})
            result.append(consumer)
        return result

    def plan(self, *extra, sources='k8s,placement'):
        rc, stdout, stderr = self.run_cli(
            'plan', '--fleet', self.fleet, '--workloads', self.workloads,
            '--running-from', sources, '-f', 'json', *extra)
        self.assertEqual(0, rc, stderr)
        return json.loads(stdout)

    @staticmethod
    def decisions(report):
        return {d['workload']: d for d in report['workloads']}


class TestLivePlan(LivePlanTestCase):

    def test_running_placements_are_kept_where_they_run(self):
        self.push_ledger()
        infos = self.register_k8s_host()
        dev0 = next(i for i in infos
                    if i.custominfo[hami.CUSTOMINFO_PCI_BDF] == GPU0)
        # booked by the extender's own code: concrete CU ranges
        infer = self.hami_pod('infer', self.k8s_host,
                              [(dev0.id, 8192, 76)])
        containers = ((hami.ContainerDevice(dev0.id, TYPE, 8192, 76),),)
        booked = cluster.book(self.k8s.api, self.k8s_host, infer, containers,
                              allocrecord.capacity_of(infos))
        # chosen by the extender, not bound yet: its CU annotation
        self.hami_pod('pending', self.k8s_host, [(dev0.id, 4096, 38)],
                      bound=False, cus={dev0.id: '200-237'})
        self.claim('train', self.k8s_host, 'gpu-0000-25-00-0')
        vm_a, vm_b = self.vms(GPU0, 3, 5)

        report = self.plan()
        self.assertNotIn('warnings', report)
        made = self.decisions(report)
        kept = {name: d for name, d in made.items() if d.get('existing')}
        self.assertEqual(
            sorted(['pod/team/infer', 'pod/team/pending', 'claim/team/train',
                    'instance/%s' % vm_a, 'instance/%s' % vm_b]),
            sorted(kept))
        infer_cus = booked.masks()[dev0.id]
        self.assertEqual(allocrecord_ids(infer_cus),
                         kept['pod/team/infer']['grants'][0]['cus'])
        self.assertEqual('200-237',
                         kept['pod/team/pending']['grants'][0]['cus'])
        self.assertEqual([GPU1], [g['address'] for g in
                                  kept['claim/team/train']['grants']])
        self.assertEqual(8, sum(len(kept['instance/%s' % v]['grants'])
                                for v in (vm_a, vm_b)))
        # new workloads avoid them: the slice goes to the free CUs of GPU0,
        # the whole-GPU pod has no k8s-dedicated GPU left, the VM takes
        # the other VF GPU
        new_slice = made['new-slice']
        self.assertEqual('placed', new_slice['code'])
        self.assertEqual((self.k8s_host, GPU0), (
            new_slice['host'], new_slice['grants'][0]['address']))
        taken = set(ids('0-75')) | set(ids('200-237'))
        self.assertFalse(taken & set(ids(new_slice['grants'][0]['cus'])))
        self.assertEqual('unschedulable-now', made['new-whole']['code'])
        self.assertEqual([GPU1], [g['address'] for g in
                                  made['new-vm']['grants']])
        self.assertEqual(5, report['summary']['existing'])
        # the table says how many it kept
        rc, stdout, _stderr = self.run_cli(
            'plan', '--fleet', self.fleet, '--workloads', self.workloads,
            '--running-from', 'k8s,placement')
        self.assertEqual(0, rc)
        self.assertIn('kept: 5 running placements', stdout)
        self.assertNotIn('Warnings', stdout)

    def test_one_cloud_alone(self):
        self.push_ledger()
        self.vms(GPU0, 2)
        report = self.plan(sources='placement')
        kept = [d for d in report['workloads'] if d.get('existing')]
        self.assertEqual(1, len(kept))
        self.assertEqual([0, 1], [g['vf'] for g in kept[0]['grants']])
        # explain takes the same option and names the running placement
        rc, stdout, _stderr = self.run_cli(
            'explain', kept[0]['workload'], '--fleet', self.fleet,
            '--workloads', self.workloads, '--running-from', 'placement')
        self.assertEqual(0, rc)
        self.assertIn('%s: placed\n  vf on %s: %s VF 0, %s VF 1' % (
            kept[0]['workload'], self.vm_host, GPU0, GPU0), stdout)
        self.assertIn('reason: running: Placement consumer', stdout)

    def test_without_a_ledger_configmap_the_roles_come_from_what_runs(self):
        infos = self.register_k8s_host()
        self.hami_pod('infer', self.k8s_host, [(infos[0].id, 8192, 76)])
        report = self.plan(sources='k8s')
        self.assertIn('no configmap kube-system/amdgpu-virt-ledger',
                      report['warnings'][0])
        self.assertIn('it takes role k8s-shared', report['warnings'][1])
        self.assertIn('pod/team/infer', self.decisions(report))

    def test_the_ledger_file_gives_the_roles_its_placements_are_replaced(self):
        state = os.path.join(self.tmp, 'state.yaml')
        av_ledger.save(self.ledger, state, {'placements': [
            {'workload': 'old', 'kind': 'vf', 'host': self.vm_host,
             'grants': [{'address': GPU1, 'vf': 0, 'memory_mib': 1}]}]})
        self.vms(GPU0, 1)
        report = self.plan('--ledger', state, sources='placement')
        self.assertIn('the 1 placements of --ledger', report['warnings'][0])
        self.assertNotIn('old', self.decisions(report))

    def test_explain_shows_the_live_memory_enforcement(self):
        self.push_ledger()
        units = devices.units_from_inventory(
            self.inventories[self.k8s_host])
        infos = agent.registration(units, 10, {}, levels={
            u.gpu_address: Level.KERNEL_HOOK for u in units})
        self.register(self.k8s_host, infos)
        self.hami_pod('infer', self.k8s_host, [(infos[0].id, 8192, 76)])
        rc, stdout, _stderr = self.run_cli(
            'explain', 'pod/team/infer', '--fleet', self.fleet,
            '--workloads', self.workloads, '--running-from', 'k8s')
        self.assertEqual(0, rc, stdout)
        self.assertIn('  memory enforcement of %s (live): kernel+hook\n'
                      % GPU0, stdout)
        # without live state there is nothing to show
        rc, stdout, _stderr = self.run_cli(
            'explain', 'new-slice', '--fleet', self.fleet,
            '--workloads', self.workloads)
        self.assertEqual(0, rc)
        self.assertNotIn('memory enforcement', stdout)


class TestHostileLiveState(LivePlanTestCase):

    def test_odd_state_is_warned_and_its_gpus_stay_occupied(self):
        self.push_ledger()
        infos = self.register_k8s_host()
        dev0 = next(i for i in infos
                    if i.custominfo[hami.CUSTOMINFO_PCI_BDF] == GPU0)
        # a slice bigger than the GPU, and a pod on the GIM host's GPU0
        # registered there by a rogue node token: one GPU, two clouds
        self.hami_pod('huge', self.k8s_host, [(dev0.id, 8192, 400)])
        self.register(self.vm_host, [self.foreign_info(GPU0, 'rogue-0')])
        self.hami_pod('squatter', self.vm_host, [('rogue-0', 1024, 38)])
        # an instance on GPU1 and a claim naming a device of no GPU
        (vm,) = self.vms(GPU1, 1)
        self.claim('odd', self.k8s_host, 'not-a-device')
        report = self.plan()
        warnings = report['warnings']
        text = '\n'.join(warnings)
        self.assertIn('pod/team/huge on %s GPU %s: holds a slice of 400 '
                      'CUs' % (self.k8s_host, GPU0), text)
        self.assertIn('pod/team/squatter on %s GPU %s: device rogue-0 is '
                      'registered on GPU %s, but it is not a device of that '
                      'GPU in the inventory' % (self.vm_host, GPU0, GPU0),
                      text)
        self.assertIn('claim/team/odd on %s: status.allocation.devices.'
                      "results[0] names device 'not-a-device', which maps "
                      'to no GPU' % self.k8s_host, text)
        made = self.decisions(report)
        # every GPU a consumer may hold is kept occupied: nothing new fits
        # on the k8s host, the VM avoids the squatted GPU0
        for name in ('held/%s/%s' % (self.k8s_host, GPU0),
                     'held/%s/%s' % (self.k8s_host, GPU1),
                     'held/%s/%s' % (self.vm_host, GPU0)):
            self.assertTrue(made[name]['existing'], name)
        self.assertEqual('unschedulable-now', made['new-slice']['code'])
        self.assertEqual('unschedulable-now', made['new-whole']['code'])
        self.assertEqual([GPU1], [g['address'] for g in
                                  made['new-vm']['grants']])
        self.assertIn('instance/%s' % vm, made)
        # the table prints them too
        rc, stdout, _stderr = self.run_cli(
            'plan', '--fleet', self.fleet, '--workloads', self.workloads,
            '--running-from', 'k8s,placement')
        self.assertEqual(0, rc)
        self.assertIn('Warnings (%d)' % len(warnings), stdout)

    def test_an_unreadable_allocation_record_keeps_its_node(self):
        self.push_ledger()
        self.register_k8s_host()
        self.k8s.server.put_object('configmaps', {
            'apiVersion': 'v1', 'kind': 'ConfigMap',
            'metadata': {'name': allocrecord.configmap_name(self.k8s_host),
                         'namespace': 'amdgpu-virt',
                         'labels': {allocrecord.COMPONENT_LABEL:
                                    allocrecord.COMPONENT}},
            'data': {allocrecord.DATA_KEY: '{"node": "x", "pods": {}}'}})
        report = self.plan(sources='k8s')
        self.assertIn('unreadable allocation record', report['warnings'][0])
        self.assertEqual('unschedulable-now',
                         self.decisions(report)['new-slice']['code'])

    def test_an_unreachable_cloud_fails_naming_it(self):
        with open(self.conf_file, 'a') as handle:
            handle.write('[nova]\nplacement_endpoint = http://127.0.0.1:9\n')
        rc, _stdout, stderr = self.run_cli(
            'plan', '--fleet', self.fleet, '--running-from', 'placement')
        self.assertEqual(exitcodes.UNREACHABLE, rc)
        self.assertIn('Placement', stderr)


def ids(text):
    from amdgpu_virt.policy.decision import parse_cu_ranges
    return parse_cu_ranges(text)


def allocrecord_ids(mask):
    from amdgpu_virt.policy.decision import cu_ranges
    from amdgpu_virt.sharing import allocator
    return cu_ranges(allocator.ids_of(mask))
