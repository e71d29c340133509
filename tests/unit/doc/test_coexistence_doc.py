"""The coexistence guide says what the webhook does with pods meant for
ROCm's device plugin: checked against the webhook itself."""

from __future__ import annotations

import base64
import json
import os
import re

import jsonpatch
import testtools

from amdgpu_virt.k8s.admission import webhook

GUIDE = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'doc',
                     'source', 'admin', 'coexistence.rst')


def _section(title: str) -> str:
    with open(GUIDE, encoding='utf-8') as handle:
        text = handle.read()
    start = text.index('\n%s\n' % title)
    rest = text[start + len(title) + 2:]
    end = re.search(r'\n\S[^\n]*\n=+\n', rest)
    return ' '.join(rest[:end.start() if end else None].split())


def _review(namespace: str, scheduler: str) -> dict:
    pod = {'apiVersion': 'v1', 'kind': 'Pod',
           'metadata': {'name': 'p', 'namespace': namespace},
           'spec': {'schedulerName': scheduler, 'containers': [
               {'name': 'c', 'image': 'rocm', 'resources': {
                   'limits': {'amd.com/gpu': '1'}}}]}}
    policy = webhook.WebhookPolicy(
        scheduler_name='amdgpu-virt-scheduler',
        exempt_namespaces=frozenset({'rocm-jobs'}))
    response = webhook.review(
        {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview',
         'request': {'uid': 'u', 'kind': {'group': '', 'version': 'v1',
                                          'kind': 'Pod'},
                     'namespace': namespace, 'operation': 'CREATE',
                     'object': pod}}, policy, {})['response']
    if 'patch' not in response:
        return pod
    return jsonpatch.apply_patch(
        pod, json.loads(base64.b64decode(response['patch'])))


class CoexistenceGuideTest(testtools.TestCase):

    def test_rocm_pods_need_an_exempt_namespace_as_the_guide_says(self):
        # the webhook hands a default-scheduler pod asking amd.com/gpu to
        # our scheduler, in any namespace it serves...
        for scheduler in ('default-scheduler', 'volcano'):
            self.assertEqual('amdgpu-virt-scheduler', _review(
                'team', scheduler)['spec']['schedulerName'])
        # ...and leaves it alone in an exempt namespace
        self.assertEqual('default-scheduler', _review(
            'rocm-jobs', 'default-scheduler')['spec']['schedulerName'])
        text = _section('The ROCm device plugin without the Operator')
        self.assertNotIn('as before', text)
        for promise in ('whatever scheduler the pod named',
                        'webhook.exemptNamespaces',
                        'webhook.namespaceSelector',
                        'amdgpu-virt.io/gpu-node DoesNotExist'):
            self.assertIn(promise, text)
