"""Benchmark: Placement audit of N GPU hosts, and allocation candidates.

Against a real openstack-placement (SQLite, in-process, 127.0.0.1):

1. Seeds N simulated 8 x MI300X GIM CPX hosts (64 VFs each) the way
   nova-compute reports them, then runs ``amdgpu_virt.nova.audit`` over all
   of them and prints the Placement API calls, the time taken and the write
   requests the audit made (must be 0).
2. Measures ``GET /allocation_candidates`` latency on one 8 x 8 VF host
   (``in_tree``) for 1 VF and for VFs in several request groups (how Nova
   asks for several PCI devices), with Placement's default settings and
   with the settings Nova recommends for wide trees
   (``max_allocation_candidates = 100000``,
   ``allocation_candidates_generation_strategy = breadth-first``), side by
   side.

Usage::

    python bench/nova_audit.py                 # 500 hosts
    python bench/nova_audit.py --hosts 20 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

from amdgpu_virt.inventory.simulate import HostSpec  # noqa: E402
from amdgpu_virt.inventory.simulate import design_host  # noqa: E402
from amdgpu_virt.nova import audit  # noqa: E402
from amdgpu_virt.nova import plan as nova_plan  # noqa: E402
from amdgpu_virt.nova.naming import Naming  # noqa: E402
from amdgpu_virt.nova.placement import PlacementReader  # noqa: E402
from tests.functional.fixtures import placement as fixture  # noqa: E402

MV = fixture.MICROVERSION
TUNED = {'max_allocation_candidates': 100000,
         'allocation_candidates_generation_strategy': 'breadth-first'}


def _call(conn, method, path, body=None):
    response = conn.placement.request(path, method, json=body,
                                      microversion=MV, raise_exc=False)
    if response.status_code >= 400:
        raise SystemExit('%s %s -> %s %s' % (method, path,
                                              response.status_code,
                                              response.text))
    return response


def seed_host(conn, plan):
    """Nova-like providers with known generations (3 calls per GPU)."""
    node = plan.hostname
    root = str(uuid.uuid5(uuid.NAMESPACE_URL, node))
    _call(conn, 'POST', '/resource_providers', {'name': node, 'uuid': root})
    _call(conn, 'PUT', '/resource_providers/%s/inventories' % root, {
        'resource_provider_generation': 0,
        'inventories': {'VCPU': {'total': 128},
                        'MEMORY_MB': {'total': 1 << 20}}})
    for offer in plan.offers:
        name = '%s_%s' % (node, str(offer.address).upper())
        rp = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
        _call(conn, 'POST', '/resource_providers', {
            'name': name, 'uuid': rp, 'parent_provider_uuid': root})
        _call(conn, 'PUT', '/resource_providers/%s/inventories' % rp, {
            'resource_provider_generation': 0,
            'inventories': {offer.resource_class: {
                'total': offer.total, 'max_unit': offer.total}}})
        _call(conn, 'PUT', '/resource_providers/%s/traits' % rp, {
            'resource_provider_generation': 1,
            'traits': sorted(set(offer.traits) | {
                'COMPUTE_MANAGED_PCI_DEVICE', 'OWNER_NOVA'})})
    return root


def _candidates(conn, root, rc, groups):
    params = {'limit': 1000}
    if groups == 1:
        params.update({'resources': '%s:1' % rc, 'in_tree': root})
    else:
        for i in range(1, groups + 1):
            params['resources%d' % i] = '%s:1' % rc
            params['in_tree%d' % i] = root
        params['group_policy'] = 'none'
    start = time.perf_counter()
    response = conn.placement.get('/allocation_candidates', params=params,
                                  microversion=MV, raise_exc=False)
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise SystemExit('allocation_candidates -> %s %s' % (
            response.status_code, response.text))
    return elapsed, len(response.json()['allocation_requests'])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--hosts', type=int, default=500,
                        help='simulated hosts to audit (default 500)')
    parser.add_argument('--repeat', type=int, default=5,
                        help='allocation-candidates samples per case')
    parser.add_argument('--groups', default='1,2,3,4',
                        help='request groups (VFs) per candidates query')
    args = parser.parse_args(argv)

    naming = Naming()
    server = fixture.get_server()
    conn = server.connection()
    spec_plan = nova_plan.plan_host(
        design_host(HostSpec('template', mode='gim-cpx')), naming)
    for rc in {o.resource_class for o in spec_plan.offers}:
        _call(conn, 'PUT', '/resource_classes/%s' % rc)
    for trait in {t for o in spec_plan.offers for t in o.traits}:
        _call(conn, 'PUT', '/traits/%s' % trait)

    tag = uuid.uuid4().hex[:6]
    plans = []
    start = time.perf_counter()
    roots = []
    for i in range(args.hosts):
        inventory = design_host(HostSpec('bench-%s-%04d' % (tag, i),
                                         mode='gim-cpx'))
        plan = nova_plan.plan_host(inventory, naming)
        roots.append(seed_host(conn, plan))
        plans.append(plan)
    seeded = time.perf_counter() - start
    print('seeded %d hosts x 8 GPUs x 8 VFs in %.1f s' % (args.hosts,
                                                         seeded))

    server.counter.reset()
    reader = PlacementReader(conn.placement)
    start = time.perf_counter()
    report = audit.audit(plans, reader)
    elapsed = time.perf_counter() - start
    print('audit: %d hosts, %d findings, %d API calls (%.2f per host), '
          '%.2f s (%.1f ms per host), %d writes' % (
              len(report.hosts), len(report.findings), report.api_calls,
              report.api_calls / max(1, args.hosts), elapsed,
              1000 * elapsed / max(1, args.hosts), server.counter.writes))
    if server.counter.writes:
        raise SystemExit('the audit wrote to Placement')

    tuned = fixture.extra_app(TUNED)
    tuned_conn = tuned.connection()
    rc = spec_plan.offers[0].resource_class
    root = roots[0]
    print()
    print('allocation candidates on one 8 x 8 VF host (in_tree, limit=1000), '
          'median of %d:' % args.repeat)
    print('%-8s %22s %22s' % ('VFs', 'default', 'tuned'))
    for groups in [int(g) for g in args.groups.split(',') if g]:
        row = []
        for connection in (conn, tuned_conn):
            samples = [_candidates(connection, root, rc, groups)
                       for _ in range(args.repeat)]
            median = statistics.median(s[0] for s in samples)
            row.append('%8.1f ms %6d cand.' % (1000 * median,
                                               samples[0][1]))
        print('%-8d %22s %22s' % (groups, row[0], row[1]))
    print('(tuned caps generation at %d candidates; Placement builds every '
          'candidate before applying limit)' % TUNED[
              'max_allocation_candidates'])
    return 0


if __name__ == '__main__':
    sys.exit(main())
