"""What pods ask of their node's host, and what nodes offer."""

from __future__ import annotations

import decimal

import testtools
from hypothesis import assume
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import quantity as k8s_quantity

from amdgpu_virt.k8s.fit import host as fithost

GI = 1 << 30


def _container(cpu: str | None = None, memory: str | None = None,
               **extra: str) -> dict[str, object]:
    requests = {}
    if cpu is not None:
        requests['cpu'] = cpu
    if memory is not None:
        requests['memory'] = memory
    return {'name': 'c', 'resources': {'requests': requests}, **extra}


class QuantityTest(testtools.TestCase):

    def test_cpu_and_memory_units(self) -> None:
        for text, scale, value in (
                ('500m', 1000, 500), ('2', 1000, 2000), ('1.5', 1000, 1500),
                ('0.1m', 1000, 1), ('1e3', 1000, 1000000),
                ('1Gi', 1, GI), ('512M', 1, 512000000), ('1.5Ki', 1, 1536),
                ('3e9', 1, 3000000000), ('1k', 1, 1000), ('+4', 1, 4),
                ('.5', 1000, 500), (7, 1000, 7000), ('0', 1, 0)):
            self.assertEqual(value, fithost.quantity(text, scale), text)

    def test_what_is_not_a_quantity(self) -> None:
        for text in ('lots', '-1', '1 Gi', '1gi', '', '1' * 65, '10Ei',
                     True, None, 1.5, '1e999', [], '--1', '1.2.3'):
            self.assertIsNone(fithost.quantity(text), text)

    @given(st.decimals(min_value=0, max_value=10 ** 9, places=3),
           st.sampled_from(['', 'm', 'k', 'M', 'G', 'Ki', 'Mi', 'Gi']))
    def test_as_the_kubernetes_client_reads_it(
            self, number: decimal.Decimal, suffix: str) -> None:
        text = '%s%s' % (number, suffix)
        expected = k8s_quantity.parse_quantity(text) * 1000
        assume(expected < 1 << 62)   # beyond: refused, as no host has it
        self.assertEqual(int(expected.to_integral_value(
            decimal.ROUND_CEILING)), fithost.quantity(text, 1000))


class PodRequestTest(testtools.TestCase):

    def test_containers_add_up(self) -> None:
        spec = {'containers': [_container('1', '1Gi'),
                               _container('500m'), {'name': 'bare'}]}
        self.assertEqual(fithost.HostAmount(1500, GI),
                         fithost.pod_request(spec))

    def test_init_containers_and_sidecars(self) -> None:
        # the init container runs beside the sidecar started before it;
        # the sidecar then runs beside the containers
        spec = {'containers': [_container('1', '1Gi')],
                'initContainers': [
                    _container('2', '1Gi', restartPolicy='Always'),
                    _container('3', '4Gi')]}
        self.assertEqual(fithost.HostAmount(5000, 5 * GI),
                         fithost.pod_request(spec))
        # an init container larger than everything after it
        spec = {'containers': [_container('1', '1Gi')],
                'initContainers': [_container('8', '512Mi')]}
        self.assertEqual(fithost.HostAmount(8000, GI),
                         fithost.pod_request(spec))

    def test_overhead_and_pod_level_resources(self) -> None:
        spec = {'containers': [_container('1', '1Gi')],
                'overhead': {'cpu': '250m', 'memory': '1Gi'},
                'resources': {'requests': {'cpu': '4'}}}
        # the pod-level CPU replaces the containers'; memory stays theirs
        self.assertEqual(fithost.HostAmount(4250, 2 * GI),
                         fithost.pod_request(spec))

    def test_unreadable_requests(self) -> None:
        for spec in ({'containers': [_container('lots')]},
                     {'containers': 'x'}, {'overhead': {'cpu': '-1'}},
                     {'containers': [{'name': 'c'}] * 300},
                     {'containers': [{'resources': []}]}, None,
                     {'resources': {'requests': {'memory': 'x'}}}):
            self.assertIsNone(fithost.pod_request(spec), spec)
        self.assertEqual(fithost.NOTHING, fithost.pod_request({}))

    def test_node_allocatable(self) -> None:
        self.assertEqual(fithost.HostAmount(63500, 512 * GI),
                         fithost.node_allocatable({'allocatable': {
                             'cpu': '63500m', 'memory': '512Gi',
                             'pods': '110'}}))
        for status in (None, {}, {'allocatable': {'cpu': '8'}},
                       {'allocatable': {'cpu': 'x', 'memory': '1Gi'}}):
            self.assertIsNone(fithost.node_allocatable(status), status)

    def test_amounts(self) -> None:
        one = fithost.HostAmount(1000, GI)
        self.assertTrue(one.holds(fithost.HostAmount(1000, GI)))
        self.assertFalse(one.holds(fithost.HostAmount(1001, 1)))
        self.assertEqual(fithost.HostAmount(0, 0), one - one)
        self.assertEqual('1000m CPU, 1024 MiB', one.describe())
