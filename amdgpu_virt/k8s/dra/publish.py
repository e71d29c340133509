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
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s import client as k8s_client
from amdgpu_virt.k8s.dra import slices as dra_slices

LOG = logging.getLogger(__name__)

#: field -> the feature gate that keeps it
_GATED = (('sharedCounters', 'DRAPartitionableDevices'),
          ('consumesCounters', 'DRAPartitionableDevices'),
          ('allowMultipleAllocations', 'DRAConsumableCapacity'),
          ('requestPolicy', 'DRAConsumableCapacity'))


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


class Publisher:
    """Publishes one node's slices with a ``ResourceV1Api``."""

    def __init__(self, resource_api: Any, node: str, driver: str) -> None:
        self.api = resource_api
        self.node = node
        self.driver = driver
        #: slices written in the last publish that wrote something
        self.writes = 0

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
        """
        current = self.existing()
        wanted = dra_slices.build(plan, self.driver, 1, memory_step_mib)
        if sorted(_comparable(s) for s in current) == sorted(
                _comparable(s) for s in wanted):
            LOG.debug('ResourceSlices of node %s are up to date', self.node)
            self.writes = 0
            return False
        generation = 1 + max((s['spec']['pool'].get('generation', 0)
                              for s in current), default=0)
        wanted = dra_slices.build(plan, self.driver, generation,
                                  memory_step_mib)
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
                 '%d devices)', len(wanted), self.node, generation,
                 len(plan.devices))
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
