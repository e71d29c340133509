"""``amdgpu-virt status`` on the functional fleet, and its page in a real
browser.

The fleet is the live-plan test's: a GIM host whose two GPUs give 8 VFs
each to Nova (the real openstack-placement server, seeded the way
nova-compute reports PCI devices, instances allocated VFs) and a
bare-metal host whose GPU0 is shared (a pod booked by the extender's own
code) and GPU1 whole (an allocated ResourceClaim), registered by the node
agent's own registration code in the API server stand-in, the ledger in
its ConfigMap. The node of the bare-metal host reports GPU1 unhealthy
with a reason a hostile node wrote, and how it enforces memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import unittest

import yaml

from amdgpu_virt.cmd import exitcodes
from amdgpu_virt.k8s.record import allocation as allocrecord
from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import browser
from tests.functional.k8s import cluster
from tests.functional.pool import test_live_plan

GPU0 = test_live_plan.GPU0
GPU1 = test_live_plan.GPU1
TYPE = test_live_plan.TYPE
#: what a hostile node writes as its health reason
HOSTILE = ('<img src=x onerror="document.title=1"><script>document.title='
           "'pwned'</script></td></tr><b>ECC</b> & more")


class StatusTestCase(test_live_plan.LivePlanTestCase):

    def fleet_in_use(self, sick_reason=HOSTILE, level='kernel+hook'):
        """Ledger ConfigMap, registrations, a pod, a claim, two VMs."""
        self.push_ledger()
        units = self.register_k8s_host()
        infos = []
        for info in units:
            address = info.custominfo[hami.CUSTOMINFO_PCI_BDF]
            extra = {enforcement.CUSTOMINFO_KEY: level}
            healthy = True
            if address == GPU1:
                extra[hami.CUSTOMINFO_HEALTH_REASON] = sick_reason
                healthy = False
            infos.append(dataclasses.replace(
                info, health=healthy,
                custominfo=dict(info.custominfo, **extra)))
        self.register(self.k8s_host, infos)
        dev0 = next(i for i in infos
                    if i.custominfo[hami.CUSTOMINFO_PCI_BDF] == GPU0)
        pod = self.hami_pod('infer', self.k8s_host, [(dev0.id, 8192, 76)])
        cluster.book(self.k8s.api, self.k8s_host, pod, (
            (hami.ContainerDevice(dev0.id, TYPE, 8192, 76),),),
            allocrecord.capacity_of(infos))
        self.claim('train', self.k8s_host, 'gpu-0000-25-00-0')
        return self.vms(GPU0, 3, 5)

    def status(self, *extra, rc=None):
        code, stdout, stderr = self.run_cli(
            'status', '--fleet', self.fleet, *extra)
        if rc is not None:
            self.assertEqual(rc, code, stderr)
        return code, stdout, stderr

    def document(self, *extra, rc=exitcodes.REFUSED):
        _code, stdout, _stderr = self.status('-f', 'json', *extra, rc=rc)
        document = json.loads(stdout)
        return document, {(g['host'], g['address']): g
                          for g in document['gpus']}


class TestStatus(StatusTestCase):

    def test_every_gpu_of_both_clouds_in_one_view(self):
        vm_a, vm_b = self.fleet_in_use()
        # GPU1 of the bare-metal host registers unhealthy: Kubernetes
        # does not offer it, which is drift from the ledger, and its claim
        # still uses it, a conflict (exit 1)
        document, gpus = self.document()
        self.assertEqual('configmap kube-system/amdgpu-virt-ledger',
                         document['ledger'])
        self.assertEqual(['nova', 'k8s'], document['sides'])
        self.assertEqual(4, len(gpus))
        vfs = gpus[(self.vm_host, GPU0)]
        self.assertEqual('nova-vf', vfs['role'])
        self.assertEqual(sorted(['instance/%s' % vm_a, 'instance/%s' % vm_b]),
                         sorted(u['name'] for u in vfs['users']))
        self.assertEqual({'vm'}, {u['kind'] for u in vfs['users']})
        self.assertEqual((8, 0, 0, 0), (vfs['vfs'], vfs['vfs_free'],
                                        vfs['cus_free'], vfs['mib_free']))
        self.assertEqual('sr-iov', vfs['enforcement'])
        self.assertEqual('unknown', vfs['health'])
        spare = gpus[(self.vm_host, GPU1)]
        self.assertEqual((8, 8, 304), (spare['vfs'], spare['vfs_free'],
                                       spare['cus_free']))
        self.assertEqual([], spare['users'])
        shared = gpus[(self.k8s_host, GPU0)]
        self.assertEqual('k8s-shared', shared['role'])
        self.assertEqual([{'name': 'pod/team/infer', 'kind': 'pod'}],
                         shared['users'])
        self.assertEqual(304 - 76, shared['cus_free'])
        self.assertEqual(shared['vram_mib'] - 8192, shared['mib_free'])
        self.assertIsNone(shared['vfs'])
        self.assertEqual(('healthy', 'kernel+hook'),
                         (shared['health'], shared['enforcement']))
        self.assertEqual([], shared['drift'])
        whole = gpus[(self.k8s_host, GPU1)]
        self.assertEqual([{'name': 'claim/team/train', 'kind': 'claim'}],
                         whole['users'])
        self.assertEqual((0, 0), (whole['cus_free'], whole['mib_free']))
        self.assertEqual('unhealthy', whole['health'])
        self.assertIn('<script>', whole['health_reason'])
        self.assertEqual('whole-gpu', whole['enforcement'])
        # not offered because it is unhealthy, and still used by the claim
        self.assertEqual(['unhealthy-in-use'], whole['drift'])
        summary = document['summary']
        self.assertEqual((4, 3, 4, 1, 1, 0),
                         (summary['gpus'], summary['in_use'],
                          summary['users'], summary['unhealthy'],
                          summary['conflicts'], summary['drift']))
        self.assertEqual(16, summary['vfs'])
        self.assertEqual(8, summary['vfs_free'])

    def test_the_formats_and_columns(self):
        self.fleet_in_use(sick_reason='RAS: 3 uncorrectable errors (UMC)')
        _rc, table, _stderr = self.status(rc=exitcodes.REFUSED)
        self.assertIn('pod/team/infer', table)
        self.assertIn('unhealthy: RAS: 3 uncorrectable errors (UMC)', table)
        self.assertIn('4 GPUs, 3 in use by 4 users; free: ', table)
        self.assertIn('1 unhealthy', table)
        _rc, csv, stderr = self.status('-f', 'csv', '-c', 'Host', '-c',
                                       'GPU', '-c', 'Health', '-c',
                                       'Enforcement', rc=exitcodes.REFUSED)
        lines = csv.splitlines()
        self.assertEqual('"Host","GPU","Health","Enforcement"', lines[0])
        self.assertIn('"%s","%s","healthy","kernel+hook"' % (
            self.k8s_host, GPU0), lines)
        self.assertEqual(5, len(lines))
        self.assertNotIn('GPUs,', csv)   # no summary in machine output
        _rc, value, _stderr = self.status('-f', 'value', '-c', 'VFs free',
                                          rc=exitcodes.REFUSED)
        # by host: the bare-metal host first (no VFs), then the GIM host
        self.assertEqual(['', '', '0', '8'], value.split('\n')[:4])
        _rc, text, _stderr = self.status('-f', 'yaml',
                                         rc=exitcodes.REFUSED)
        self.assertEqual(4, len(yaml.safe_load(text)['gpus']))
        rc, _out, stderr = self.status('-c', 'Nope')
        self.assertEqual(exitcodes.USAGE, rc)
        self.assertIn("no column 'Nope'", stderr)

    def test_a_consistent_fleet_exits_0_and_a_conflict_1(self):
        self.push_ledger()
        self.register_k8s_host()
        self.seed_nova()
        _document, gpus = self.document('--ledger', self.ledger_path,
                                        rc=exitcodes.OK)
        self.assertEqual('unknown', gpus[(self.k8s_host, GPU0)][
            'enforcement'])      # the registration says nothing of it
        # a rogue registration of the GIM host's GPU0, and a pod on it
        self.register(self.vm_host, [self.foreign_info(GPU0, 'rogue-0')])
        self.pod(self.vm_host, 'squatter', ['rogue-0'])
        document, gpus = self.document(rc=exitcodes.REFUSED)
        squatted = gpus[(self.vm_host, GPU0)]
        self.assertIn('double-offer', squatted['drift'])
        self.assertIn('use-against-ledger', squatted['drift'])
        self.assertGreater(document['summary']['conflicts'], 0)

    def test_inputs_it_cannot_do_without(self):
        # no ledger ConfigMap and no --ledger
        rc, _out, stderr = self.status()
        self.assertEqual(exitcodes.NO_INPUT, rc)
        self.assertIn('configmap kube-system/amdgpu-virt-ledger', stderr)
        self.assertIn('--ledger FILE', stderr)
        rc, _out, stderr = self.status('--no-k8s')
        self.assertEqual(exitcodes.USAGE, rc)
        rc, _out, stderr = self.status('--no-k8s', '--no-nova', '--ledger',
                                       self.ledger_path)
        self.assertEqual(exitcodes.USAGE, rc)
        # an --html that cannot be written stops it before any request
        blocker = os.path.join(self.tmp, 'file')
        with open(blocker, 'w') as handle:
            handle.write('x')
        rc, _out, stderr = self.status('--ledger', self.ledger_path,
                                       '--html', os.path.join(blocker, 'p'))
        self.assertEqual(exitcodes.CANT_CREATE, rc, stderr)

    def test_one_cloud_alone(self):
        self.fleet_in_use()
        document, gpus = self.document('--no-k8s', '--ledger',
                                       self.ledger_path, rc=exitcodes.OK)
        self.assertEqual(['nova'], document['sides'])
        self.assertEqual([], gpus[(self.k8s_host, GPU0)]['users'])
        # the node is not asked: its GPU's health is what the RAS counts
        # of its inventory say (the node's own verdict is not read)
        self.assertEqual(('healthy', ''), (
            gpus[(self.k8s_host, GPU1)]['health'],
            gpus[(self.k8s_host, GPU1)]['health_reason']))
        # a GIM host's inventory reads no RAS counts (amdgpu does not
        # drive its GPUs): unknown
        self.assertEqual('unknown', gpus[(self.vm_host, GPU0)]['health'])
        self.assertEqual(2, len(gpus[(self.vm_host, GPU0)]['users']))


@unittest.skipUnless(browser.AVAILABLE, browser.SKIP_REASON)
class TestStatusPage(StatusTestCase):

    def test_the_page_in_a_browser(self):
        self.fleet_in_use()
        path = os.path.join(self.tmp, 'status.html')
        _rc, _stdout, _stderr = self.status('--html', path,
                                            rc=exitcodes.REFUSED)
        dom = browser.Dom(browser.dump_dom(path)).root
        # the hostile reason is text: no element it names was made, the
        # title is the page's, and the table has one row per GPU still
        (title,) = dom.find_all('head')[0].find_all('title')
        self.assertEqual('amdgpu-virt status', title.text)
        self.assertEqual([], dom.find_all('script'))
        self.assertEqual([], dom.find_all('img'))
        self.assertEqual([], dom.find_all('b'))
        table = dom.by_id('gpu-table')
        rows = table.find_all('tr')[1:]
        self.assertEqual(4, len(rows))
        sick = [r for r in rows if 'unhealthy' in r.classes]
        self.assertEqual(1, len(sick))
        self.assertEqual((self.k8s_host, GPU1), (sick[0].attrs['data-host'],
                                                 sick[0].attrs['data-gpu']))
        (health,) = sick[0].find_all('td', 'health')
        self.assertEqual('unhealthy: %s' % HOSTILE, health.text)
        (drift,) = sick[0].find_all('td', 'drift')
        self.assertEqual('unhealthy-in-use', drift.text)
        users = {r.attrs['data-gpu'] + '@' + r.attrs['data-host']:
                 r.find_all('td', 'used-by')[0].text for r in rows}
        self.assertEqual('pod/team/infer',
                         users['%s@%s' % (GPU0, self.k8s_host)])
        self.assertEqual('4', dom.by_id('card-users').find_all('dd')[0].text)
        self.assertIn('bad', dom.by_id('card-unhealthy').classes)
        # the occupancy chart was drawn: boxes with their owners
        (svg,) = dom.by_id('chart').find_all('svg')
        owners = {r.text for r in svg.find_all('rect')}
        self.assertTrue(any('pod/team/infer' in o for o in owners), owners)
        self.assertTrue(any('claim/team/train' in o for o in owners))
        self.assertIn('unhealthy-in-use', dom.by_id('findings-table').text)
        # nothing would be fetched: no element names another resource
        for node in dom.iter():
            for attr in ('src', 'href', 'srcset', 'action', 'data'):
                self.assertNotIn(attr, node.attrs, node.tag)

    def test_the_page_as_it_is_seen(self):
        from PIL import Image
        self.fleet_in_use()
        path = os.path.join(self.tmp, 'status.html')
        self.status('--html', path, rc=exitcodes.REFUSED)
        shot = browser.screenshot(path, os.path.join(self.tmp, 's.png'))
        with Image.open(shot) as image:
            rgb = image.convert('RGB')
            colours = {c for _n, c in rgb.getcolors(rgb.width * rgb.height)}
        # the unhealthy GPU's health cell (style applied), and the chart's
        # free CUs of the shared GPU and its VRAM strip
        self.assertIn((0xfd, 0xe2, 0xe4), colours)
        self.assertIn((0xf4, 0xf4, 0xf4), colours)
        self.assertIn((0x4a, 0x4a, 0x4a), colours)
