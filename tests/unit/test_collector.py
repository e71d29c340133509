"""The collector pause (:func:`amdgpu_virt.collector.paused`) of lists
and plans."""

from __future__ import annotations

import gc
from typing import Any

import testtools

from amdgpu_virt import collector


class PausedTest(testtools.TestCase):

    def test_a_paused_collector_stays_paused(self) -> None:
        gc.disable()
        self.addCleanup(gc.enable)
        with collector.paused():
            self.assertFalse(gc.isenabled())
        self.assertFalse(gc.isenabled())

    def test_what_the_block_made_goes_to_the_oldest_generation(self) -> None:
        if gc.get_freeze_count():
            self.skipTest('objects are frozen in this process')
        self.assertTrue(gc.isenabled())
        with collector.paused():
            made = [[number] for number in range(1000)]
        self.assertEqual(0, gc.get_freeze_count())
        self.assertTrue(gc.isenabled())
        young = {id(obj) for obj in gc.get_objects(generation=0)}
        young.update(id(obj) for obj in gc.get_objects(generation=1))
        self.assertFalse(any(id(obj) in young for obj in made))
        oldest = {id(obj) for obj in gc.get_objects(generation=2)}
        self.assertTrue(all(id(obj) in oldest for obj in made))

    def test_cycles_made_in_the_block_are_still_collected(self) -> None:
        import weakref

        class Node:
            other: Any = None

        with collector.paused():
            first, second = Node(), Node()
            first.other, second.other = second, first
            gone = weakref.ref(first)
            del first, second
        gc.collect()   # a cycle: only the collector frees it (not frozen)
        self.assertIsNone(gone())

    def test_frozen_objects_stay_frozen(self) -> None:
        frozen = [[number] for number in range(10)]
        gc.freeze()
        self.addCleanup(gc.unfreeze)
        count = gc.get_freeze_count()
        self.assertGreater(count, 0)
        with collector.paused():
            made = [[number] for number in range(10)]
        self.assertEqual(count, gc.get_freeze_count())
        self.assertTrue(frozen and made)
