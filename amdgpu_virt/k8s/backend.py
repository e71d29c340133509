"""The Kubernetes backend (stevedore ``amdgpu_virt.backends``, name
``kubernetes``).

The counterpart of the Nova backend for what a GPU role change asks of a
side (see :mod:`amdgpu_virt.pool.move`): whether Kubernetes offers a GPU
of a host (the node's ``hami.io/node-amd-register`` lists a healthy device
whose ``custominfo.pciBDF`` is the GPU's PCI address; every compute
partition of the GPU shares it) and which pods use it (live pods of the
node, bound or only chosen by the extender, whose
``hami.io/amd-devices-allocated`` names one of those devices). It only
reads the API; offering and withdrawing are the node agent's job.
"""

from __future__ import annotations

import json
from typing import Any

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt.k8s import pods
from amdgpu_virt.k8s import schedcache
from amdgpu_virt.model import PciAddress
from amdgpu_virt.sharing import hami


class KubernetesBackend:
    """Kubernetes (HAMi protocol) for amdgpu_virt.

    :param conf: configuration with the ``[kubernetes]`` options.
    :param core_api: a ``CoreV1Api``; made from ``[kubernetes]
        kubeconfig`` on first use when not given.
    """

    name = 'kubernetes'

    def __init__(self, conf: cfg.ConfigOpts, core_api: Any = None) -> None:
        self.conf = conf
        self._api = core_api

    @property
    def api(self) -> Any:
        if self._api is None:
            from amdgpu_virt.k8s import client as k8s_client
            self._api = k8s_client.core_api(self.conf)
        return self._api

    def devices(self, host: str) -> tuple[hami.DeviceInfo, ...]:
        """The usable AMD devices the node registers (none when the node
        or its registration is missing or unreadable).

        :raises KubernetesError: the node cannot be read (other than 404).
        """
        try:
            response = pods.call('GET node %s' % host,
                                       self.api.read_node, host,
                                       _preload_content=False)
        except exception.KubernetesNotFound:   # a missing node offers nothing
            return ()
        entry = schedcache.decode_node(json.loads(response.data),
                                       self.conf.kubernetes.resource_name)
        return entry.devices

    def _uuids(self, host: str, address: PciAddress) -> set[str]:
        return {device.id.lower() for device in self.devices(host)
                if device.custominfo.get(hami.CUSTOMINFO_PCI_BDF) ==
                str(address)}

    def consumers(self, host: str, address: PciAddress) -> tuple[str, ...]:
        """``namespace/name`` of the live pods holding the GPU.

        A pod naming a device the node no longer registers (the GPU was
        withdrawn, or the registration is unreadable) may be on this GPU:
        it counts as a consumer (fail closed).
        """
        registered = self.devices(host)
        known = {device.id.lower() for device in registered}
        uuids = {device.id.lower() for device in registered
                 if device.custominfo.get(hami.CUSTOMINFO_PCI_BDF) ==
                 str(address)}
        found: dict[str, Any] = {}
        for selector in ({'field_selector': 'spec.nodeName=%s' % host},
                         {'label_selector': '%s=%s' % (hami.VGPU_NODE,
                                                       host)}):
            response = pods.call(
                'LIST pods of node %s' % host,
                self.api.list_pod_for_all_namespaces,
                _preload_content=False, **selector)
            for obj in json.loads(response.data).get('items') or []:
                found[schedcache.pod_key(obj)] = obj
        users = set()
        for key, obj in found.items():
            entry = schedcache.decode_pod(obj)
            if entry is None or entry.node != host:
                continue
            if entry.problem:   # unreadable: assume it uses the GPU
                users.add(key)
                continue
            if any(device.uuid.lower() in uuids or
                   device.uuid.lower() not in known
                   for container in entry.devices for device in container):
                users.add(key)
        return tuple(sorted(users))

    def is_offered(self, host: str, address: PciAddress) -> bool:
        """The node registers a healthy device of the GPU."""
        return any(device.health for device in self.devices(host)
                   if device.custominfo.get(hami.CUSTOMINFO_PCI_BDF) ==
                   str(address))

    def is_withdrawn(self, host: str, address: PciAddress) -> bool:
        return not self._uuids(host, address)
