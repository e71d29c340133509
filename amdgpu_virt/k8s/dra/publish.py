"""Writing the node's ResourceSlices through the API, idempotently.

The plugin owns the slices of its driver whose ``spec.nodeName`` is its
node. :meth:`Publisher.publish` compares what the API holds with what the
node offers now, by value (quantities parsed: the API server returns
``24Gi`` for ``24576Mi``, and ``1.500`` as sent): when nothing changed it
writes nothing; otherwise every slice is written with a generation one
above the highest seen (so consumers drop the old ones), and slices no
longer needed are deleted afterwards.

What the node offers depends on what the API server keeps
(:mod:`~amdgpu_virt.k8s.dra.served`): an API server whose feature gates
are off drops ``consumesCounters``, ``sharedCounters``,
``allowMultipleAllocations`` and ``capacity.requestPolicy`` silently. The
publisher learns it before publishing: it checks that the server serves
ResourceSlices in ``resource.k8s.io/v1`` (discovery) and creates a probe
slice with every gated field as a server-side dry-run (nothing is
stored; what comes back says which fields the server keeps). It asks
again every ``probe_interval`` seconds, when the server's version
changes, and before every write (only a create tells: an update keeps
the fields the old slice used, even with their gate off). The answer of
every write is read: when a field was dropped after all (a gate turned
off between the probe and the write), the publisher forgets what the
field was for and writes the node's slices at once without it. So what
still works (whole GPUs, always) is never withdrawn, and a partition is
never published without the counters that keep it apart from its whole
GPU.

Kubernetes 1.34 and 1.35 want the shared counters in different places
(:class:`~amdgpu_virt.k8s.dra.served.Layout`). With ``[dra] slice_layout
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
import time
from collections.abc import Callable, Mapping
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.api import quantity
from amdgpu_virt.k8s.dra import devices as dra_devices
from amdgpu_virt.k8s.dra import served as dra_served
from amdgpu_virt.k8s.dra import slices as dra_slices

LOG = logging.getLogger(__name__)

#: what a plan is made from: what the API server keeps
PlanMaker = Callable[[dra_served.Served], dra_devices.DevicePlan]
DRY_RUN = 'All'

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


def _value(text: Any) -> Any:
    try:
        return str(quantity.value(text))
    except exception.InvalidQuantity:
        return text


def _pruned(obj: Any) -> Any:
    """``obj`` without empty maps and lists (the server omits them)."""
    if isinstance(obj, dict):
        kept = {k: _pruned(v) for k, v in obj.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [], None)}
    if isinstance(obj, list):
        return [_pruned(v) for v in obj]
    return obj


def offer(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(name, spec) of a slice as it is compared: quantities by value,
    the pool generation left out."""
    spec = copy.deepcopy(obj.get('spec') or {})
    if isinstance(spec.get('pool'), dict):
        spec['pool'].pop('generation', None)
    spec = quantity.map_fields({'spec': spec}, quantity.SLICE_PATHS,
                               _value)['spec']
    return (str((obj.get('metadata') or {}).get('name')),
            json.dumps(_pruned(spec), sort_keys=True))


def _generation(obj: Mapping[str, Any]) -> int:
    value = ((obj.get('spec') or {}).get('pool') or {}).get('generation')
    return value if isinstance(value, int) and value >= 0 else 0


class _Dropped(Exception):
    """The API server dropped the fields of ``gates`` from ``name``."""

    def __init__(self, gates: set[str], name: str) -> None:
        super().__init__(name)
        self.gates = gates
        self.name = name


class Publisher:
    """Publishes one node's slices with a ``ResourceV1Api``.

    :param layout: ``auto``, ``mixed`` or ``separate`` (``[dra]
        slice_layout``).
    :param version: reads the API server's ``(major, minor)``; needed by
        ``auto`` (without it, ``auto`` means ``separate``), and tells a
        control plane upgrade.
    :param probe_interval: seconds after which the server is probed
        again (``[dra] probe_interval``); 0: only when needed.
    :param clock: monotonic seconds.
    """

    def __init__(self, resource_api: Any, node: str, driver: str,
                 layout: str = 'auto',
                 version: Callable[[], tuple[int, int]] | None = None,
                 probe_interval: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = resource_api
        self.node = node
        self.driver = driver
        self.layout_option = layout
        self.version = version
        self.probe_interval = probe_interval
        self.clock = clock
        #: slices written in the last publish that wrote something
        self.writes = 0
        #: the layout of the last publish
        self.layout: dra_served.Layout | None = None
        #: what the API server keeps, as last learnt (None: not yet)
        self.served: dra_served.Served | None = None
        #: the plan of the last publish
        self.plan: dra_devices.DevicePlan | None = None
        #: probes sent so far
        self.probes = 0
        self._learnt: tuple[tuple[int, int] | None, float] | None = None

    # what the server keeps ---------------------------------------------------
    def current_layout(self, version: tuple[int, int] | None = None
                       ) -> dra_served.Layout:
        """The layout to write now.

        :raises KubernetesError: ``/version`` gave no usable answer.
        """
        if self.layout_option != 'auto':
            return dra_served.Layout(self.layout_option)
        if version is None and self.version is not None:
            version = self.version()
        if version is None:
            return dra_served.Layout.SEPARATE
        return dra_served.layout_for(version)

    def forget(self) -> None:
        """Probe the server again before the next publish."""
        self._learnt = None

    def learn(self, force: bool = False) -> dra_served.Served:
        """What the API server keeps: learnt again when due or ``force``.

        :raises KubernetesError: ``/version`` gave no usable answer, or the
            server does not serve ``resource.k8s.io/v1`` ResourceSlices.
        :raises KubernetesUnavailable: the API could not be reached.
        """
        forced = self.layout_option != 'auto'
        version = None if forced or self.version is None else self.version()
        layout = self.current_layout(version)
        learnt = self._learnt
        if (force or self.served is None or learnt is None
                or learnt[0] != version or self.served.layout is not layout
                or (self.probe_interval and
                    self.clock() - learnt[1] >= self.probe_interval)):
            self.served = self.probe(version, layout)
            self._learnt = (version, self.clock())
        return self.served

    def probe(self, version: tuple[int, int] | None,
              layout: dra_served.Layout) -> dra_served.Served:
        """Ask the server which gated fields it keeps (a dry-run create).

        A refused dry-run (an admission webhook without dry-run support,
        or a slice the release does not take) gives the defaults of the
        server's release, or nothing gated when the release is unknown.
        """
        self.check_served()
        self.probes += 1
        body = dra_served.probe_slice(self.node, self.driver, layout,
                                      self.driver)
        what = 'dry-run create of a probe resourceslice'
        try:
            answer = k8s_client.json_body(what, k8s_client.call(
                what, self.api.create_resource_slice, body,
                dry_run=DRY_RUN, _preload_content=False,
                _request_timeout=30))
        except exception.KubernetesUnavailable:
            raise
        except exception.KubernetesError as err:
            fallback = dra_served.Served(False, False, layout) \
                if version is None else dra_served.for_release(
                    version, layout=layout)
            LOG.warning('The API server refused a dry-run ResourceSlice '
                        '(%s); publishing what Kubernetes %s keeps by '
                        'default: %s', err, '%d.%d' % version if version
                        else '(release unknown)', fallback.describe())
            return fallback
        found = dra_served.kept(answer, layout)
        if found != self.served:
            LOG.info('The API server of node %s keeps %s', self.node,
                     found.describe())
        return found

    def check_served(self) -> None:
        """Discovery: ResourceSlices are served in ``resource.k8s.io/v1``.

        :raises KubernetesError: they are not.
        """
        what = 'GET /apis/%s' % dra_slices.API_VERSION
        try:
            body = k8s_client.json_body(what, k8s_client.call(
                what, self.api.get_api_resources, _preload_content=False,
                _request_timeout=30))
        except exception.KubernetesNotFound:
            body = {}
        names = {r.get('name') for r in body.get('resources') or []
                 if isinstance(r, Mapping)}
        if 'resourceslices' not in names:
            raise exception.KubernetesError(
                request=what, reason='the API server does not serve '
                'ResourceSlices in %s (Kubernetes 1.34 or later has them)'
                % dra_slices.API_VERSION)

    # the node's slices -------------------------------------------------------
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

    def publish(self, make_plan: PlanMaker, memory_step_mib: int = 256
                ) -> bool:
        """Make the API hold exactly the slices of the plan ``make_plan``
        gives for what the server keeps (:attr:`plan` is that plan).

        :returns: True if anything was written.
        :raises KubernetesError: the API refused a write (a 409 when
            another writer changed a slice: the next publish retries).
        :raises KubernetesUnavailable: the API could not be reached.
        :raises DraPluginError: the API server dropped gated fields even
            from slices written without what it was found to drop.
        :raises InventoryError: a GPU does not fit the layout's limits.
        """
        probes = self.probes
        served = self.learn()
        plan = make_plan(served)
        current = self.existing()
        if not self._changed(current, plan, served, memory_step_mib):
            return self._done(plan, False)
        if self.probes == probes:
            # about to write: on what the server keeps now
            fresh = self.learn(force=True)
            if fresh != served:
                served, plan = fresh, make_plan(fresh)
                if not self._changed(current, plan, served,
                                     memory_step_mib):
                    return self._done(plan, False)
        try:
            self._write(plan, served, memory_step_mib, current)
        except _Dropped as err:
            served = dra_served.without(served, err.gates)
            LOG.warning('The API server dropped the fields of %s from '
                        'ResourceSlice %s: writing the slices of node %s '
                        'again without them', ', '.join(sorted(err.gates)),
                        err.name, self.node)
            self.served = served
            plan = make_plan(served)
            try:
                self._write(plan, served, memory_step_mib, self.existing())
            except _Dropped as again:
                raise exception.DraPluginError(
                    driver=self.driver, reason='the API server dropped the '
                    'fields of %s from ResourceSlice %s, which was written '
                    'without them' % (', '.join(sorted(again.gates)),
                                      again.name)) from None
        return self._done(plan, True)

    def _done(self, plan: dra_devices.DevicePlan, changed: bool) -> bool:
        if self.plan is None or self.plan.withheld != plan.withheld:
            for held in plan.withheld:
                LOG.warning('Node %s: %s', self.node, held)
        self.plan = plan
        if not changed:
            LOG.debug('ResourceSlices of node %s are up to date', self.node)
            self.writes = 0
        return changed

    def _changed(self, current: list[dict[str, Any]],
                 plan: dra_devices.DevicePlan, served: dra_served.Served,
                 memory_step_mib: int) -> bool:
        self.layout = served.layout
        wanted = dra_slices.build(plan, self.driver, 1, memory_step_mib,
                                  served.layout)
        return sorted(offer(s) for s in current) != sorted(
            offer(s) for s in wanted)

    def _write(self, plan: dra_devices.DevicePlan,
               served: dra_served.Served, memory_step_mib: int,
               current: list[dict[str, Any]]) -> None:
        layout = served.layout
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
        dropped: _Dropped | None = None
        for obj in wanted:
            stored = self._send(obj, by_name)
            gates = dra_served.dropped(obj, stored)
            if gates and dropped is None:
                dropped = _Dropped(gates, obj['metadata']['name'])
        wanted_names = {s['metadata']['name'] for s in wanted}
        self.delete(s for s in current
                    if s['metadata']['name'] not in wanted_names)
        self.writes = len(wanted)
        LOG.info('Published %d ResourceSlices of node %s (generation %d, '
                 '%d devices, %s layout)', len(wanted), self.node,
                 generation, len(plan.devices), layout.value)
        if dropped is not None:
            raise dropped

    def _send(self, obj: dict[str, Any], by_name: Mapping[str, Any]
              ) -> dict[str, Any]:
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
        stored: dict[str, Any] = k8s_client.json_body(what, response)
        return stored

    def delete(self, objs: Any) -> None:
        for obj in objs:
            name = obj['metadata']['name']
            try:
                k8s_client.call('delete resourceslice %s' % name,
                                self.api.delete_resource_slice, name)
            except exception.KubernetesNotFound:
                continue

