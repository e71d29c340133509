"""Listing then watching a resource, in a thread of its own.

A :class:`Watcher` thread lists a resource once (``_preload_content=False``:
the JSON is decoded once, here), hands the items to its caller, then
watches from the list's ``resourceVersion`` with bookmarks, renewing the
watch when it times out and listing again on ``410 Gone``. Errors are
logged and retried after a back-off; the thread never dies of one. The
extender's cache (:mod:`amdgpu_virt.k8s.scheduler.cache.watching`) and the
webhook's view of the cluster's GPU shapes
(:mod:`amdgpu_virt.k8s.admission.webhookapi`) are fed this way.

Nothing here acts on the whole process: what should happen after a list
is the caller's explicit choice (``after_list``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from amdgpu_virt import collector

LOG = logging.getLogger(__name__)

ListFunc = Callable[..., Any]
EventFunc = Callable[[str, dict[str, Any]], None]
#: (resourceVersion, continue token, items) of one list page
Page = tuple[str, str, list[Any]]
#: a list page decoder
PageFunc = Callable[[bytes | str], Page]


def version_of(obj: Any) -> int | None:
    """An object's ``metadata.resourceVersion`` as a number, to tell which
    of two sightings of it is newer (None: absent, or not the decimal
    number the API serves)."""
    meta = obj.get('metadata') if isinstance(obj, dict) else None
    value = meta.get('resourceVersion') if isinstance(meta, dict) else None
    if isinstance(value, str) and value.isdecimal() and len(value) <= 18:
        return int(value)
    return None


def loads(data: bytes | str) -> Any:
    """A list page as plain objects: the fast decoder, or the standard one
    for what the fast one refuses (NaN, lone surrogates), so a page lists
    if and only if it did before. Nesting deeper than the decoders go
    raises :class:`RecursionError` (the fast one raises it too: it never
    crashes the process on a crafted page)."""
    try:
        return msgspec.json.decode(data)
    except (msgspec.MsgspecError, UnicodeError):
        return json.loads(data)


def json_page(data: bytes | str) -> Page:
    """A page as plain dicts (the items as the API serves them)."""
    page = loads(data)
    meta = page.get('metadata') or {}
    return (str(meta.get('resourceVersion') or ''),
            str(meta.get('continue') or ''), list(page.get('items') or []))


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
                 decode: PageFunc = json_page) -> None:
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
