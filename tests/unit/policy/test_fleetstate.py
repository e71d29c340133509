"""Holding running placements (``FleetState.hold``): a state file or the
live cluster is input, so a hold that over-commits a GPU, overlaps
another or names a GPU the fleet does not have is refused, naming the
workload and the GPU, and changes nothing."""

from __future__ import annotations

import dataclasses
import functools

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from amdgpu_virt import exception
from amdgpu_virt.model import Kind
from amdgpu_virt.policy import fleetstate
from amdgpu_virt.policy.decision import Decision
from amdgpu_virt.policy.decision import parse_cu_ranges
from amdgpu_virt.policy.workload import Platform
from amdgpu_virt.policy.workload import Tenancy
from amdgpu_virt.policy.workload import Workload
from amdgpu_virt.policy import planner as av_planner
from tests.unit.policy import test_properties as props
from tests.unit.policy import utils

MAX_SLICES = 3
_IMPROVE = utils.conf(max_slices_per_gpu=4, improve_seconds=30.0,
                      improve_tries=8)


@functools.lru_cache(maxsize=1)
def _planned():
    """A small fleet with every role, its ledger and valid placements."""
    hosts = [utils.host('gim', 'gim-cpx', gpus=2),
             utils.host('bm', 'spx', gpus=2),
             utils.host('part', 'cpx', gpus=1, nps='nps4')]
    items = [Workload('vm%d' % i, Platform.VM, memory_mib=20480, cus=38)
             for i in range(3)]
    items += [Workload('pod%d' % i, Platform.POD, Tenancy.TRUSTED,
                       percent=10, memory_mib=16384) for i in range(4)]
    items += [Workload('part%d' % i, Platform.POD, Tenancy.TRUSTED, cus=20,
                       memory_mib=8192, models=('MI300X',))
              for i in range(2)]
    items += [Workload('whole', Platform.VM)]
    conf = utils.conf(max_slices_per_gpu=MAX_SLICES)
    plan = utils.plan(hosts, items, conf)
    placed = [d for d in plan.decisions if d.placed]
    assert {d.kind for d in placed} == set(Kind), placed
    return hosts, conf, plan.ledger, placed


def _state(existing=(), max_slices=MAX_SLICES):
    hosts, conf, ledger, _placed = _planned()
    if max_slices != MAX_SLICES:
        conf = utils.conf(max_slices_per_gpu=max_slices)
    return fleetstate.FleetState(conf, hosts, ledger, existing)


def _snapshot(state):
    """Everything a hold may change, comparable."""
    return [(gs.host.name, gs.address, gs.owner, tuple(gs.vf_free),
             tuple(sorted(gs.vf_owners.items())), gs.slices,
             tuple((p.partition, p.mem_free,
                    tuple(sorted(p.alloc.allocations.items())))
                   for p in gs.pools))
            for gs in state.gpus]


def _overcommits(state, held, max_slices=MAX_SLICES):
    """Every over-commit of ``state``, recomputed from the ``held``
    decisions."""
    problems = []
    memory: dict[tuple[str, str, int | None], int] = {}
    for d in held:
        for g in d.grants:
            if d.kind is Kind.CU:
                key = (d.host, g.address, g.partition)
                memory[key] = memory.get(key, 0) + g.memory_mib
    for gs in state.gpus:
        if gs.slices > max_slices:
            problems.append('%s: %d slices' % (gs.address, gs.slices))
        count = gs.vf_count or 0
        if set(gs.vf_owners) & set(gs.vf_free) or \
                set(gs.vf_owners) | set(gs.vf_free) != set(range(count)):
            problems.append('%s: VFs %s / %s' % (gs.address, gs.vf_owners,
                                                 gs.vf_free))
        for pool in gs.pools:
            used = memory.get((gs.host.name, gs.address, pool.partition), 0)
            if not 0 <= pool.mem_free == pool.mem_total - used:
                problems.append('%s/%s: %d MiB free of %d, %d held' % (
                    gs.address, pool.partition, pool.mem_free,
                    pool.mem_total, used))
            cus = [c for ids in pool.alloc.allocations.values()
                   for c in ids]
            if len(cus) != len(set(cus)) or len(cus) > pool.alloc.total:
                problems.append('%s/%s: CUs overlap' % (gs.address,
                                                        pool.partition))
    return problems


def _first(kind):
    return next(d for d in _planned()[3] if d.kind is kind)


class TestHold(testtools.TestCase):

    def _refused(self, decision, *texts, existing=()):
        state = _state(existing)
        before = _snapshot(state)
        err = self.assertRaises(exception.PlanError, state.claim, decision)
        for text in (decision.workload,) + texts:
            self.assertIn(text, str(err))
        self.assertEqual(before, _snapshot(state))
        return err

    def test_valid_placements_are_held(self):
        placed = _planned()[3]
        state = _state(placed)
        self.assertEqual([], _overcommits(state, placed))
        self.assertEqual(len(placed), len(state.existing))

    def test_an_unknown_gpu_is_refused(self):
        d = _first(Kind.VF)
        bad = dataclasses.replace(d, workload='intruder', grants=(
            dataclasses.replace(d.grants[0], address='0000:ff:00.0'),))
        self._refused(bad, '0000:ff:00.0', 'no GPU')
        self._refused(dataclasses.replace(bad, host='elsewhere'),
                      'elsewhere')

    def test_a_slice_with_more_memory_than_free_is_refused(self):
        d = _first(Kind.CU)
        grant = d.grants[0]
        bad = dataclasses.replace(d, grants=(dataclasses.replace(
            grant, memory_mib=10 ** 7),))
        self._refused(bad, grant.address, 'MiB free')

    def test_negative_memory_is_refused(self):
        d = _first(Kind.CU)
        bad = dataclasses.replace(d, grants=(dataclasses.replace(
            d.grants[0], memory_mib=-4096),))
        self._refused(bad, d.grants[0].address, 'negative')

    def test_overlapping_slices_are_refused(self):
        d = _first(Kind.CU)
        other = dataclasses.replace(d, workload='neighbour', grants=(
            dataclasses.replace(d.grants[0], memory_mib=0),))
        err = self._refused(other, d.grants[0].address, 'claimed by both',
                            existing=[d])
        self.assertIn(d.workload, str(err))

    def test_cus_outside_the_device_are_refused(self):
        d = _first(Kind.CU)
        bad = dataclasses.replace(d, grants=(dataclasses.replace(
            d.grants[0], cus=parse_cu_ranges('300-400')),))
        self._refused(bad, 'outside')

    def test_the_slice_cap_is_kept(self):
        d = _first(Kind.CU)
        grant = d.grants[0]
        state = _state()
        for i in range(MAX_SLICES):
            state.claim(dataclasses.replace(d, workload='s%d' % i, grants=(
                dataclasses.replace(grant, memory_mib=1,
                                    cus=(2 * i, 2 * i + 1)),)))
        extra = dataclasses.replace(d, workload='one-too-many', grants=(
            dataclasses.replace(grant, memory_mib=1, cus=(100,)),))
        before = _snapshot(state)
        err = self.assertRaises(exception.PlanError, state.claim, extra)
        self.assertIn('one-too-many', str(err))
        self.assertIn('max_slices_per_gpu', str(err))
        self.assertIn(grant.address, str(err))
        self.assertEqual(before, _snapshot(state))

    def test_a_vf_past_the_gpu_or_taken_is_refused(self):
        d = _first(Kind.VF)
        grant = d.grants[0]
        self._refused(dataclasses.replace(d, grants=(dataclasses.replace(
            grant, vf_index=8),)), 'VFs 0..7, not 8')
        self._refused(dataclasses.replace(d, grants=(dataclasses.replace(
            grant, vf_index=None),)), 'not none')
        self._refused(dataclasses.replace(d, workload='again'), 'not free',
                      existing=[d])
        self._refused(dataclasses.replace(d, grants=(dataclasses.replace(
            grant, memory_mib=10 ** 6),)), 'MiB, not')

    def test_a_dedicated_gpu_held_twice_is_refused(self):
        d = _first(Kind.DEDICATED)
        self._refused(dataclasses.replace(d, workload='thief'),
                      'already held by %s' % d.workload, existing=[d])

    def test_a_partial_failure_takes_nothing(self):
        # the first grant is fine, the second is not: neither is held
        d = _first(Kind.VF)
        grant = d.grants[0]
        bad = dataclasses.replace(d, grants=(grant, dataclasses.replace(
            grant, vf_index=99)))
        self._refused(bad, '99')

    def test_no_grants_is_refused(self):
        d = dataclasses.replace(_first(Kind.VF), grants=())
        self._refused(d, 'no grants')


def _mutated(draw, decision, hosts):
    """``decision`` with one grant changed the way a hostile or stale
    state could change it."""
    grants = list(decision.grants)
    i = draw(st.integers(0, len(grants) - 1))
    g = grants[i]
    how = draw(st.sampled_from(['address', 'vf', 'cus', 'memory',
                                'partition', 'duplicate', 'kind', 'host']))
    if how == 'address':
        host = next(h for h in hosts if h.hostname == decision.host)
        addresses = [str(x.address) for x in host.gpus] + ['0000:ee:00.0']
        grants[i] = dataclasses.replace(
            g, address=draw(st.sampled_from(addresses)))
    elif how == 'vf':
        grants[i] = dataclasses.replace(g, vf_index=draw(st.one_of(
            st.none(), st.integers(-2, 10))))
    elif how == 'cus':
        # often on CUs nobody holds, with little memory: one more slice
        first = draw(st.one_of(st.integers(0, 320),
                               st.sampled_from([70, 120, 180, 240])))
        grants[i] = dataclasses.replace(g, memory_mib=draw(st.sampled_from(
            [g.memory_mib, 1])), cus=tuple(range(
                first, first + draw(st.integers(0, 40)))))
    elif how == 'memory':
        # just past what a device, a VF or a GPU has, or anything
        grants[i] = dataclasses.replace(g, memory_mib=draw(st.one_of(
            st.integers(-10 ** 6, 10 ** 6),
            st.sampled_from([8191, 8193, 24575, 24576, 163841, 196609]))))
    elif how == 'partition':
        grants[i] = dataclasses.replace(g, partition=draw(st.one_of(
            st.none(), st.integers(-1, 9))))
    elif how == 'duplicate':
        grants.append(g)
    elif how == 'kind':
        return dataclasses.replace(decision, kind=draw(
            st.sampled_from(list(Kind))), grants=tuple(grants))
    else:
        return dataclasses.replace(decision, host=draw(st.sampled_from(
            [h.hostname for h in hosts])))
    return dataclasses.replace(decision, grants=tuple(grants))


@st.composite
def _holds(draw):
    hosts, _conf, _ledger, placed = _planned()
    result = []
    for n in range(draw(st.integers(1, 14))):
        d = draw(st.sampled_from(placed))
        if draw(st.booleans()):
            d = _mutated(draw, d, hosts)
        if draw(st.booleans()):
            d = dataclasses.replace(d, workload='x%d' % n)
        result.append(d)
    return result


class TestHoldProperties(testtools.TestCase):

    @settings(max_examples=80, deadline=None)
    @given(_holds())
    def test_holds_never_overcommit_and_a_refusal_changes_nothing(
            self, holds):
        # a cap below what the plan put on one GPU: the state exceeds it
        state = _state(max_slices=2)
        held: list[Decision] = []
        for d in holds:
            before = _snapshot(state)
            try:
                state.hold(d, 'placements: %s' % d.workload)
            except exception.PlanError as err:
                self.assertIn(d.workload, str(err))
                self.assertEqual(before, _snapshot(state))
                continue
            held.append(d)
            self.assertEqual([], _overcommits(state, held, 2))


class TestRelease(testtools.TestCase):

    def test_a_gpu_whose_vfs_all_go_back_is_unassigned(self):
        # two VFs of one GPU are two grants: the GPU is empty only after
        # both, and then loses the role the plan gave it
        hosts = [utils.host('gim', 'gim-cpx', gpus=2)]
        conf = utils.conf()
        planner = av_planner.Planner(conf, hosts)
        w = Workload('pair', Platform.VM, gpus=2, memory_mib=20480, cus=38)
        d = planner.place(w)
        self.assertEqual(Kind.VF, d.kind)
        self.assertEqual(1, len(d.gpus))
        gs = planner.gpu_at('gim', d.gpus[0], 'test')
        emptied = planner.release(d)
        self.assertIsNone(gs.role)
        self.assertEqual([gs], [e[0] for e in emptied])
        planner.restore(d, emptied)
        self.assertEqual({0: 'pair', 1: 'pair'}, gs.vf_owners)


class TestStateFile(testtools.TestCase):

    def test_a_crafted_cu_range_is_refused_before_it_is_expanded(self):
        from amdgpu_virt.policy import statefile
        raw = [{'workload': 'w', 'kind': 'cu', 'host': 'bm', 'grants': [
            {'address': '0000:05:00.0', 'memory_mib': 1,
             'cus': '0-99999999999'}]}]
        err = self.assertRaises(exception.PlanError,
                                statefile.placements_from_dict, raw, 's.yaml')
        self.assertIn('placements[0].grants[0]', str(err))
        self.assertIn('outside 0..1023', str(err))
        self.assertEqual((0, 1, 1023), parse_cu_ranges('1023,0-1'))


def _index_problems(planner):
    """Where the planner's indexes disagree with a recomputation from
    the GPUs themselves."""
    from amdgpu_virt.model import Role
    problems = []
    hosts: dict = {}
    for gs in planner.gpus:
        if gs.role is Role.NOVA_VF:
            key = (gs.model.name, gs.vf_count or 0)
            if planner.vf_index[key].where.get(gs, 0) != len(gs.vf_free):
                problems.append('vf_index %s' % gs.address)
            hosts[key + (gs.host.name,)] = hosts.get(
                key + (gs.host.name,), 0) + len(gs.vf_free)
        free = planner.free.free.get((gs.host.name, gs.model.name), [])
        if (gs in free) != (gs.role is None and not gs.fixed):
            problems.append('free index %s (%s)' % (gs.address, gs.role))
        for pool in gs.pools:
            value = 0
            if gs.slices < planner.max_slices:
                value = min(pool.alloc.free_count, planner.mem_as_cus(
                    gs.model, pool.mem_free))
            found = planner.cu_index[gs.model.name]._where.get(pool)
            if (found[0] if found else 0) != value:
                problems.append('cu_index %s/%s' % (gs.address,
                                                    pool.partition))
    for key, index in planner.vf_hosts.items():
        for host, value in index.where.items():
            if hosts.get(key + (host,), 0) != value:
                problems.append('vf_hosts %s %s' % (key, host))
    for model, index in planner.cu_index.items():
        # best fit first: (value, free MiB, least recently changed)
        ranked = [p for _key, p in sorted(
            ((key, p) for p, key in index._where.items()),
            key=lambda item: item[0])]
        if list(index.fitting(1, 0)) != ranked:
            problems.append('cu_index %s order' % model)
        for need, mib in ((1, 10 ** 9), (19, 8192), (10 ** 4, 0)):
            expected = [p for p in ranked if index._where[p][0] > need or (
                index._where[p][0] == need and p.mem_free >= mib)]
            if list(index.fitting(need, mib)) != expected:
                problems.append('cu_index %s fitting(%d, %d)' % (
                    model, need, mib))
        values = [index._where[p][0] for p in ranked]
        if index.largest() != max(values, default=0) or \
                len(index) != len(ranked):
            problems.append('cu_index %s largest' % model)
    for (model, host), room in planner.rooms.items():
        shared = planner.shared_hosts.get(model, {}).get(host, [])
        pools = [p for g in shared if g.slices < planner.max_slices
                 for p in g.pools]
        if room != (max((p.alloc.free_count for p in pools), default=0),
                    max((p.mem_free for p in pools), default=0)):
            problems.append('room %s %s' % (model, host))
    return problems


class TestIndexProperties(testtools.TestCase):

    @settings(max_examples=40, deadline=None)
    @given(props.fleets(), props.workloads())
    def test_indexes_agree_with_a_recomputation(self, hosts, items):
        # placements, the improvement pass's releases and restores, then
        # releases
        planner = av_planner.Planner(_IMPROVE, hosts)
        plan = planner.plan(items)
        self.assertEqual([], _index_problems(planner))
        for d in [d for d in plan.decisions if d.placed][::2]:
            planner.release(d)
            self.assertEqual([], _index_problems(planner))


class TestHostRoom(testtools.TestCase):

    def test_the_room_of_a_host_follows_its_devices(self):
        # single-GPU slices first (higher priority), then a two-GPU slice
        # whose search reads the hosts' rooms; then every release
        hosts = [utils.host('bm%d' % i, 'spx', gpus=2) for i in range(2)]
        items = [Workload('one%d' % i, Platform.POD, Tenancy.TRUSTED,
                          percent=25, memory_mib=16384, priority=9)
                 for i in range(3)]
        items.append(Workload('pair', Platform.POD, Tenancy.TRUSTED, gpus=2,
                              percent=25, memory_mib=16384, priority=1))
        planner = av_planner.Planner(
            utils.conf(max_slices_per_gpu=MAX_SLICES), hosts)
        plan = planner.plan(items)
        self.assertTrue(all(d.placed for d in plan.decisions))
        self.assertTrue(planner.rooms)
        self.assertEqual([], _index_problems(planner))
        for d in plan.decisions:
            planner.release(d)
            self.assertEqual([], _index_problems(planner))

    def test_a_host_without_room_is_passed_over(self):
        # best fit fills one host's GPUs to the slice cap first: the
        # pair goes to the other, and the first host's room says why
        hosts = [utils.host('bm%d' % i, 'spx', gpus=2) for i in range(2)]
        items = [Workload('one%d' % i, Platform.POD, Tenancy.TRUSTED,
                          percent=10, memory_mib=4096, priority=9)
                 for i in range(2 * MAX_SLICES)]
        items.append(Workload('pair', Platform.POD, Tenancy.TRUSTED, gpus=2,
                              percent=10, memory_mib=4096, priority=1))
        planner = av_planner.Planner(
            utils.conf(max_slices_per_gpu=MAX_SLICES), hosts)
        plan = planner.plan(items)
        placed = {d.workload: d.host for d in plan.decisions if d.placed}
        self.assertEqual({'bm0'}, {placed['one%d' % i]
                                   for i in range(2 * MAX_SLICES)})
        self.assertEqual('bm1', placed.get('pair'), plan.decisions)
        self.assertEqual((0, 0), planner.rooms.get(('MI300X', 'bm0')))


class TestNumaTuples(testtools.TestCase):

    def test_crafted_numa_nodes_do_not_grow_the_shared_tuples(self):
        # an inventory is input: GPUs naming thousands of NUMA nodes keep
        # the module's shared (node,) tuples bounded, and each GPU its own
        from amdgpu_virt.policy import state
        base = utils.host('many', 'spx', gpus=1)
        gpu = base.gpus[0]
        hosts = [dataclasses.replace(base, hostname='h%d' % i, gpus=(
            dataclasses.replace(gpu, numa_node=i),))
            for i in range(3 * state._NUMA_ENTRIES)]
        planned = fleetstate.FleetState(utils.conf(), hosts)
        self.assertLessEqual(len(state._NUMA), state._NUMA_ENTRIES)
        self.assertEqual([(i,) for i in range(3 * state._NUMA_ENTRIES)],
                         [gs.numa_nodes for gs in planned.gpus])


class TestCollectorPause(testtools.TestCase):

    def test_the_collector_runs_again_after_a_plan_or_a_refused_fleet(self):
        import gc
        self.assertTrue(gc.isenabled())
        hosts = [utils.host('bm', 'spx', gpus=1)]
        planner = av_planner.Planner(utils.conf(), hosts)
        self.assertTrue(gc.isenabled())
        planner.plan([Workload('w', Platform.POD, Tenancy.TRUSTED,
                               percent=10)])
        self.assertTrue(gc.isenabled())
        self.assertRaises(exception.PlanError, av_planner.Planner,
                          utils.conf(), hosts + hosts)
        self.assertTrue(gc.isenabled())
        gc.disable()
        self.addCleanup(gc.enable)
        av_planner.Planner(utils.conf(), hosts).plan([])
        self.assertFalse(gc.isenabled())


class TestPoolIndex(testtools.TestCase):

    class _Device:
        def __init__(self, name: str, mem_free: int) -> None:
            self.name = name
            self.mem_free = mem_free

        def __repr__(self) -> str:
            return self.name

    def test_best_fit_then_memory_then_least_recently_changed(self):
        from amdgpu_virt.policy import state
        index = state.PoolIndex()
        a, b, c, d = (self._Device(n, 8192) for n in 'abcd')
        for device in (a, b, c, d):
            index.put(device, 38)   # one bucket: in the order put
        self.assertEqual([a, b, c, d], list(index.fitting(38, 8192)))
        a.mem_free = 4096
        index.put(a, 20)            # fuller: first for a small request
        index.put(b, 38)            # unchanged: keeps its place
        c.mem_free = 8192
        index.put(c, 38)
        self.assertEqual([a, b, c, d], list(index.fitting(1, 0)))
        self.assertEqual([b, c, d], list(index.fitting(20, 8192)))
        self.assertEqual([b, c, d], list(index.fitting(21, 0)))
        d.mem_free = 2048
        index.put(d, 38)            # changed: after the others of 38
        self.assertEqual([d, b, c], list(index.fitting(38, 0)))
        self.assertEqual([b, c], list(index.fitting(38, 4096)))
        index.put(b, 0)             # taken out (at the slice cap)
        index.put(c, 0)
        index.put(d, 0)
        self.assertEqual([a], list(index.fitting(1, 0)))
        self.assertEqual((20, 1), (index.largest(), len(index)))
        self.assertEqual([], list(index.fitting(21, 0)))
