"""The cache's view builder gives what fit.build_view gives.

Seeded nodes with pods of every kind (stored CU ranges, overlapping and
out-of-range ones, pods without ranges, several containers and GPUs, GPUs
the node does not register, whole-GPU pods, over-committed GPUs, RDNA
units, unhealthy GPUs), each built twice so the memoised replays answer
the second time.
"""

from __future__ import annotations

import random

import fixtures
import testtools

from amdgpu_virt.k8s import fit
from amdgpu_virt.k8s.scheduler.cache import views as cacheviews
from amdgpu_virt.sharing import allocator
from amdgpu_virt.sharing import hami


def _devices(rng: random.Random, name: str) -> list[hami.DeviceInfo]:
    devices = []
    for number in range(rng.choice((1, 2, 4, 8))):
        devcore, custom = rng.choice(((304, {}), (96, {}), (96, {
            hami.CUSTOMINFO_CU_PER_WGP: 2})))
        devices.append(hami.DeviceInfo(
            id='%s-GPU%d' % (name, number), index=rng.choice((number, 0)),
            count=rng.choice((1, 4, 10)), devmem=rng.choice((65536, 196608)),
            devcore=devcore, type='AMD', health=rng.random() < 0.9,
            custominfo=custom))
    return devices


def _pods(rng: random.Random, devices: list[hami.DeviceInfo]
          ) -> list[fit.PodUsage]:
    pods: list[fit.PodUsage] = []
    for number in range(rng.randrange(0, 40)):
        containers = []
        masks: dict[str, int] = {}
        for _c in range(rng.choice((1, 1, 1, 2))):
            used = []
            for _d in range(rng.choice((0, 1, 1, 1, 2))):
                device = rng.choice(devices)
                uuid = rng.choice((device.id, device.id.lower(), 'stranger'))
                cores = rng.choice((1, 3, 8, 30, 76, device.devcore,
                                    device.devcore + 5))
                used.append(hami.ContainerDevice(uuid, 'AMD', rng.choice(
                    (0, 1024, 65536)), cores))
                pick = rng.random()
                if pick < 0.25:
                    # at times more CUs than counted, or out of range
                    start = rng.randrange(device.devcore)
                    bits = cores + rng.choice((0, 0, 1, 7))
                    masks[rng.choice((uuid, uuid.upper()))] = \
                        ((1 << bits) - 1) << start
                elif pick < 0.3:
                    masks[uuid] = 0
            containers.append(tuple(used))
        pods.append(('ns/p%02d' % number, tuple(containers),
                     masks or rng.choice((None, {}))))
    return pods


class ViewBuilderTest(testtools.TestCase):

    def test_same_views_as_the_reference(self) -> None:
        self.useFixture(fixtures.FakeLogger())
        for strategy in (allocator.BestFitStrategy(),
                         allocator.FirstFitStrategy()):
            builder = cacheviews.ViewBuilder(strategy)
            rng = random.Random(7)
            nodes = []
            for number in range(150):
                name = 'node-%d' % number
                devices = _devices(rng, name)
                nodes.append((name, devices, _pods(rng, devices),
                              rng.choice((None, None, 'a problem'))))
            problems = 0
            for _round in range(2):
                for name, devices, pods, problem in nodes:
                    expected = fit.build_view(name, devices, pods, strategy,
                                              problem)
                    got = builder.build(name, devices, pods, problem)
                    self.assertEqual(expected, got, name)
                    problems += expected.problem not in (None, 'a problem')
            # the seeds reach the hard cases
            self.assertGreater(problems, 10)
            self.assertTrue(builder._replays)

    def test_memo_is_bounded(self) -> None:
        self.useFixture(fixtures.MonkeyPatch(
            'amdgpu_virt.k8s.scheduler.cache.views.MEMO_ENTRIES', 4))
        builder = cacheviews.ViewBuilder(allocator.BestFitStrategy())
        device = hami.DeviceInfo(id='g', count=10, devmem=1024, devcore=304,
                                 type='AMD', health=True)
        for cores in range(1, 30):
            pods = [('ns/p', ((hami.ContainerDevice('g', 'AMD', 1, cores),),),
                     None)]
            self.assertEqual(
                fit.build_view('n', [device], pods, builder.strategy),
                builder.build('n', [device], pods))
            self.assertLessEqual(len(builder._replays), 4)
            self.assertLessEqual(len(builder._derived), 4)
        # a GPU shared by more pods than MEMO_PODS is replayed, not kept
        self.useFixture(fixtures.MonkeyPatch(
            'amdgpu_virt.k8s.scheduler.cache.views.MEMO_PODS', 3))
        builder = cacheviews.ViewBuilder(allocator.BestFitStrategy())
        pods = [('ns/p%d' % n, ((hami.ContainerDevice('g', 'AMD', 1, 5),),),
                 None) for n in range(4)]
        self.assertEqual(
            fit.build_view('n', [device], pods, builder.strategy),
            builder.build('n', [device], pods))
        self.assertEqual({}, builder._replays)
        builder.build('n', [device], pods[:3])
        self.assertEqual(1, len(builder._replays))
