#!/usr/bin/env python3
"""Render deploy/kubernetes/ from the Helm chart with its default values.

deploy/kubernetes/ is the chart deploy/helm/amdgpu-virt rendered with
default values (release amdgpu-virt in namespace amdgpu-virt), one file per
template, for clusters that apply plain manifests::

    python3 deploy/render_manifests.py          # rewrite deploy/kubernetes
    python3 deploy/render_manifests.py --check  # exit 1 if it drifted

The default values take the webhook certificate from cert-manager, so the
rendering is deterministic (the chart-generated certificate of
``webhook.tls.mode=helm`` would change at every render). Rendering uses
the Helm engine of the helm-python-sdk package (module helm_python), a
test requirement that ``pip install .`` does not bring: install it with
``pip install -r test-requirements.txt`` (or ``pip install
'helm-python-sdk>=0.2.2'``). Without it the script says so and exits 69.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, 'helm', 'amdgpu-virt')
OUTPUT = os.path.join(HERE, 'kubernetes')
RELEASE = 'amdgpu-virt'
NAMESPACE = 'amdgpu-virt'
HEADER = (
    '# Generated from the Helm chart deploy/helm/amdgpu-virt with its '
    'default values\n'
    '# (release %s, namespace %s) by deploy/render_manifests.py: edit the '
    'chart,\n'
    '# not this file. Create the namespace first:\n'
    '#   kubectl create namespace %s && kubectl apply -f deploy/kubernetes/'
    '\n' % (RELEASE, NAMESPACE, NAMESPACE))


def render(values: dict | None = None, namespace: str = NAMESPACE,
           chart: str = CHART) -> dict[str, str]:
    """Template file name -> rendered text (empty renderings left out)."""
    import helm_python

    with helm_python.Chart.load(chart) as loaded:
        rendered = loaded.render(values, name=RELEASE, namespace=namespace,
                                 is_install=True)
    result = {}
    for path, text in sorted(rendered.items()):
        name = os.path.basename(path)
        body = text.strip()
        if not name.endswith('.yaml') or not body:
            continue
        result[name] = body + '\n'
    return result


def expected_files() -> dict[str, str]:
    """File name -> content of deploy/kubernetes/ as it should be."""
    return {name: HEADER + body for name, body in render().items()}


#: exit status when the Helm engine is not installed (EX_UNAVAILABLE)
MISSING_ENGINE = 69
MISSING_ENGINE_MESSAGE = (
    'render_manifests.py: the Helm engine it renders with is not installed '
    '(Python module helm_python, package helm-python-sdk, a test '
    'requirement that "pip install ." does not bring). Install it with\n'
    '    pip install -r test-requirements.txt\n'
    "or  pip install 'helm-python-sdk>=0.2.2'\n"
    '(with the helm binary, "helm template amdgpu-virt deploy/helm/'
    'amdgpu-virt --namespace amdgpu-virt" prints the same objects)\n')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--check', action='store_true',
                        help='report drift instead of rewriting')
    parser.add_argument('--output', default=OUTPUT, metavar='DIR',
                        help='the directory (default: deploy/kubernetes)')
    args = parser.parse_args(argv)
    output = args.output
    try:
        wanted = expected_files()
    except ModuleNotFoundError as err:
        if err.name != 'helm_python':
            raise
        sys.stderr.write(MISSING_ENGINE_MESSAGE)
        return MISSING_ENGINE
    present = {n for n in os.listdir(output) if n.endswith('.yaml')}
    drift = sorted(present - set(wanted))
    for name, content in wanted.items():
        path = os.path.join(output, name)
        try:
            with open(path, encoding='utf-8') as stream:
                current = stream.read()
        except FileNotFoundError:
            current = None
        if current != content:
            drift.append(name)
    if args.check:
        for name in sorted(set(drift)):
            print('%s differs from the chart' % os.path.join(output, name))
        return 1 if drift else 0
    for name in present - set(wanted):
        os.unlink(os.path.join(output, name))
    for name, content in wanted.items():
        with open(os.path.join(output, name), 'w', encoding='utf-8') as out:
            out.write(content)
    return 0


if __name__ == '__main__':
    sys.exit(main())
