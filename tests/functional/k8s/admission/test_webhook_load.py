"""One tenant pod, or one node, must not stop GPU admission for all.

The attacks seen: a pod of 500 containers, each stating its needs, took
25 s to review (one Event written per container, on the admission path);
with 3,000 containers the review answered 503 after 30 s while its worker
went on writing Events; ten deeply nested 2 KB statements took 6 s; a
node registering 10,000 GPUs of distinct shapes made every stated-needs
review answer 503. The API server gives a webhook 10 s at most, and with
``failurePolicy: Fail`` a late answer is a denial of every GPU pod.

Here the real webhook (``webhook.make_server``) reads namespaces and
nodes from the API server stand-in through the real ``kubernetes``
client and writes its Events there; the attacks are AdmissionReviews
posted over HTTP, while a legitimate review is asked beside them.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request
from typing import Any

import testtools

from amdgpu_virt.k8s.admission import webhook
from tests.functional.fixtures import hostilepods
from tests.functional.fixtures import kubeclient
from tests.functional.k8s import cluster

#: what the API server waits for a webhook at most (seconds)
API_SERVER_WAITS = 10.0
#: what a legitimate review may take beside an attack (a generous bound
#: for a busy CI machine; it takes about 0.05 s alone)
LEGITIMATE_WITHIN = 1.0
stated_pod = hostilepods.stated_pod
raw_pod = hostilepods.raw_pod
_gpu = hostilepods.gpu
_review_body = hostilepods.review_body


class _LoadTest(testtools.TestCase):

    policy = webhook.WebhookPolicy()

    def setUp(self) -> None:
        super().setUp()
        self.kube = self.useFixture(kubeclient.ApiServerFixture())
        hostilepods.seed(self.kube.api)
        self.nodes_ready()
        self.server, self.models, self.events = hostilepods.webhook(
            self.kube.api, self.policy)
        self.url = cluster.serve(self, self.server) + '/webhook'
        self.legitimate = stated_pod('ok', 2)
        # the first review reads the shapes; it is not what is measured
        self.assertTrue(self.review(self.legitimate)[0]['allowed'])

    def nodes_ready(self) -> None:
        """Called once the cluster's nodes exist (for more of them)."""

    def review(self, pod: dict[str, Any],
               body: bytes | None = None) -> tuple[dict[str, Any], float]:
        """(response, seconds) of one review over HTTP."""
        began = time.monotonic()
        request = urllib.request.Request(
            self.url, data=body or _review_body(pod),
            headers={'Content-Type': 'application/json'})
        with urllib.request.urlopen(request, timeout=60) as answer:
            self.assertEqual(200, answer.status)
            response: dict[str, Any] = json.loads(answer.read())['response']
        return response, time.monotonic() - began

    def beside(self, hostile: list[bytes]) -> tuple[
            list[tuple[dict[str, Any], float]], list[float]]:
        """Post the ``hostile`` reviews at once and, while they run,
        legitimate ones; :returns: the hostile answers and the
        legitimate reviews' times."""
        legit: list[float] = []
        with concurrent.futures.ThreadPoolExecutor(len(hostile)) as pool:
            futures = [pool.submit(self.review, {}, body)
                       for body in hostile]
            time.sleep(0.05)
            while not all(f.done() for f in futures) or len(legit) < 3:
                response, took = self.review(self.legitimate)
                self.assertTrue(response['allowed'], response)
                legit.append(took)
            return [f.result() for f in futures], legit


class HostilePodTest(_LoadTest):

    def _check(self, pods: list[dict[str, Any]], reason: str) -> None:
        answers, legit = self.beside([_review_body(p) for p in pods])
        for response, took in answers:
            self.assertFalse(response['allowed'], response)
            self.assertIn(reason, response['status']['message'])
            self.assertLess(took, API_SERVER_WAITS)
        self.assertLess(max(legit), LEGITIMATE_WITHIN, legit)

    def test_hundreds_of_statements(self) -> None:
        # 500, 3,000 and 10,000 containers, each stating its needs
        for containers in (500, 3000, 10000):
            self._check([stated_pod('big', containers, distinct=True)],
                        '%d containers' % containers)
        self.events.flush()
        self.assertEqual(1, self.events.written)   # the legitimate pod's

    def test_statements_up_to_the_cap_of_containers(self) -> None:
        # as many containers as a GPU pod may have, beyond the cap of
        # statements: refused before any statement is read
        self._check([stated_pod('many', self.policy.max_containers,
                                distinct=True)],
                    '%d statements of needs; a pod may carry at most 32'
                    % self.policy.max_containers)

    def test_deeply_nested_statements(self) -> None:
        pod = stated_pod('deep', 10, needs='[' * 1000 + ']' * 1000)
        self._check([pod], 'at most 512 are read')
        pod = stated_pod('deep', 10, needs='[' * 250 + ']' * 250)
        self._check([pod], 'nested: a statement is one mapping')

    def test_ten_thousand_raw_containers(self) -> None:
        self._check([raw_pod('raw', 10000)], '10000 containers')

    def test_eight_at_once(self) -> None:
        # as many as the server has workers, and a legitimate review
        # beside them
        self._check([stated_pod('big%d' % n, 3000, distinct=True)
                     for n in range(8)], '3000 containers')

    def test_one_event_per_distinct_decision(self) -> None:
        response, _took = self.review(stated_pod('same', 32))
        self.assertTrue(response['allowed'], response)
        self.events.flush()
        events = [e for e in self.kube.api.list_namespaced_event(
            'team').items if e.involved_object.name == 'same']
        self.assertEqual(1, len(events))
        self.assertIn("containers 'c00000', 'c00001',", events[0].message)
        self.assertEqual(0, self.events.dropped)


class ReviewBudgetTest(_LoadTest):
    """Past its time budget a review denies the pod, saying why; it is
    never a 503 (nor a silence past the API server's timeout)."""

    policy = webhook.WebhookPolicy(review_budget=0.05)

    def test_a_review_past_its_budget_is_a_clear_denial(self) -> None:
        pod = raw_pod('slow', 64)
        for container in pod['spec']['containers']:
            container['env'] = [{'name': 'E%d' % k, 'value': 'v'}
                                for k in range(3000)]
        response, took = self.review(pod)
        self.assertFalse(response['allowed'], response)
        self.assertIn('pod team/slow denied: the review took longer than '
                      'its budget of 0.05 s', response['status']['message'])
        self.assertLess(took, API_SERVER_WAITS)


class HostileNodeTest(_LoadTest):

    def nodes_ready(self) -> None:
        # one node registers 10,000 GPUs of distinct shapes (1.2 MB), one
        # 2,200 (within the API's 256 KiB), one 9 shapes of one GPU each
        for node, count in (('liar', 10000), ('sly', 2200), ('odd', 9)):
            hostilepods.register(self.kube.api, node,
                                 [_gpu(n, 1024 + n) for n in range(count)])

    def test_a_node_slows_no_review(self) -> None:
        took = [self.review(stated_pod('p%d' % n, 1))[1] for n in range(5)]
        self.assertLess(max(took), LEGITIMATE_WITHIN, took)
        self.assertEqual({'liar', 'sly', 'odd'}, self.models.refused)
        # only the honest nodes' one shape counts, with 8 GPUs a node
        models = self.models()
        self.assertEqual([(304, 196608)], [(m.compute_units, m.vram_mib)
                                           for m in models])
        self.assertEqual([8], list(self.models.most().values()))

    def test_a_node_that_registers_later_is_bounded_too(self) -> None:
        hostilepods.register(self.kube.api, 'later',
                             [_gpu(n, 2048 + n) for n in range(300)])
        deadline = time.monotonic() + 10
        while 'later' not in self.models.refused:
            self.assertLess(time.monotonic(), deadline, 'not watched')
            time.sleep(0.05)
        self.assertLess(self.review(stated_pod('q', 1))[1],
                        LEGITIMATE_WITHIN)


class GpusBoundTest(_LoadTest):

    def test_more_gpus_than_a_node_has_are_denied(self) -> None:
        pod = stated_pod('wide', 1, needs='gpus: 17')
        response, _took = self.review(pod)
        self.assertFalse(response['allowed'], response)
        self.assertIn('[gpus] requested 17 GPUs for one pod, but no node '
                      'registers more than 8 GPUs of one shape',
                      response['status']['message'])
        response, _took = self.review(stated_pod('fits', 1,
                                                 needs='gpus: 8'))
        self.assertTrue(response['allowed'], response)

    def test_the_bound_follows_the_nodes(self) -> None:
        # a node of 16 GPUs joins: the watch brings it, no restart
        hostilepods.register(self.kube.api, 'big',
                             [_gpu(n) for n in range(16)])
        deadline = time.monotonic() + 10
        while list(self.models.most().values()) != [16]:
            self.assertLess(time.monotonic(), deadline, 'not watched')
            time.sleep(0.05)
        response, _took = self.review(stated_pod('wide', 1,
                                                 needs='gpus: 16'))
        self.assertTrue(response['allowed'], response)
