"""openstacksdk connections built from the ``[nova]`` options.

openstacksdk is imported when a connection is made (it takes a large
share of a command's start otherwise, see bench/README.rst).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from oslo_config import cfg

from amdgpu_virt import exception

if TYPE_CHECKING:
    import openstack

#: Nova validates flavor extra specs from this microversion on.
COMPUTE_API_VERSION = '2.86'


def connect(conf: cfg.ConfigOpts) -> openstack.connection.Connection:
    """A connection to Placement and Nova.

    ``[nova] cloud`` names a ``clouds.yaml`` entry; otherwise ``token`` with
    ``placement_endpoint`` and/or ``compute_endpoint`` is used (admin token,
    no service catalog).

    :raises ConfigError: neither form is configured.
    """
    import openstack

    group = conf.nova
    if group.cloud:
        try:
            return openstack.connect(cloud=group.cloud,
                                     compute_api_version=COMPUTE_API_VERSION)
        except openstack.exceptions.SDKException as err:
            raise exception.ConfigError(option='[nova] cloud',
                                        reason=str(err)) from None
    endpoint = group.placement_endpoint or group.compute_endpoint
    if not group.token or not endpoint:
        raise exception.ConfigError(
            option='[nova] cloud', reason='set a cloud name, or token with '
            'placement_endpoint and/or compute_endpoint')
    kwargs: dict[str, Any] = dict(auth_type='admin_token',
                                  auth={'endpoint': endpoint,
                                        'token': group.token},
                                  compute_api_version=COMPUTE_API_VERSION,
                                  load_yaml_config=False,
                                  load_envvars=False)
    if group.placement_endpoint:
        kwargs['placement_endpoint_override'] = group.placement_endpoint
    if group.compute_endpoint:
        kwargs['compute_endpoint_override'] = group.compute_endpoint
    return openstack.connect(**kwargs)
