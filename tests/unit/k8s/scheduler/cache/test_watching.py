"""The list-then-watch loop that feeds the extender's cache."""

from __future__ import annotations

import gc
import json
import threading
import time
from typing import Any

import testtools

from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import watching
from tests.unit.k8s.scheduler.cache.test_cluster import gpu_pod


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


class PagedListTest(testtools.TestCase):

    def test_every_page_is_read_and_applied_at_once(self) -> None:
        pods = [gpu_pod('p%d' % n, 'n1', 'g0,AMD,10,4:;', rv=n + 1)
                for n in range(5)]
        calls: list[dict[str, Any]] = []

        def list_pods(**kwargs: Any) -> Any:
            calls.append(kwargs)
            start = int(kwargs.get('_continue') or 0)
            page = pods[start:start + kwargs['limit']]
            meta: dict[str, Any] = {'resourceVersion': str(10 + start)}
            if start + kwargs['limit'] < len(pods):
                meta['continue'] = str(start + kwargs['limit'])

            class Response:
                data = json.dumps({'metadata': meta,
                                   'items': page}).encode()
            return Response()

        applied: list[tuple[int, int | None]] = []
        watcher = watching.Watcher(
            'pods', list_pods, lambda items, rv: applied.append(
                (len(items), rv)), lambda kind, obj: None, page_size=2)
        self.assertEqual('10', watcher._list())
        self.assertEqual([2, 2, 2], [c['limit'] for c in calls])
        self.assertEqual([None, '2', '4'],
                         [c.get('_continue') for c in calls])
        # one application, at the first page's version
        self.assertEqual([(5, 10)], applied)

    def test_endless_continue_tokens_are_refused(self) -> None:
        def endless(**kwargs: Any) -> Any:
            class Response:
                data = json.dumps({'metadata': {
                    'resourceVersion': '1', 'continue': 'more'},
                    'items': []}).encode()
            return Response()

        watcher = watching.Watcher('pods', endless, lambda i, rv: None,
                                   lambda kind, obj: None, page_size=1)
        watcher.max_pages = 3
        self.assertRaisesRegex(ValueError, 'more than 3 pages',
                               watcher._list)

    def test_pages_the_fast_decoder_refuses_read_as_before(self) -> None:
        # NaN and lone surrogates are JSON the standard decoder reads and
        # the fast one refuses; integers past 64 bits the fast one reads
        # as floats: a page holding them lists as before, and a page that
        # is not JSON still fails the list
        pod = gpu_pod('p0', 'n1', 'g0,AMD,10,4:;', rv=1)
        for extra in (b'{"big": 123456789012345678901234567890}',
                      b'{"nan": NaN}', b'{"s": "\\ud800"}'):
            data = b'{"metadata": {"resourceVersion": "7"}, "x": %s, ' \
                b'"items": [%s]}' % (extra, json.dumps(pod).encode())

            class Response:
                pass
            response = Response()
            response.data = data  # type: ignore[attr-defined]
            applied: list[list[dict[str, Any]]] = []
            watcher = watching.Watcher(
                'pods', lambda response=response, **kw: response,
                lambda items, rv, applied=applied: applied.append(items),
                lambda kind, obj: None)
            self.assertEqual('7', watcher._list(), extra)
            self.assertEqual([[pod]], applied)
        response = Response()
        response.data = b'{"items": [}'  # type: ignore[attr-defined]
        watcher = watching.Watcher('pods', lambda **kw: response,
                                   lambda items, rv: None,
                                   lambda kind, obj: None)
        self.assertRaises(ValueError, watcher._list)


class CollectorPauseTest(testtools.TestCase):

    def _watcher(self, seen: list[bool], **kwargs: Any) -> Any:
        class Response:
            data = b'{"metadata": {"resourceVersion": "3"}, "items": []}'
        return watching.Watcher(
            'pods', lambda **kw: Response(),
            lambda items, rv: seen.append(gc.isenabled()),
            lambda kind, obj: None, **kwargs)

    def test_paused_only_when_asked_and_resumed(self) -> None:
        self.assertTrue(gc.isenabled())
        seen: list[bool] = []
        self._watcher(seen)._list()
        self._watcher(seen, pause_collector=True)._list()
        self.assertEqual([True, False], seen)
        self.assertTrue(gc.isenabled())
        nodes, pods = watching.watchers(
            schedcache.ClusterCache(), WatchersTest._Api(),
            pause_collector=True)
        self.assertTrue(nodes.pause_collector and pods.pause_collector)

    def test_resumed_after_a_failed_list(self) -> None:
        def broken(**kwargs: Any) -> Any:
            raise OSError('connection reset')

        watcher = watching.Watcher('pods', broken, lambda items, rv: None,
                                   lambda kind, obj: None,
                                   pause_collector=True)
        self.assertRaises(OSError, watcher._list)
        self.assertTrue(gc.isenabled())
