"""``amdgpu-virt k8s scheduler`` as a process of its own.

The extender command started as an OS process (:mod:`tests.functional.
fixtures.extenderproc`) with a configuration file and a kubeconfig that
point it at the API server stand-in: it serves filter and bind over HTTP
on the port it logs, stops cleanly on SIGTERM (status 0), stops when the
process that started it goes away (its stdin closes), and refuses a bad
configuration with a message naming the option; when one of two is
killed between filter and bind, the other places the pod once.
"""

from __future__ import annotations

import signal

import fixtures
import testtools

from amdgpu_virt.k8s.record import store as recordstore
from amdgpu_virt.sharing import hami
from tests.functional.fixtures import extenderproc
from tests.functional.fixtures import kubeclient
from tests.functional.k8s import cluster

SMALL = {'amd.com/gpu': '1', 'amd.com/gpucores': '25',
         'amd.com/gpumem': '1024'}


class ExtenderProcessTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.directory = self.useFixture(fixtures.TempDir()).path

    def test_serves_filter_and_bind_then_stops_on_sigterm(self) -> None:
        world = self.useFixture(cluster.Cluster(('n1',), gpus=1,
                                                processes=True))
        (process,) = world.processes
        self.assertIsNone(world.service)
        pod = world.create(cluster.gpu_pod('p', [SMALL]))
        answer = world.filter(pod)
        self.assertEqual(['n1'], answer['NodeNames'], answer)
        # the process booked it in the record
        record = recordstore.RecordStore(world.api).read('n1')[0]
        self.assertIsNotNone(record.find('team', 'p'))
        self.assertEqual({'Error': ''}, world.bind(pod, 'n1'))
        stored = world.read_pod('team', 'p')
        self.assertEqual('n1', stored['spec']['nodeName'])
        self.assertEqual('allocating',
                         stored['metadata']['annotations'][hami.BIND_PHASE])
        self.assertEqual(0, process.stop())
        log = process.tail().decode()
        self.assertIn('Signal %d received; stopping' % signal.SIGTERM, log)
        self.assertIn('pod team/p bound to n1', log)

    def test_killed_between_filter_and_bind(self) -> None:
        # a failover: the extender that filtered is killed (SIGKILL, no
        # clean shutdown); kube-scheduler retries through the other one
        world = self.useFixture(cluster.Cluster(
            ('n1', 'n2'), gpus=1, extenders=2, processes=True))
        first, _second = world.processes
        pod = world.create(cluster.gpu_pod('p', [SMALL]))
        (chosen,) = world.filter(pod, via=0)['NodeNames']
        first.signal(signal.SIGKILL)
        self.assertEqual(-signal.SIGKILL, first.stop())
        answer = world.filter(pod, via=1)
        (node,) = answer['NodeNames']
        self.assertEqual({'Error': ''}, world.bind(pod, node, via=1))
        self.assertEqual(node, world.read_pod('team', 'p')['spec'][
            'nodeName'])
        store = recordstore.RecordStore(world.api)
        holding = [n for n in ('n1', 'n2')
                   if store.read(n)[0].find('team', 'p') is not None]
        # booked once, where it is bound, whichever node the first chose
        self.assertEqual([node], holding, 'first chose %s' % chosen)

    def test_stops_when_its_parent_goes_away(self) -> None:
        kube = self.useFixture(kubeclient.ApiServerFixture())
        process = self.useFixture(extenderproc.ExtenderProcess(
            kube.server.url, self.directory))
        assert process.process is not None and \
            process.process.stdin is not None
        # what the kernel does to the pipe when the test process dies
        process.process.stdin.close()
        self.assertEqual(0, process.process.wait(30))
        self.assertIn('Signal %d received' % signal.SIGTERM,
                      process.tail().decode())

    def test_bad_configuration_names_the_option(self) -> None:
        kube = self.useFixture(kubeclient.ApiServerFixture())
        proc = extenderproc.ExtenderProcess(
            kube.server.url, self.directory,
            options={('scheduler', 'node_lock_wait'): 99.0})
        err = self.assertRaises(fixtures.MultipleExceptions, proc.setUp)
        # the fixture's own failure first, then fixtures' SetupError
        failure = err.args[0][1]
        self.assertIsInstance(failure, AssertionError)
        self.assertIn('exited with status 78 while starting', str(failure))
        self.assertIn('[scheduler] node_lock_wait', proc.tail().decode())
        self.assertNotEqual(0, proc.stop())
