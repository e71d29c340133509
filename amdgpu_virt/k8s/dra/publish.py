"""Writing the node's ResourceSlices through the API, idempotently.

The plugin owns the slices of its driver whose ``spec.nodeName`` is its
node. :func:`publish` compares what the API holds with what the node
offers now: when nothing changed it writes nothing; otherwise every slice
is written with a generation one above the highest seen (so consumers
drop the old ones), and slices no longer needed are deleted afterwards.

An API server whose feature gates are off drops the fields it does not
know (``consumesCounters``, ``sharedCounters``,
``allowMultipleAllocations``, ``capacity.requestPolicy``) on write. A
partition without its counters, or a share without
``allowMultipleAllocations``, would be handed out wrongly, so the stored
slices are read back, and when a field is missing every slice of the node
is withdrawn and the error names the feature gate.

Kubernetes 1.34 and 1.35 want the shared counters in different places
(:class:`~amdgpu_virt.k8s.dra.slices.Layout`). With ``[dra] slice_layout
= auto`` the layout follows the API server's ``/version``, read before
every publish, so that a control plane upgraded (or downgraded) under a
running plugin gets the other layout on the next publish. A layout change
deletes the node's slices first and then writes the new ones with a
higher generation: slices of the old layout are never left beside the new
ones, which the new server would refuse or misread.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.dra import slices as dra_slices

LOG = logging.getLogger(__name__)

#: field -> the feature gate that keeps it
_GATED = (('sharedCounters', 'DRAPartitionableDevices'),
          ('consumesCounters', 'DRAPartitionableDevices'),
          ('allowMultipleAllocations', 'DRAConsumableCapacity'),
          ('requestPolicy', 'DRAConsumableCapacity'))


#: ``minor`` of a managed control plane, e.g. ``34+``; a ``gitVersion``
#: such as ``v1.35.1-gke.1200``
_MINOR = re.compile(r'^([0-9]{1,4})\+?$')
_GIT_VERSION = re.compile(r'^v?([0-9]{1,4})\.([0-9]{1,4})(\.|-|\+|$)')
VERSION_PATH = '/version'


def parse_version(body: Any) -> tuple[int, int]:
    """``(major, minor)`` of an API server's ``/version`` answer.

    :raises KubernetesError: naming ``/version`` and what it said.
    """
    if isinstance(body, Mapping):
        major = body.get('major')
        minor = body.get('minor')
        if isinstance(major, str) and major.isdigit() and len(major) < 5 \
                and isinstance(minor, str) and _MINOR.match(minor):
            match = _MINOR.match(minor)
            assert match is not None
            return int(major), int(match.group(1))
        git = body.get('gitVersion')
        match = _GIT_VERSION.match(git) if isinstance(git, str) else None
        if match:
            return int(match.group(1)), int(match.group(2))
    raise exception.KubernetesError(
        request='GET %s' % VERSION_PATH,
        reason='no major and minor version in the answer: %.200r' % (body,))


def version_reader(api_client: Any) -> Callable[[], tuple[int, int]]:
    """A function that reads the API server's version through the real
    client's ``VersionApi``."""
    from kubernetes import client as k8s

    api = k8s.VersionApi(api_client)

    def read() -> tuple[int, int]:
        what = 'GET %s' % VERSION_PATH
        return parse_version(k8s_client.json_body(what, k8s_client.call(
            what, api.get_code, _preload_content=False,
            _request_timeout=30)))

    return read


def _comparable(obj: dict[str, Any]) -> tuple[str, str]:
    spec = copy.deepcopy(obj.get('spec') or {})
    (spec.get('pool') or {}).pop('generation', None)
    return (obj['metadata']['name'], json.dumps(spec, sort_keys=True))


def _fields(obj: Any, found: set[str]) -> set[str]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.add(key)
            _fields(value, found)
    elif isinstance(obj, list):
        for value in obj:
            _fields(value, found)
    return found


def _generation(obj: Mapping[str, Any]) -> int:
    value = ((obj.get('spec') or {}).get('pool') or {}).get('generation')
    return value if isinstance(value, int) and value >= 0 else 0


class Publisher:
    """Publishes one node's slices with a ``ResourceV1Api``.

    :param layout: ``auto``, ``mixed`` or ``separate`` (``[dra]
        slice_layout``).
    :param version: reads the API server's ``(major, minor)``; needed by
        ``auto`` (without it, ``auto`` means ``separate``).
    """

    def __init__(self, resource_api: Any, node: str, driver: str,
                 layout: str = 'auto',
                 version: Callable[[], tuple[int, int]] | None = None
                 ) -> None:
        self.api = resource_api
        self.node = node
        self.driver = driver
        self.layout_option = layout
        self.version = version
        #: slices written in the last publish that wrote something
        self.writes = 0
        #: the layout of the last publish
        self.layout: dra_slices.Layout | None = None

    def current_layout(self) -> dra_slices.Layout:
        """The layout to write now.

        :raises KubernetesError: ``/version`` gave no usable answer.
        """
        if self.layout_option != 'auto':
            return dra_slices.Layout(self.layout_option)
        if self.version is None:
            return dra_slices.Layout.SEPARATE
        return dra_slices.layout_for(self.version())

    def existing(self) -> list[dict[str, Any]]:
        """The driver's slices of this node, as the API holds them."""
        selector = 'spec.nodeName=%s,spec.driver=%s' % (self.node,
                                                        self.driver)
        what = 'list resourceslices %s' % selector
        body = k8s_client.json_body(what, k8s_client.call(
            what, self.api.list_resource_slice, field_selector=selector,
            _preload_content=False))
        items = body.get('items') or []
        # a server that ignores the selector must not make us touch
        # another node's or driver's slices
        return [s for s in items
                if (s.get('spec') or {}).get('nodeName') == self.node
                and (s.get('spec') or {}).get('driver') == self.driver]

    def publish(self, plan: Any, memory_step_mib: int = 256) -> bool:
        """Make the API hold exactly the slices of ``plan``.

        :returns: True if anything was written.
        :raises KubernetesError: the API refused a write (a 409 when
            another writer changed a slice: the next publish retries).
        :raises KubernetesUnavailable: the API could not be reached.
        :raises DraPluginError: the API server dropped gated fields (the
            node's slices are withdrawn first).
        :raises InventoryError: a GPU does not fit the layout's limits.
        """
        layout = self.current_layout()
        current = self.existing()
        wanted = dra_slices.build(plan, self.driver, 1, memory_step_mib,
                                  layout)
        self.layout = layout
        if sorted(_comparable(s) for s in current) == sorted(
                _comparable(s) for s in wanted):
            LOG.debug('ResourceSlices of node %s are up to date', self.node)
            self.writes = 0
            return False
        generation = 1 + max((_generation(s) for s in current), default=0)
        wanted = dra_slices.build(plan, self.driver, generation,
                                  memory_step_mib, layout)
        stored_layout = dra_slices.layout_of(current)
        if stored_layout not in (None, layout):
            LOG.warning('ResourceSlices of node %s are in the %s layout, the '
                        'API server needs %s: deleting the %d old slices '
                        'before writing new ones', self.node,
                        stored_layout.value, layout.value, len(current))
            self.delete(current)
            current = []
        by_name = {s['metadata']['name']: s for s in current}
        stored = []
        for obj in wanted:
            name = obj['metadata']['name']
            what = 'write resourceslice %s' % name
            if name in by_name:
                body = copy.deepcopy(obj)
                body['metadata']['resourceVersion'] = by_name[name][
                    'metadata'].get('resourceVersion')
                response = k8s_client.call(
                    what, self.api.replace_resource_slice, name, body,
                    _preload_content=False)
            else:
                response = k8s_client.call(
                    what, self.api.create_resource_slice, obj,
                    _preload_content=False)
            stored.append(k8s_client.json_body(what, response))
        wanted_names = {s['metadata']['name'] for s in wanted}
        self.delete(s for s in current
                    if s['metadata']['name'] not in wanted_names)
        self.writes = len(wanted)
        self.check_kept(wanted, stored)
        LOG.info('Published %d ResourceSlices of node %s (generation %d, '
                 '%d devices, %s layout)', len(wanted), self.node,
                 generation, len(plan.devices), layout.value)
        return True

    def check_kept(self, wanted: Sequence[dict[str, Any]],
                   stored: Sequence[dict[str, Any]]) -> None:
        for want, got in zip(wanted, stored, strict=True):
            missing = _fields(want, set()) - _fields(got, set())
            for field, gate in _GATED:
                if field in missing:
                    self.withdraw()
                    raise exception.DraPluginError(
                        driver=self.driver,
                        reason='the API server dropped %s from '
                        'ResourceSlice %s: enable the %s feature gate '
                        '(on by default from Kubernetes 1.36) or set '
                        '[dra] partition_devices = false and give no GPU '
                        'the k8s-shared role; the node\'s slices were '
                        'withdrawn' % (field, want['metadata']['name'],
                                       gate))

    def delete(self, objs: Any) -> None:
        for obj in objs:
            name = obj['metadata']['name']
            try:
                k8s_client.call('delete resourceslice %s' % name,
                                self.api.delete_resource_slice, name)
            except exception.KubernetesNotFound:
                continue

    def withdraw(self) -> None:
        """Delete every slice of this node and driver."""
        self.delete(self.existing())
