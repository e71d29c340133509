"""Benchmark: allocation candidates for wide VMs (1 to 32 VFs on one host).

Against a real openstack-placement server in a child process (SQLite,
127.0.0.1), seeded with ``--hosts`` 8 x MI300X GIM CPX hosts (64 VFs each)
the way nova-compute reports them, per-GPU traits included. For each VF
count, the query is the one Nova 34's scheduler sends
(``tests/functional/nova/novaquery.py``: Nova's own alias translation,
request groups and query string, ``limit=1000`` as Nova's
``[scheduler] max_placement_results``), for two flavor shapes:

* ``plain``: ``pci_passthrough:alias=amd-mi300x-cpx-vf:<n>``, one request
  group per VF, each matching every GPU of a host;
* ``per-gpu``: the flavor's ``gpus`` spread over per-GPU aliases
  (``...-gpu0:<k>,...``), each group matching exactly one provider.

each under Placement's default settings and under the settings Placement
recommends for wide trees (``[placement] max_allocation_candidates =
1000``, ``allocation_candidates_generation_strategy = breadth-first``,
``[workarounds] optimize_for_wide_provider_trees = True``). A query that
does not answer within ``--timeout`` seconds is reported as such; the
server process (busy enumerating) is then killed and started again on the
same database.

Usage::

    python bench/nova_wide.py                      # 2 hosts, 30 s bound
    python bench/nova_wide.py --vfs 1,4 --timeout 5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import requests  # noqa: E402

from amdgpu_virt.inventory.simulate import HostSpec  # noqa: E402
from amdgpu_virt.inventory.simulate import design_host  # noqa: E402
from amdgpu_virt.nova import flavors  # noqa: E402
from amdgpu_virt.nova import pci  # noqa: E402
from amdgpu_virt.nova import plan as nova_plan  # noqa: E402
from amdgpu_virt.nova.naming import Naming  # noqa: E402
from tests.functional.fixtures import placement as fixture  # noqa: E402
from tests.functional.nova import novaquery  # noqa: E402

TUNED = {'max_allocation_candidates': 1000,
         'allocation_candidates_generation_strategy': 'breadth-first',
         'workarounds.optimize_for_wide_provider_trees': True}
HEADERS = {'X-Auth-Token': 'admin',
           'OpenStack-API-Version': 'placement %s' % fixture.MICROVERSION}


def serve(db_url: str, overrides: str) -> None:
    """Child process: serve Placement, print the URL, run until killed."""
    server = fixture.PlacementServer(db_url, json.loads(overrides)).start()
    print(server.url, flush=True)
    while True:
        time.sleep(3600)


class Child:
    """A Placement server process that can be killed mid-request."""

    def __init__(self, db_url: str, overrides: dict) -> None:
        self.db_url = db_url
        self.overrides = overrides
        self.proc: subprocess.Popen | None = None
        self.url = ''

    def start(self) -> Child:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), '--serve',
             self.db_url, json.dumps(self.overrides)],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith('http'):
            raise SystemExit('placement server did not start')
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def _flavor(count: int, per_gpu: bool) -> flavors.FlavorSpec:
    raw = {'name': 'bench', 'vcpus': 16, 'ram_mib': 65536, 'disk_gb': 100,
           'alias': 'amd-mi300x-cpx-vf', 'count': count}
    if per_gpu:
        raw['gpus'] = min(count, 8)
    (spec,) = flavors.parse({'flavors': [raw]})
    return spec


def _query(child: Child, params, timeout: float):
    start = time.perf_counter()
    try:
        response = requests.get(child.url + '/allocation_candidates',
                                params=params, headers=HEADERS,
                                timeout=timeout)
    except requests.exceptions.Timeout:
        child.restart()
        return None, 0
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise SystemExit('allocation_candidates -> %s %s' % (
            response.status_code, response.text[:500]))
    return elapsed, len(response.json()['allocation_requests'])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--serve', nargs=2, help=argparse.SUPPRESS)
    parser.add_argument('--hosts', type=int, default=2,
                        help='8 x 8 VF hosts in Placement (default 2)')
    parser.add_argument('--vfs', default='1,4,8,16,32',
                        help='VF counts per VM (default 1,4,8,16,32)')
    parser.add_argument('--repeat', type=int, default=3,
                        help='samples per case that answers (median)')
    parser.add_argument('--timeout', type=float, default=30.0,
                        help='seconds to wait for one answer (default 30)')
    args = parser.parse_args(argv)
    if args.serve:
        serve(*args.serve)
        return 0

    # Nova logs a warning per multi-group query without group_policy
    logging.getLogger('nova').setLevel(logging.ERROR)
    tmp = tempfile.TemporaryDirectory(prefix='placement-wide-')
    db_url = 'sqlite:///%s' % os.path.join(tmp.name, 'placement.db')
    default = Child(db_url, {}).start()
    try:
        conn = fixture.PlacementServer(db_url)
        conn.url = default.url
        seeder = fixture.NovaLikeSeeder(conn.connection())
        naming = Naming()
        aliases = []
        for i in range(args.hosts):
            plan = nova_plan.plan_host(design_host(HostSpec(
                'wide-%02d' % i, mode='gim-cpx')), naming)
            seeder.seed_offers(plan.hostname, plan.offers)
            aliases = pci.aliases(a for o in plan.offers
                                  for a in pci.aliases_of(o))
        tuned = Child(db_url, TUNED).start()
        try:
            _run(args, aliases, (('default', default), ('tuned', tuned)))
        finally:
            tuned.stop()
    finally:
        default.stop()
        tmp.cleanup()
    return 0


def _run(args, aliases, children):
    print('allocation candidates, %d hosts of 8 x MI300X CPX (64 VFs each), '
          "Nova's query (limit=1000), median of %d, bound %.0f s:" % (
              args.hosts, args.repeat, args.timeout))
    print('%-5s %-8s %-8s %14s %8s' % ('VFs', 'flavor', 'settings',
                                        'time', 'cand.'))
    for count in [int(v) for v in args.vfs.split(',') if v]:
        for per_gpu in (False, True):
            with novaquery.nova_aliases(aliases):
                params = novaquery.query(_flavor(count, per_gpu))
            for label, child in children:
                samples = []
                for _ in range(args.repeat):
                    elapsed, found = _query(child, params, args.timeout)
                    if elapsed is None:
                        break
                    samples.append((elapsed, found))
                shape = 'per-gpu' if per_gpu else 'plain'
                if not samples:
                    print('%-5d %-8s %-8s did not return within %.0f s' % (
                        count, shape, label, args.timeout), flush=True)
                    continue
                print('%-5d %-8s %-8s %11.1f ms %8d' % (
                    count, shape, label,
                    1000 * statistics.median(s[0] for s in samples),
                    samples[0][1]), flush=True)


if __name__ == '__main__':
    sys.exit(main())
