"""The list-then-watch loop that feeds the extender's cache."""

from __future__ import annotations

import gc
import json
import threading
import time
from typing import Any

import testtools

from amdgpu_virt.k8s import schedcache
from amdgpu_virt.k8s import watching
from tests.unit.k8s.test_schedcache import gpu_pod


class _FakeResponse:
    def __init__(self, data: bytes = b'', lines: list[dict[str, Any]] = (),
                 hold: threading.Event | None = None) -> None:
        self.data = data
        self.lines = lines
        self.hold = hold

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        for line in self.lines:
            yield json.dumps(line).encode() + b'\n'
        if self.hold is not None:
            self.hold.wait(5)

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        if self.hold is not None:
            self.hold.set()


class WatcherTest(testtools.TestCase):

    def test_list_watch_and_relist_on_gone(self) -> None:
        cache = schedcache.ClusterCache()
        value = 'g0,AMD,10,4:;'
        calls: list[dict[str, Any]] = []
        hold = threading.Event()

        def list_pods(**kwargs: Any) -> _FakeResponse:
            calls.append(kwargs)
            lists = [c for c in calls if not c.get('watch')]
            watches = [c for c in calls if c.get('watch')]
            if not kwargs.get('watch'):
                items = [gpu_pod('a', 'n1', value, rv=3)] \
                    if len(lists) == 1 else []
                return _FakeResponse(json.dumps({
                    'metadata': {'resourceVersion': str(3 + len(lists))},
                    'items': items}).encode())
            if len(watches) == 1:
                return _FakeResponse(lines=[
                    {'type': 'ADDED', 'object': gpu_pod('b', 'n1', value,
                                                        rv=5)},
                    {'type': 'ERROR', 'object': {'code': 410,
                                                 'message': 'too old'}}])
            return _FakeResponse(lines=[
                {'type': 'BOOKMARK', 'object': {'metadata': {
                    'resourceVersion': '9'}}}], hold=hold)

        watcher = watching.Watcher('pods', list_pods, cache.replace_pods,
                                   watching.pod_event(cache),
                                   timeout=5, backoff=0.01).start()
        self.addCleanup(watcher.stop)
        deadline = time.monotonic() + 5
        while watcher.lists < 2 or len([c for c in calls
                                        if c.get('watch')]) < 2:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        watcher.stop()
        watches = [c for c in calls if c.get('watch')]
        self.assertEqual(['4', '5'], [c['resource_version']
                                      for c in watches])
        self.assertTrue(cache.pods_synced.is_set())
        # the second list (after 410) had no pod: the cache agrees
        self.assertEqual(0, cache.pod_count())


class WatchersTest(testtools.TestCase):

    class _Api:
        def list_node(self, **kwargs: Any) -> Any:
            raise AssertionError('not called')

        list_pod_for_all_namespaces = list_node

    def test_no_process_wide_action_unless_asked(self) -> None:
        nodes, pods = watching.watchers(schedcache.ClusterCache(),
                                        self._Api())
        self.assertEqual(('nodes', 'pods'), (nodes.name, pods.name))
        self.assertIsNone(nodes.after_list)
        self.assertIsNone(pods.after_list)
        nodes, pods = watching.watchers(schedcache.ClusterCache(),
                                        self._Api(),
                                        after_list=watching.settle_memory)
        self.assertIs(watching.settle_memory, pods.after_list)

    def test_settle_memory_freezes_what_is_alive(self) -> None:
        self.addCleanup(gc.unfreeze)
        watching.settle_memory()
        self.assertGreater(gc.get_freeze_count(), 0)
