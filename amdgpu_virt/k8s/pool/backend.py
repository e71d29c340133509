"""The Kubernetes backend (stevedore ``amdgpu_virt.backends``, name
``kubernetes``).

The counterpart of the Nova backend for what a GPU role change asks of a
side (see :mod:`amdgpu_virt.pool.move`): whether Kubernetes offers a GPU
of a host (the node's ``hami.io/node-amd-register`` lists a healthy device
whose ``custominfo.pciBDF`` is the GPU's PCI address; every compute
partition of the GPU shares it) and who uses it (the one answer of
:mod:`amdgpu_virt.k8s.pool.consumers`: bound pods, pods the extender chose but
did not bind yet, and allocated claims). It only reads the API; offering
and withdrawing are the node agent's job.
"""

from __future__ import annotations

import json
from typing import Any

from oslo_config import cfg

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client
from amdgpu_virt.k8s.pool import claims as dra_holders
from amdgpu_virt.k8s.pool import consumers
from amdgpu_virt.k8s.scheduler.cache import cluster as schedcache
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
            self._api = k8s_client.core_api(self.conf)
        return self._api

    def _node(self, host: str) -> dict[str, Any] | None:
        try:
            response = k8s_client.call('GET node %s' % host,
                                       self.api.read_node, host,
                                       _preload_content=False)
        except exception.KubernetesNotFound:   # a missing node offers nothing
            return None
        node: dict[str, Any] = json.loads(response.data)
        return node

    def devices(self, host: str) -> tuple[hami.DeviceInfo, ...]:
        """The usable AMD devices the node registers (none when the node
        or its registration is missing or unreadable).

        :raises KubernetesError: the node cannot be read (other than 404).
        """
        node = self._node(host)
        if node is None:
            return ()
        return schedcache.decode_node(
            node, self.conf.kubernetes.resource_name).devices

    def _uuids(self, host: str, address: PciAddress) -> set[str]:
        return {device.id.lower() for device in self.devices(host)
                if consumers.gpu_address(device) == address}

    def consumers(self, host: str, address: PciAddress) -> tuple[str, ...]:
        """The live pods (and claims) holding the GPU, described.

        A pod naming a device the node no longer registers (the GPU was
        withdrawn, or the registration is unreadable) may be on this GPU:
        it counts as a consumer (fail closed).
        """
        return dra_holders.consumer_view(
            self.api, self.conf.dra.driver_name).of_gpu(
            host, address, self._node(host),
            self.conf.kubernetes.resource_name)

    def is_offered(self, host: str, address: PciAddress) -> bool:
        """The node registers a healthy device of the GPU."""
        return any(device.health for device in self.devices(host)
                   if consumers.gpu_address(device) == address)

    def is_withdrawn(self, host: str, address: PciAddress) -> bool:
        return not self._uuids(host, address)
