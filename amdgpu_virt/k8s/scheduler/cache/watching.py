"""Feeding the extender's cache from the API: list, then watch.

The node and pod :class:`~amdgpu_virt.k8s.api.watch.Watcher` threads
(:func:`watchers`) decode their list pages with the typed decoders of
:mod:`~amdgpu_virt.k8s.scheduler.cache.pages` and apply lists and events
to the :class:`~amdgpu_virt.k8s.scheduler.cache.cluster.ClusterCache`.

Nothing here acts on the whole process: what should happen after a list
(see :func:`settle_memory`) is the caller's explicit choice.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from amdgpu_virt.k8s.api.watch import EventFunc
from amdgpu_virt.k8s.api.watch import Watcher
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
from amdgpu_virt.k8s.scheduler.cache import pages as cachelist

__all__ = ['Watcher', 'node_event', 'pod_event', 'settle_memory',
           'watchers']


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
