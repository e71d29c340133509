"""Property tests: parsers fail only with our errors, codecs round-trip,
allocators never hand out a CU twice."""

from __future__ import annotations

import contextlib
import datetime
import json

import testtools
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import consumes
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant
from hypothesis.stateful import rule
from hypothesis.stateful import run_state_machine_as_test

from amdgpu_virt import exception
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import cumask
from amdgpu_virt.sharing import hami
from amdgpu_virt.sharing import memory

PARSERS = (
    cumask.parse_hsa_cu_mask,
    cumask.parse_global_cu_mask,
    cumask.parse_id_list,
    hami.decode_node_register,
    hami.decode_node_devices_legacy,
    hami.decode_pod_devices,
    hami.decode_node_lock,
    hami.decode_handshake,
    hami.decode_bind_phase,
    hami.decode_unix_time,
    hami.decode_cu_allocated,
)

#: Text close to the grammars, so that the search gets past the first
#: character.
GRAMMAR_TEXT = st.text(alphabet='0123456789,-:;xXfF \t{}[]"TZ+.', max_size=40)
def _json_values():
    keys = st.sampled_from(
        ['id', 'ID', 'index', 'count', 'devmem', 'devcore', 'type', 'numa',
         'mode', 'health', 'devicevendor', 'custominfo', 'gpu-0', 'x'])
    return st.recursive(
        st.none() | st.booleans() | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8),
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(keys | st.just('cuPerWGP'), children,
                          max_size=5),
        max_leaves=12)


def _only_our_errors(value):
    for parse in PARSERS:
        with contextlib.suppress(exception.AmdgpuVirtError):
            parse(value)


class FuzzTest(testtools.TestCase):

    @given(st.text(max_size=60))
    def test_any_text(self, value):
        _only_our_errors(value)

    @given(GRAMMAR_TEXT)
    def test_grammar_like_text(self, value):
        _only_our_errors(value)

    @settings(max_examples=60)
    @given(_json_values())
    def test_any_json(self, data):
        text = json.dumps(data)
        _only_our_errors(text)
        _only_our_errors('[%s]' % text)
        with contextlib.suppress(exception.AmdgpuVirtError):
            devices = hami.decode_node_register('[%s]' % text)
            for device in devices:
                self.assertGreaterEqual(device.cu_unit, 1)
            hami.rebuild_allocators(hami.gpu_shapes(devices), [])


# --- masks -------------------------------------------------------------------

CU_MASKS = st.one_of(
    st.integers(1, (1 << 304) - 1),
    st.sets(st.integers(0, 303), min_size=1, max_size=16).map(
        allocator.mask_of))


@st.composite
def noisy_id_list(draw, mask):
    """An ID list for ``mask`` in any order, ranges split at will, with
    whitespace and maybe a trailing comma: what a person might write."""
    pieces = []
    for start, length in allocator.runs(mask):
        cu = start
        end = start + length
        while cu < end:
            size = draw(st.integers(1, end - cu))
            pieces.append(str(cu) if size == 1 else
                          '%d-%d' % (cu, cu + size - 1))
            cu += size
    pieces = draw(st.permutations(pieces))
    space = st.sampled_from(['', ' ', '\t'])
    text = ','.join(draw(space) + p + draw(space) for p in pieces)
    if draw(st.booleans()):
        text += ','
    return text


@st.composite
def hsa_masks(draw):
    gpus = draw(st.permutations(range(8)))
    cut = sorted(draw(st.sets(st.integers(1, 7), max_size=3)))
    groups = [gpus[a:b] for a, b in zip([0] + cut, cut + [8], strict=True)]
    groups = groups[:draw(st.integers(1, len(groups)))]
    sets = tuple(cumask.CuSet(gpus=tuple(sorted(g)), cus=draw(CU_MASKS),
                              hex=draw(st.booleans())) for g in groups)
    return cumask.HsaCuMask(sets=sets)


@st.composite
def noisy_hsa(draw, mask):
    parts = []
    for cu_set in mask.sets:
        gpus = draw(noisy_id_list(allocator.mask_of(cu_set.gpus)))
        if cu_set.hex:
            digits = '%x' % cu_set.cus
            digits = '0' * draw(st.integers(0, 3)) + digits
            digits = digits.upper() if draw(st.booleans()) else digits
            cus = draw(st.sampled_from(['0x', '0X'])) + digits
        else:
            cus = draw(noisy_id_list(cu_set.cus))
        parts.append('%s : %s' % (gpus, cus))
    text = ' ; '.join(parts)
    return text + draw(st.sampled_from(['', ';', ' ;\n']))


class MaskPropertyTest(testtools.TestCase):

    @given(CU_MASKS)
    def test_id_list_round_trip(self, mask):
        self.assertEqual(mask, cumask.parse_id_list(
            cumask.format_id_list(mask), limit=304))

    @given(CU_MASKS.flatmap(lambda m: st.tuples(st.just(m),
                                                noisy_id_list(m))))
    def test_id_list_canonical(self, case):
        mask, text = case
        self.assertEqual(cumask.format_id_list(mask),
                         cumask.format_id_list(cumask.parse_id_list(text)))

    @settings(max_examples=100)
    @given(hsa_masks().flatmap(lambda m: st.tuples(st.just(m),
                                                   noisy_hsa(m))))
    def test_hsa_encode_parse_is_canonical(self, case):
        mask, text = case
        canonical = mask.encode()
        self.assertEqual(mask, cumask.parse_hsa_cu_mask(canonical, 304, 8))
        self.assertEqual(mask, cumask.parse_hsa_cu_mask(text, 304, 8))
        self.assertEqual(canonical, cumask.canonical_hsa_cu_mask(text))

    @given(GRAMMAR_TEXT)
    def test_hsa_canonical_is_stable(self, text):
        try:
            parsed = cumask.parse_hsa_cu_mask(text)
        except exception.MaskSyntaxError as err:
            self.assertLessEqual(err.kwargs['position'], len(text))
            return
        canonical = parsed.encode()
        self.assertEqual(parsed, cumask.parse_hsa_cu_mask(canonical))
        self.assertEqual(canonical, cumask.canonical_hsa_cu_mask(canonical))

    @given(CU_MASKS)
    def test_global_round_trip(self, mask):
        self.assertEqual(mask, cumask.parse_global_cu_mask(
            cumask.encode_global_cu_mask(mask), 304))


# --- HAMi values -------------------------------------------------------------

PLAIN = st.text(st.characters(blacklist_characters=',:;',
                              blacklist_categories=('Cs', )), max_size=12)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
DEVICES = st.builds(
    hami.DeviceInfo, id=st.text(max_size=12),
    index=st.integers(0, 1 << 40), count=INT32, devmem=INT32, devcore=INT32,
    type=st.text(max_size=12), numa=st.integers(-1, 8),
    mode=st.text(max_size=8), health=st.booleans(),
    devicevendor=st.text(max_size=4),
    custominfo=st.dictionaries(
        st.text(max_size=6),
        st.integers(-1000, 1000) | st.text(max_size=6) | st.booleans()
        | st.none(), max_size=3))
LEGACY_DEVICES = st.builds(
    hami.DeviceInfo, id=PLAIN, index=st.integers(0, 1 << 40), count=INT32,
    devmem=INT32, devcore=INT32, type=PLAIN, numa=st.integers(-1, 8),
    mode=PLAIN, health=st.booleans())
CONTAINER_DEVICES = st.builds(
    hami.ContainerDevice, uuid=PLAIN.filter(bool), type=PLAIN.filter(bool),
    usedmem=st.integers(0, (1 << 31) - 1),
    usedcores=st.integers(0, (1 << 31) - 1))
NAMES = st.from_regex(r'[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?', fullmatch=True)


class HamiPropertyTest(testtools.TestCase):

    @settings(max_examples=100)
    @given(st.lists(DEVICES, max_size=4))
    def test_json_registration_round_trip(self, devices):
        encoded = hami.encode_node_register(devices)
        self.assertEqual(tuple(devices), hami.decode_node_register(encoded))
        self.assertEqual(encoded, hami.encode_node_register(
            hami.decode_node_register(encoded)))

    @settings(max_examples=100)
    @given(st.lists(LEGACY_DEVICES, max_size=4))
    def test_legacy_registration_round_trip(self, devices):
        encoded = hami.encode_node_devices_legacy(devices)
        decoded = hami.decode_node_devices_legacy(encoded or ':')
        self.assertEqual(tuple(devices), decoded)
        self.assertEqual(encoded, hami.encode_node_devices_legacy(decoded))

    @given(st.lists(st.lists(CONTAINER_DEVICES, max_size=3), max_size=4))
    def test_pod_devices_round_trip(self, containers):
        encoded = hami.encode_pod_devices(containers)
        decoded = hami.decode_pod_devices(encoded)
        self.assertEqual(tuple(tuple(c) for c in containers), decoded)
        self.assertEqual(encoded, hami.encode_pod_devices(decoded))

    @settings(max_examples=100)
    @given(st.datetimes(min_value=datetime.datetime(1970, 1, 1),
                        max_value=datetime.datetime(9999, 1, 1)),
           st.integers(-23 * 60 - 59, 23 * 60 + 59), NAMES, NAMES)
    def test_node_lock_round_trip(self, when, offset, namespace, pod):
        zone = datetime.timezone(datetime.timedelta(minutes=offset))
        lock = hami.NodeLock(when.replace(microsecond=0, tzinfo=zone),
                             namespace, pod)
        encoded = lock.encode()
        self.assertEqual(lock, hami.decode_node_lock(encoded))
        self.assertEqual(encoded, hami.decode_node_lock(encoded).encode())

    @given(st.dictionaries(st.text(min_size=1, max_size=10), CU_MASKS,
                           max_size=4))
    def test_cu_allocated_round_trip(self, cus):
        encoded = hami.encode_cu_allocated(cus)
        self.assertEqual(cus, hami.decode_cu_allocated(encoded))
        self.assertEqual(encoded, hami.encode_cu_allocated(
            hami.decode_cu_allocated(encoded)))


# --- allocators --------------------------------------------------------------

OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 9),
                         st.integers(1, 160)), max_size=40)


def _check_disjoint(test, cus):
    seen = 0
    for owner in cus.allocations:
        owned = cus.mask_of(owner)
        test.assertEqual(0, seen & owned, owner)
        seen |= owned
    test.assertEqual(cus.used_count, seen.bit_count())
    test.assertEqual(cus.full_mask & ~cus.free_mask, seen)
    test.assertEqual(allocator.whole_units(cus.free_mask, cus.unit)
                     .bit_count(), cus.usable_count)


class AllocatorPropertyTest(testtools.TestCase):

    @given(OPS, st.sampled_from([(304, 1), (300, 1), (80, 2), (304, 2)]))
    def test_never_overlap_and_all_freed(self, ops, shape):
        total, unit = shape
        pair = [allocator.CuAllocator('g', total, unit=unit,
                                      strategy=strategy())
                for strategy in (allocator.FirstFitStrategy,
                                 allocator.BestFitStrategy)]
        for is_alloc, owner_id, count in ops:
            owner = 'pod-%d' % owner_id
            outcomes = []
            for cus in pair:
                if is_alloc and owner not in cus.allocations:
                    try:
                        got = cus.allocate_mask(owner, count)
                    except exception.InsufficientCapacity:
                        outcomes.append(False)
                        continue
                    self.assertEqual(cus.round_up(count), got.bit_count())
                    self.assertEqual(got, allocator.whole_units(got, unit))
                    outcomes.append(True)
                elif not is_alloc and owner in cus.allocations:
                    cus.release(owner)
                _check_disjoint(self, cus)
            # both strategies refuse only for lack of whole free units
            self.assertEqual(len(set(outcomes)), min(len(outcomes), 1))
        for cus in pair:
            for owner in list(cus.allocations):
                cus.release(owner)
            self.assertEqual(cus.total, cus.free_count)
            self.assertEqual({}, dict(cus.allocations))
            self.assertEqual([(0, cus.total)], cus.free_runs())

    @given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 70000)),
                    max_size=30))
    def test_memory_never_overcommits(self, ops):
        shares = memory.MemoryShares('g', 196608)
        for owner_id, mib in ops:
            owner = 'pod-%d' % owner_id
            if owner in shares.allocations:
                shares.release(owner)
                continue
            try:
                shares.allocate(owner, mib)
            except exception.InsufficientCapacity:
                self.assertGreater(mib, shares.free)
            self.assertEqual(sum(shares.allocations.values()), shares.used)
            self.assertLessEqual(shares.used, shares.capacity)


class AllocatorMachine(RuleBasedStateMachine):
    """An allocator against a plain model: owner -> set of CU ids."""

    owners = Bundle('owners')

    def __init__(self):
        super().__init__()
        self.cus = None
        self.model = {}
        self.counter = 0

    @initialize(shape=st.sampled_from([(304, 1), (64, 2), (38, 1),
                                       (32, 2)]),
                best=st.booleans())
    def start(self, shape, best):
        strategy = allocator.BestFitStrategy() if best else None
        self.cus = allocator.CuAllocator('g', shape[0], unit=shape[1],
                                         strategy=strategy)

    @rule(target=owners, count=st.integers(1, 120))
    def allocate(self, count):
        self.counter += 1
        owner = 'pod-%d' % self.counter
        usable = self.cus.usable_count
        try:
            got = self.cus.allocate(owner, count)
        except exception.InsufficientCapacity:
            assert self.cus.round_up(count) > usable
            return owner
        assert len(got) == self.cus.round_up(count)
        assert not set(got) & set().union(*self.model.values())
        self.model[owner] = set(got)
        return owner

    @rule(target=owners, picks=st.lists(st.integers(0, 63), max_size=6))
    def claim_free(self, picks):
        """Rebuilding from storage may bring CUs that are not whole
        units; the allocator must still account for them."""
        self.counter += 1
        owner = 'stored-%d' % self.counter
        taken = set().union(*self.model.values())
        cus = {c for c in picks if c < self.cus.total} - taken
        self.cus.claim(owner, cus)
        if cus:
            self.model[owner] = cus
        return owner

    @rule(owner=consumes(owners))
    def release(self, owner):
        if owner in self.model:
            assert set(self.cus.release(owner)) == self.model.pop(owner)
        else:
            try:
                self.cus.release(owner)
            except exception.UnknownConsumer:
                return
            raise AssertionError('released an unknown owner')

    @rule(owner=owners, cu=st.integers(0, 303))
    def claim_taken_cu_conflicts(self, owner, cu):
        if owner not in self.model or cu not in self.model[owner]:
            return
        try:
            self.cus.claim('intruder', [cu])
        except exception.AllocationConflict as err:
            assert owner in str(err)
            return
        raise AssertionError('CU %d given twice' % cu)

    @invariant()
    def agrees_with_model(self):
        assert dict(self.cus.allocations) == {
            o: tuple(sorted(c)) for o, c in sorted(self.model.items())}
        used = sum(len(c) for c in self.model.values())
        assert self.cus.free_count == self.cus.total - used
        assert self.cus.usable_count == allocator.whole_units(
            self.cus.free_mask, self.cus.unit).bit_count()


class AllocatorStateTest(testtools.TestCase):

    def test_state_machine(self):
        run_state_machine_as_test(
            AllocatorMachine,
            settings=settings(max_examples=50, stateful_step_count=30))
