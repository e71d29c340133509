"""README's "Deploy to a cluster" block, checked against the chart.

Two steps: build and push the image, ``helm install``. The install
command is rendered with the real Helm engine exactly as written (its
``--set`` values, its namespace) and must give shared GPUs on a node that
has nothing installed: the library's init containers, GPUs shared, the
node pods on the nodes the README says to label.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
from typing import Any

import testtools

from tests.unit.deploy import chart

README = os.path.join(chart.ROOT, 'README.rst')
VERSION = '1.2.3'


def deploy_section() -> str:
    with open(README, encoding='utf-8') as stream:
        text = stream.read()
    start = text.index('\nDeploy to a cluster\n')
    end = re.search(r'\n[^\n]+\n=+\n', text[start + 30:])
    assert end is not None
    return text[start:start + 30 + end.start()]


def commands(section: str) -> list[list[str]]:
    """The literal block's commands, continuation lines joined."""
    block = section.split('::\n', 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith(' '):
            break
        lines.append(line.strip())
    joined = '\n'.join(lines).replace('\\\n', ' ')
    return [shlex.split(line.replace('$VERSION', VERSION))
            for line in joined.splitlines() if line.strip()]


def set_values(argv: list[str]) -> dict[str, Any]:
    """Helm's ``--set a.b=c,d=e`` (strings, as written)."""
    values: dict[str, Any] = {}
    for n, word in enumerate(argv):
        if word != '--set':
            continue
        for item in argv[n + 1].split(','):
            key, value = item.split('=', 1)
            *parents, leaf = key.split('.')
            target = values
            for part in parents:
                target = target.setdefault(part, {})
            target[leaf] = value
    return values


class ReadmeDeployTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.section = deploy_section()
        self.commands = commands(self.section)

    def command(self, *prefix: str) -> list[str]:
        for argv in self.commands:
            if argv[:len(prefix)] == list(prefix):
                return argv
        raise AssertionError('no %s command in README' % ' '.join(prefix))

    def test_two_steps_build_push_then_helm_install(self) -> None:
        self.assertEqual(['VERSION=$(python3', 'podman', 'podman', 'helm'],
                         [c[0] for c in self.commands])
        build = self.command('podman', 'build')
        tag = build[build.index('-t') + 1]
        self.assertEqual(['podman', 'push', tag],
                         self.command('podman', 'push'))
        self.assertTrue(os.path.exists(os.path.join(
            chart.ROOT, build[build.index('-f') + 1])))
        install = self.command('helm', 'install')
        self.assertEqual(os.path.join('deploy', 'helm', 'amdgpu-virt'),
                         install[3])
        values = set_values(install)
        self.assertEqual(tag, '%s:%s' % (values['image']['repository'],
                                         values['image']['tag']))

    def test_helm_install_as_written_gives_shared_gpus(self) -> None:
        install = self.command('helm', 'install')
        namespace = install[install.index('--namespace') + 1]
        self.assertIn('--create-namespace', install)
        docs = chart.documents(set_values(install), namespace)
        node = chart.find(docs, 'DaemonSet', 'amdgpu-virt-node')['spec'][
            'template']['spec']
        self.assertIn('registry.example.com/amdgpu-virt:%s' % VERSION,
                      [c['image'] for c in node['containers']])
        # the library is delivered by the chart itself
        self.assertEqual(['memory-hook-fetch', 'memory-hook-install'],
                         [c['name'] for c in node['initContainers']])
        parser = configparser.ConfigParser()
        parser.read_string(chart.find(docs, 'ConfigMap',
                                      'amdgpu-virt-config')['data'][
            'amdgpu-virt.conf'])
        self.assertEqual('hami', parser['kubernetes']['allocation_mode'])
        share = int(parser['kubernetes']['share_count'])
        self.assertGreater(share, 1)
        self.assertIn('up to %d pods' % share, ' '.join(
            self.section.split()))
        # the extender and the webhook that slices need come with it
        chart.find(docs, 'Deployment', 'amdgpu-virt-scheduler')
        chart.find(docs, 'MutatingWebhookConfiguration', 'amdgpu-virt')
        # the node pods run on the nodes the README says to label
        (label,) = node['nodeSelector'].items()
        self.assertIn('``%s=%s``' % label, self.section)
        fetch = node['initContainers'][0]
        self.assertIn('``%s``' % fetch['image'], self.section)
