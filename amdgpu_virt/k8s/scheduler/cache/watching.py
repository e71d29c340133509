"""Feeding the extender's cache from the API: list, then watch.

A :class:`Watcher` thread lists a resource once (``_preload_content=False``:
the JSON is decoded once, here), hands the items to the cache, then
watches from the list's ``resourceVersion`` with bookmarks, renewing the
watch when it times out and listing again on ``410 Gone``. Errors are
logged and retried after a back-off; the thread never dies of one.

Nothing here acts on the whole process: what should happen after a list
(see :func:`settle_memory`) is the caller's explicit choice.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from amdgpu_virt import collector
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import pages as cachelist

LOG = logging.getLogger(__name__)

ListFunc = Callable[..., Any]
EventFunc = Callable[[str, dict[str, Any]], None]


#: a list page decoder (see :mod:`amdgpu_virt.k8s.scheduler.cache.pages`)
PageFunc = Callable[[bytes | str], cachelist.Page]


class Watcher:
    """List once, then watch from the list's version; list again on 410.

    :param name: what is watched (for logs), e.g. ``pods``.
    :param list_func: a ``CoreV1Api`` list method (called with
        ``_preload_content=False``; with ``watch=True`` for the stream).
    :param on_list: called with the listed items (what ``decode`` made of
        them) and the list's version.
    :param on_event: called with (type, object) of each event.
    :param timeout: seconds a watch request lasts before it is renewed.
    :param after_list: called after each list has been applied.
    :param page_size: items per list page (0: one page).
    :param pause_collector: pause the cyclic garbage collector while a
        list is read and applied (see :func:`amdgpu_virt.collector.paused`;
        this acts on the whole process, so only the process's owner asks
        for it).
    :param decode: decodes a page into its version, continue token and
        items (default: the items as dicts).
    """

    #: a list longer than this is refused (a server sending continue
    #: tokens forever)
    max_pages = 100000

    def __init__(self, name: str, list_func: ListFunc,
                 on_list: Callable[[list[Any], int | None], None],
                 on_event: EventFunc,
                 timeout: int = 300, backoff: float = 1.0,
                 after_list: Callable[[], None] | None = None,
                 page_size: int = 500,
                 pause_collector: bool = False,
                 decode: PageFunc = cachelist.json_page) -> None:
        self.name = name
        self.decode = decode
        self.pause_collector = pause_collector
        self.page_size = page_size
        self.list_func = list_func
        self.on_list = on_list
        self.on_event = on_event
        self.timeout = timeout
        self.backoff = backoff
        self.after_list = after_list
        self.stopping = threading.Event()
        #: lists done (1 after start; more after 410 Gone)
        self.lists = 0
        self._response: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name='watch-%s' % self.name)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        response = self._response
        if response is not None:
            try:
                # shutdown() unblocks a read in progress (urllib3 2.3+)
                getattr(response, 'shutdown', response.close)()
            except Exception:  # closing a half-read stream may fail
                LOG.debug('closing the %s watch failed', self.name,
                          exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _list(self) -> str:
        """List every page (``limit``/``continue``), then apply the items
        at once; the watch starts from the first page's version (events
        after it may come again, which the cache takes as updates)."""
        if not self.pause_collector:
            return self._list_pages()
        with collector.paused():
            return self._list_pages()

    def _list_pages(self) -> str:
        items: list[Any] = []
        version: str | None = None
        token = ''
        pages = 0
        while True:
            kwargs: dict[str, Any] = {'_preload_content': False}
            if self.page_size:
                kwargs['limit'] = self.page_size
            if token:
                kwargs['_continue'] = token
            page_version, token, page_items = self.decode(
                self.list_func(**kwargs).data)
            if version is None:
                version = page_version
            items.extend(page_items)
            pages += 1
            if not token or not self.page_size:
                break
            if pages > self.max_pages:
                raise ValueError('the %s list has more than %d pages'
                                 % (self.name, self.max_pages))
        try:
            rv: int | None = int(version)
        except ValueError:
            rv = None
        self.on_list(items, rv)
        self.lists += 1
        if self.after_list is not None:
            self.after_list()
        LOG.info('Listed %d %s in %d page(s) at version %s', len(items),
                 self.name, pages, version)
        return version

    def _run(self) -> None:
        from kubernetes.watch import watch as k8s_watch

        version = ''
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self._list()
                response = self.list_func(
                    watch=True, resource_version=version,
                    timeout_seconds=self.timeout,
                    allow_watch_bookmarks=True, _preload_content=False)
                self._response = response
                try:
                    for line in k8s_watch.iter_resp_lines(response):
                        if self.stopping.is_set():
                            break
                        if not line:
                            continue
                        event = json.loads(line)
                        kind = event.get('type')
                        obj = event.get('object') or {}
                        if kind == 'ERROR':
                            LOG.info('%s watch at %s ended: %s', self.name,
                                     version, obj.get('message'))
                            if obj.get('code') == 410:
                                version = ''
                            break
                        new = (obj.get('metadata') or {}).get(
                            'resourceVersion')
                        if kind != 'BOOKMARK':
                            self.on_event(str(kind), obj)
                        if new:
                            version = str(new)
                finally:
                    self._response = None
                    response.release_conn()
            except Exception as err:  # keep watching whatever happened
                if self.stopping.is_set():
                    return
                LOG.warning('%s watch failed (%s); retrying', self.name, err)
                self.stopping.wait(self.backoff)


def pod_event(cache: schedcache.ClusterCache) -> EventFunc:
    def apply(kind: str, obj: dict[str, Any]) -> None:
        if kind == 'DELETED':
            cache.delete_pod(obj)
        else:
            cache.set_pod(obj)
    return apply


def node_event(cache: schedcache.ClusterCache) -> EventFunc:
    def apply(kind: str, obj: dict[str, Any]) -> None:
        if kind == 'DELETED':
            cache.delete_node(str((obj.get('metadata') or {}).get('name')))
        else:
            cache.set_node(obj)
    return apply


def settle_memory() -> None:
    """Collect garbage, then move every object alive now out of the cyclic
    garbage collector's reach (:func:`gc.freeze`).

    This acts on the whole process, so only the process's owner (the
    extender service) asks for it, by passing it as ``after_list`` to
    :func:`watchers`. After a large list, what was loaded is long-lived;
    without this, the collector's full passes over it pause decisions for
    tens of milliseconds on a large cluster.
    """
    gc.collect()
    gc.freeze()


def watchers(cache: schedcache.ClusterCache, core_api: Any,
             timeout: int = 300,
             after_list: Callable[[], None] | None = None,
             pause_collector: bool = False
             ) -> tuple[Watcher, Watcher]:
    """The node and pod watchers that feed ``cache`` (not started).

    :param after_list: called after each list has been applied (for
        example :func:`settle_memory`); nothing by default.
    :param pause_collector: see :class:`Watcher` (process-wide; off by
        default).
    """
    return (
        Watcher('nodes', core_api.list_node,
                lambda entries, _rv: cache.load_nodes(entries),
                node_event(cache), timeout, after_list=after_list,
                pause_collector=pause_collector,
                decode=cachelist.node_page(cache.resource)),
        Watcher('pods', core_api.list_pod_for_all_namespaces,
                cache.load_pods, pod_event(cache), timeout,
                after_list=after_list, pause_collector=pause_collector,
                decode=cachelist.pod_page))
