"""The Containerfile's rules, checked on its parsed instructions."""

from __future__ import annotations

import io
import json
import os
import re

from dockerfile_parse import DockerfileParser
import testtools

from tests.unit.deploy import chart

RECIPE = os.path.join(chart.ROOT, 'Containerfile')
#: a digest-free, version-pinned slim Python tag
PINNED_BASE = re.compile(r'^python:3\.1[1-9]-slim$')


def lint(text: str) -> list[str]:
    """Every broken rule of a recipe, or []."""
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    items = [i for i in parser.structure if i['instruction'] != 'COMMENT']
    problems = []
    stages = [i for i in items if i['instruction'] == 'FROM']
    if len(stages) < 2:
        problems.append('not multi-stage')
    for stage in stages:
        image = stage['value'].split()[0]
        if not PINNED_BASE.match(image):
            problems.append('base image %s is not python:3.1x-slim' % image)
    last = items[[n for n, i in enumerate(items)
                  if i['instruction'] == 'FROM'][-1]:] if stages else items
    users = [i['value'] for i in last if i['instruction'] == 'USER']
    if not users or not re.match(r'^[1-9][0-9]*(:[1-9][0-9]*)?$', users[-1]):
        problems.append('final stage has no non-root numeric USER')
    labels = parser.labels
    for key in ('source', 'version', 'licenses'):
        if not labels.get('org.opencontainers.image.%s' % key) and \
                'org.opencontainers.image.%s' % key not in text:
            problems.append('label org.opencontainers.image.%s missing' % key)
    entry = [i['value'] for i in last if i['instruction'] == 'ENTRYPOINT']
    if not entry or json.loads(entry[-1]) != ['amdgpu-virt']:
        problems.append('ENTRYPOINT is not ["amdgpu-virt"]')
    for item in items:
        value = item['value']
        if item['instruction'] == 'ADD' and re.search(r'https?://', value):
            problems.append('ADD of a URL: %s' % value)
        if item['instruction'] == 'ADD':
            problems.append('ADD instead of COPY: %s' % value)
        if item['instruction'] == 'RUN' and re.search(
                r'(curl|wget)[^|;&]*\|\s*(ba|z|da)?sh\b', value):
            problems.append('pipes a download into a shell: %s' % value)
        if item['instruction'] == 'RUN' and re.search(r'\bsudo\b', value):
            problems.append('sudo: %s' % value)
    if not [i for i in last if i['instruction'] == 'COPY' and
            i['value'].startswith('--from=')]:
        problems.append('final stage does not copy from the build stage')
    envs = parser.envs
    for key in ('HOME', 'TMPDIR'):
        if envs.get(key) != '/tmp':
            problems.append('%s is not /tmp (the mounted emptyDir)' % key)
    return problems


class ContainerfileTest(testtools.TestCase):

    def setUp(self) -> None:
        super().setUp()
        with open(RECIPE) as stream:
            self.text = stream.read()

    def test_recipe_follows_the_rules(self) -> None:
        self.assertEqual([], lint(self.text))

    def test_rules_catch_mistakes(self) -> None:
        cases = [
            ('FROM python:3.11-slim AS build', 'FROM python:latest AS build',
             'is not python:3.1x-slim'),
            ('FROM python:3.11-slim\n', 'FROM python:3.11-slim@sha256:'
             'abc\n', 'is not python:3.1x-slim'),
            ('USER 65532:65532', 'USER root', 'no non-root numeric USER'),
            ('USER 65532:65532', 'USER 0', 'no non-root numeric USER'),
            ('ENTRYPOINT ["amdgpu-virt"]', 'ENTRYPOINT ["sh"]', 'ENTRYPOINT'),
            ('org.opencontainers.image.licenses="Apache-2.0"',
             'org.opencontainers.image.vendor="x"', 'licenses missing'),
            ('HOME=/tmp', 'HOME=/root', 'HOME is not /tmp'),
            ('COPY --from=build', 'COPY', 'does not copy from the build'),
        ]
        for old, new, message in cases:
            self.assertIn(old, self.text)
            problems = lint(self.text.replace(old, new, 1))
            self.assertTrue(any(message in p for p in problems),
                            (old, new, problems))
        hostile = self.text + (
            '\nRUN curl -fsSL https://example.org/install.sh | sh\n'
            'ADD https://example.org/tool.tgz /opt/\n')
        problems = lint(hostile)
        self.assertTrue(any('pipes a download' in p for p in problems))
        self.assertTrue(any('ADD of a URL' in p for p in problems))

    def test_one_image_for_every_component(self) -> None:
        # the manifests run the same image with the command choosing
        images = set()
        for doc in chart.documents():
            template = (doc.get('spec') or {}).get('template') or {}
            for container in (template.get('spec') or {}).get(
                    'containers', []):
                if container['command'][0] == 'amdgpu-virt':
                    images.add(container['image'])
        self.assertEqual(1, len(images), images)

    def test_context_leaves_out_local_state(self) -> None:
        with open(os.path.join(chart.ROOT, '.containerignore')) as stream:
            ignored = {line.strip() for line in stream}
        self.assertTrue({'.git', '.tox', '.stestr'} <= ignored)
        with open(os.path.join(chart.ROOT, '.dockerignore')) as stream:
            self.assertEqual(ignored, {line.strip() for line in stream})
