"""Decoding the list pages that fill the extender's cache.

A list of a large cluster is hundreds of thousands of pods, and the cache
reads a handful of fields of each: the pod's name, namespace,
resourceVersion, four HAMi annotations, ``spec.nodeName``, the CPU and
memory requests of its containers, overhead and pod-level resources, and
``status.phase``; the node's name, its registration, one capacity and its
allocatable CPU and memory. The
typed decoders here (:mod:`msgspec` structs naming only those fields) read
a page in one pass and build no object for anything else (other
annotations, containers, status, managed fields), and turn each item into
the cache's entry at once, so a list holds entries, not pages of dicts.

They give exactly what the reference decoders of
:mod:`amdgpu_virt.k8s.fit.entry` give on the same objects: every field is
typed as the API serves it (strings, objects), and a page with anything
else (a field of another type, ``null`` where a string belongs, invalid
JSON) is decoded again by the standard decoders and the reference ones,
so a page lists if and only if it did before, with the same entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from amdgpu_virt.k8s.api.watch import Page
from amdgpu_virt.k8s.api.watch import json_page
from amdgpu_virt.k8s.fit import entry as cacheentry
from amdgpu_virt.k8s.fit import host as fithost
from amdgpu_virt.sharing import hami

__all__ = ['Page', 'PodItem', 'json_page', 'node_page', 'pod_page']

#: what a pod list gives per pod: its key, its entry (None: the pod holds
#: no AMD GPU) and what it asks of its node's host (None: finished)
PodItem = tuple[str, cacheentry.PodEntry | None, cacheentry.HostUse | None]


class _Typed(msgspec.Struct, gc=False):
    """The typed decoders' structs: only strings, string maps and other
    such structs, so no reference cycle (the collector need not track
    them, which makes a large list cheaper to build and to free)."""


class _ListMeta(_Typed):
    resourceVersion: str | None = None
    token: str | None = msgspec.field(default=None, name='continue')


# --- pods --------------------------------------------------------------------

class _PodAnnotations(_Typed):
    allocated: str | None = msgspec.field(
        default=None, name=hami.DEVICES_ALLOCATED)
    to_allocate: str | None = msgspec.field(
        default=None, name=hami.DEVICES_TO_ALLOCATE)
    node: str | None = msgspec.field(default=None, name=hami.VGPU_NODE)
    cus: str | None = msgspec.field(default=None, name=hami.CU_ALLOCATED)


class _PodMeta(_Typed):
    name: str = ''
    namespace: str = ''
    resourceVersion: str | None = None
    annotations: _PodAnnotations | None = None


class _Requests(_Typed):
    requests: dict[str, str] | None = None


class _Container(_Typed):
    resources: _Requests | None = None
    restartPolicy: str | None = None


class _PodSpec(_Typed):
    nodeName: str | None = None
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None
    overhead: dict[str, str] | None = None
    resources: _Requests | None = None


class _PodStatus(_Typed):
    phase: str | None = None


class _Pod(_Typed):
    metadata: _PodMeta | None = None
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


class _PodList(_Typed):
    metadata: _ListMeta | None = None
    items: list[_Pod] | None = None


_POD_LIST = msgspec.json.Decoder(_PodList)
_NO_META = _PodMeta()


def _plain(container: _Container) -> dict[str, Any]:
    resources = container.resources
    return {'resources': None if resources is None else
            {'requests': resources.requests},
            'restartPolicy': container.restartPolicy}


def _host(spec: _PodSpec) -> fithost.HostAmount | None:
    """What :func:`fithost.pod_request` gives, from the typed spec."""
    if spec.initContainers or spec.overhead or spec.resources:
        return fithost.pod_request({
            'containers': [_plain(c) for c in spec.containers or ()],
            'initContainers': [_plain(c) for c in spec.initContainers or ()],
            'overhead': spec.overhead, 'resources': None
            if spec.resources is None else
            {'requests': spec.resources.requests}})
    # most pods: containers only, summed
    containers = spec.containers or ()
    if len(containers) > fithost.MAX_CONTAINERS:
        return None
    cpu = memory = 0
    for container in containers:
        resources = container.resources
        asked = resources.requests if resources is not None else None
        if not asked:
            continue
        one = fithost.quantity(asked.get('cpu', 0), 1000)
        two = fithost.quantity(asked.get('memory', 0))
        if one is None or two is None:
            return None
        cpu += one
        memory += two
    return fithost.HostAmount(cpu, memory)


_NO_SPEC = _PodSpec()


def _pod_item(pod: _Pod) -> PodItem:
    """What :func:`cacheentry.decode_pod` and
    :func:`cacheentry.decode_host` give, from the typed pod."""
    meta = pod.metadata or _NO_META
    key = f'{meta.namespace}/{meta.name}'
    done = pod.status is not None and \
        pod.status.phase in cacheentry.DONE_PHASES
    spec = pod.spec or _NO_SPEC
    host: cacheentry.HostUse | None = None if done else \
        (spec.nodeName or '', _host(spec))
    notes = meta.annotations
    if notes is None:
        return key, None, host
    key_name = hami.DEVICES_ALLOCATED
    value = notes.allocated
    if value is None:
        key_name = hami.DEVICES_TO_ALLOCATE
        value = notes.to_allocate
        if value is None:
            return key, None, host
    node = spec.nodeName or notes.node
    if not node or done:
        return key, None, host
    return key, cacheentry.pod_entry(
        key, node, key_name, value, notes.cus,
        cacheentry.rv_of(meta.resourceVersion)), host


def _typed_page(decoder: msgspec.json.Decoder[Any], data: bytes | str
                ) -> Any:
    """The typed page, or None when the reference decoders must read
    it."""
    try:
        return decoder.decode(data)
    except (msgspec.MsgspecError, UnicodeError, RecursionError):
        return None


def _meta(page: Any) -> tuple[str, str]:
    meta = page.metadata
    if meta is None:
        return '', ''
    return meta.resourceVersion or '', meta.token or ''


def pod_page(data: bytes | str) -> Page:
    """A page of a pod list as (key, entry) items."""
    page = _typed_page(_POD_LIST, data)
    if page is None:
        version, token, objs = json_page(data)
        return version, token, [(cacheentry.pod_key(obj),
                                 cacheentry.decode_pod(obj),
                                 cacheentry.decode_host(obj))
                                for obj in objs]
    return (*_meta(page), [_pod_item(pod) for pod in page.items or ()])


# --- nodes -------------------------------------------------------------------

class _NodeAnnotations(_Typed):
    register: str | None = msgspec.field(default=None,
                                          name=hami.NODE_REGISTER)


class _NodeMeta(_Typed):
    name: str = ''
    annotations: _NodeAnnotations | None = None


class _NodeStatus(_Typed):
    capacity: dict[str, str] | None = None
    allocatable: dict[str, str] | None = None


class _Node(_Typed):
    metadata: _NodeMeta | None = None
    status: _NodeStatus | None = None


class _NodeList(_Typed):
    metadata: _ListMeta | None = None
    items: list[_Node] | None = None


_NODE_LIST = msgspec.json.Decoder(_NodeList)
_NO_NODE_META = _NodeMeta()


def _node_entry(node: _Node, resource: str) -> cacheentry.NodeEntry:
    """What :func:`cacheentry.decode_node` gives, from the typed node."""
    meta = node.metadata or _NO_NODE_META
    value = meta.annotations.register if meta.annotations else None
    status = node.status
    allocatable = None if status is None else \
        fithost.node_allocatable({'allocatable': status.allocatable})
    if value is None:
        return cacheentry.NodeEntry(meta.name, (), None, allocatable)
    capacity = None
    if status is not None and status.capacity:
        capacity = status.capacity.get(resource)
    return cacheentry.node_entry(meta.name, value, capacity, resource,
                                 allocatable)


def node_page(resource: str = hami.RESOURCE_GPU
              ) -> Callable[[bytes | str], Page]:
    """A decoder of node list pages into entries (``resource``: the
    capacity that says whether the device plugin serves GPUs)."""
    def decode(data: bytes | str) -> Page:
        page = _typed_page(_NODE_LIST, data)
        if page is None:
            version, token, objs = json_page(data)
            return version, token, [cacheentry.decode_node(obj, resource)
                                    for obj in objs]
        return (*_meta(page), [_node_entry(node, resource)
                               for node in page.items or ()])
    return decode
