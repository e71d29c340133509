"""The DeviceClasses of the driver (resource.k8s.io/v1): pure.

``<driver>`` selects whole GPUs, ``partition.<driver>`` compute
partitions and ``share.<driver>`` CU/memory shares, by the ``type``
attribute every device carries. The whole-GPU class may map an extended
resource (``extendedResourceName``), so that a pod asking for e.g.
``amd.com/gpu: 1`` in ``resources`` is served through DRA.
"""

from __future__ import annotations

from typing import Any

from amdgpu_virt.k8s.dra.devices import DeviceType

API_VERSION = 'resource.k8s.io/v1'


def class_name(driver: str, device_type: DeviceType) -> str:
    if device_type is DeviceType.GPU:
        return driver
    return '%s.%s' % (device_type.value, driver)


def selector(driver: str, device_type: DeviceType) -> str:
    """The CEL selector of the class for ``device_type``."""
    return ('device.driver == "%s" && has(device.attributes["%s"].type) '
            '&& device.attributes["%s"].type == "%s"' % (
                driver, driver, driver, device_type.value))


def device_class(driver: str, device_type: DeviceType,
                 extended_resource_name: str = '') -> dict[str, Any]:
    spec: dict[str, Any] = {
        'selectors': [{'cel': {'expression': selector(driver,
                                                      device_type)}}]}
    if extended_resource_name and device_type is DeviceType.GPU:
        spec['extendedResourceName'] = extended_resource_name
    return {'apiVersion': API_VERSION, 'kind': 'DeviceClass',
            'metadata': {'name': class_name(driver, device_type),
                         'labels': {'app.kubernetes.io/managed-by':
                                    'amdgpu-virt'}},
            'spec': spec}


def device_classes(driver: str, extended_resource_name: str = ''
                   ) -> list[dict[str, Any]]:
    """The three classes: whole GPU, partition, share."""
    return [device_class(driver, t, extended_resource_name)
            for t in (DeviceType.GPU, DeviceType.PARTITION,
                      DeviceType.SHARE)]
