"""The Containerfile's install steps, run here.

No container engine runs where the tests do, so this test plays the
engine's part for the recipe's build stage: it copies the build context
as the engine would (honouring .containerignore, so there is no .git),
runs every RUN instruction of the build stage with bash, in order, with
the stage's ENV and the VERSION build argument, the stage's paths moved
into a temporary directory; then it runs the installed ``amdgpu-virt``
with the runtime stage's environment.

Offline differences, and only these: pip is told not to reach an index
(PIP_NO_INDEX) and to build with the setuptools, pbr and wheel already
installed (no build isolation); and the dependencies are not installed
into the new environment (PIP_NO_DEPS) but taken from the running
interpreter's site-packages at run time (a .pth file appended to the new
environment, so ``amdgpu_virt`` itself and its metadata come from the new
environment, which the test checks).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from dockerfile_parse import DockerfileParser
import testtools

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..',
                                    '..'))
RECIPE = os.path.join(ROOT, 'Containerfile')


def stages() -> list[list[dict]]:
    with open(RECIPE, 'rb') as stream:
        structure = DockerfileParser(fileobj=stream).structure
    found: list[list[dict]] = []
    for item in structure:
        if item['instruction'] == 'FROM':
            found.append([])
        if found and item['instruction'] != 'COMMENT':
            found[-1].append(item)
    return found


def env_pairs(value: str) -> list[tuple[str, str]]:
    """KEY=VALUE pairs of one ENV instruction (no quoting used)."""
    return [tuple(p.split('=', 1)) for p in value.split()]  # type: ignore


def copy_context(target: str) -> None:
    """The build context as an engine sends it (.containerignore)."""
    with open(os.path.join(ROOT, '.containerignore')) as stream:
        patterns = [p.strip().rstrip('/') for p in stream if p.strip()]

    def ignored(rel: str) -> bool:
        name = os.path.basename(rel)
        return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p.split(
            '/')[-1]) and p.startswith('**/') for p in patterns)

    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        dirnames[:] = [d for d in dirnames if not ignored(
            os.path.normpath(os.path.join(rel_dir, d)))]
        for name in filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if ignored(rel):
                continue
            os.makedirs(os.path.join(target, rel_dir), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), os.path.join(target, rel))


def _can_build_wheels() -> bool:
    """bdist_wheel without build isolation: in setuptools since 70.1,
    from the wheel package before."""
    import importlib.util

    import setuptools

    major, minor = (int(p) for p in setuptools.__version__.split('.')[:2])
    return (major, minor) >= (70, 1) or \
        importlib.util.find_spec('wheel') is not None


def pbr_version() -> str:
    result = subprocess.run(
        [sys.executable, 'setup.py', '-q', '--version'], cwd=ROOT,
        capture_output=True, text=True, check=True)
    return result.stdout.strip().splitlines()[-1]


class ContainerfileInstallTest(testtools.TestCase):
    """One test: the build is the slow part, done once."""

    def test_recipe(self) -> None:
        if not _can_build_wheels():
            self.skipTest('building the wheel offline needs the wheel '
                          'package or setuptools >= 70.1 (tox installs '
                          'them from test-requirements.txt)')
        self.addCleanup(shutil.rmtree, self.build(), True)
        self.check_wheel()
        self.check_version()
        self.check_help_and_origin()
        self.check_no_writes()

    @classmethod
    def build(cls) -> str:
        cls.tmp = tempfile.mkdtemp(prefix='image-')
        cls.version = pbr_version()
        build, runtime = stages()
        cls.runtime = runtime
        paths = {'SRC': os.path.join(cls.tmp, 'src'),
                 'WHEELS': os.path.join(cls.tmp, 'wheels'),
                 'VENV': os.path.join(cls.tmp, 'opt', 'amdgpu-virt')}
        cls.paths = paths
        bindir = os.path.join(cls.tmp, 'bin')
        os.makedirs(bindir)
        # "python3" of the recipe is the interpreter running the tests
        # (a wrapper, not a symlink: a venv's python must be called by
        # its own path)
        wrapper = os.path.join(bindir, 'python3')
        with open(wrapper, 'w') as out:
            out.write('#!/bin/sh\nexec %s "$@"\n' % sys.executable)
        os.chmod(wrapper, 0o755)
        env = {'PATH': bindir + os.pathsep + os.environ['PATH'],
               'HOME': cls.tmp, 'LANG': 'C.UTF-8'}
        args: dict[str, str] = {'VERSION': cls.version}
        cls.log = []
        for item in build:
            instruction, value = item['instruction'], item['value']
            if instruction == 'ARG':
                key, _, default = value.partition('=')
                env[key] = args.get(key, default)
            elif instruction == 'ENV':
                for key, raw in env_pairs(value):
                    env[key] = paths.get(key) or raw.replace(
                        '${VERSION}', args['VERSION'])
            elif instruction == 'COPY':
                assert value == '. /src', value
                copy_context(paths['SRC'])
            elif instruction == 'RUN':
                run_env = dict(env, PIP_NO_INDEX='1', PIP_NO_DEPS='1',
                               PIP_NO_BUILD_ISOLATION='0')
                run_env.pop('PIP_FIND_LINKS', None)
                started = time.monotonic()
                result = subprocess.run(
                    ['bash', '-ec', value], env=run_env, cwd=paths['SRC'],
                    capture_output=True, text=True, timeout=300)
                print('%.1fs RUN %s' % (time.monotonic() - started, value))
                cls.log.append((value, result.returncode,
                                result.stdout[-2000:], result.stderr[-4000:]))
                if result.returncode:
                    raise AssertionError('RUN %s failed:\n%s\n%s' % (
                        value, result.stdout[-2000:], result.stderr[-4000:]))
        cls.venv = paths['VENV']
        # the dependencies: every site-packages of the test interpreter,
        # after the new environment's own (a .pth line adds a directory
        # without processing its .pth files, so no editable install of
        # amdgpu_virt comes back this way)
        sites = [p for p in sys.path if os.path.basename(p) in (
            'site-packages', 'dist-packages')]
        (own,) = glob.glob(os.path.join(cls.venv, 'lib', 'python3*',
                                        'site-packages'))
        with open(os.path.join(own, 'zz-test-dependencies.pth'), 'w') as out:
            out.write(''.join(p + '\n' for p in sites))
        return cls.tmp

    def run_image(self, *args: str) -> subprocess.CompletedProcess:
        env = {'LANG': 'C.UTF-8'}
        for item in self.runtime:
            if item['instruction'] == 'ENV':
                for key, raw in env_pairs(item['value']):
                    env[key] = raw
        home = os.path.join(self.tmp, 'home')
        os.makedirs(home, exist_ok=True)
        env['PATH'] = env['PATH'].replace(
            '/opt/amdgpu-virt/bin', os.path.join(self.venv, 'bin')).replace(
                '$PATH', '/usr/bin:/bin')
        env['HOME'] = env['TMPDIR'] = home
        return subprocess.run(['amdgpu-virt', *args], env=env, cwd=home,
                              capture_output=True, text=True, timeout=120)

    def check_wheel(self) -> None:
        (wheel,) = os.listdir(self.paths['WHEELS'])
        self.assertEqual('amdgpu_virt-%s-py3-none-any.whl' % self.version,
                         wheel)
        with zipfile.ZipFile(os.path.join(self.paths['WHEELS'],
                                          wheel)) as archive:
            names = set(archive.namelist())
            metadata = archive.read('amdgpu_virt-%s.dist-info/METADATA'
                                    % self.version).decode()
        for data in ('amdgpu_virt/data/sample_fleet.yaml',
                     'amdgpu_virt/data/sample_workloads.yaml',
                     'amdgpu_virt/k8s/proto/deviceplugin/v1beta1/'
                     'api_pb2.py'):
            self.assertIn(data, names)
        # the runtime requirements travel with the wheel
        with open(os.path.join(ROOT, 'requirements.txt')) as stream:
            wanted = [line.split('#')[0].split('>=')[0].strip()
                      for line in stream
                      if line.strip() and not line.startswith('#')]
        requires = [line.split(':', 1)[1].strip().split('>=')[0].split()[0]
                    for line in metadata.splitlines()
                    if line.startswith('Requires-Dist:') and
                    'extra ==' not in line]
        self.assertEqual(sorted(w.lower() for w in wanted),
                         sorted(r.lower() for r in requires))

    def check_version(self) -> None:
        result = self.run_image('--version')
        self.assertEqual(0, result.returncode, result.stderr)
        self.assertIn(self.version, result.stdout + result.stderr)

    def check_help_and_origin(self) -> None:
        result = self.run_image('--help')
        self.assertEqual(0, result.returncode, result.stderr)
        for command in ('k8s agent', 'k8s device plugin', 'k8s scheduler',
                        'k8s webhook', 'plan'):
            self.assertIn(command, result.stdout)
        where = subprocess.run(
            [os.path.join(self.venv, 'bin', 'python'), '-c',
             'import amdgpu_virt; print(amdgpu_virt.__file__)'],
            env={}, cwd=self.tmp, capture_output=True, text=True,
            check=True).stdout
        self.assertTrue(where.startswith(self.venv), where)

    def check_no_writes(self) -> None:
        def listing() -> set[str]:
            return {os.path.join(d, f) for d, _dirs, files in
                    os.walk(self.venv) for f in files}

        before = listing()
        result = self.run_image('plan')
        self.assertEqual(0, result.returncode, result.stderr)
        self.assertIn('placed', result.stdout)
        self.assertEqual(set(), listing() - before)
