"""Building ``kubernetes`` API clients from the ``[kubernetes]`` options."""

from __future__ import annotations

import os
from typing import Any

from kubernetes import client
from kubernetes import config as k8s_config

from amdgpu_virt import exception


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from ``kubeconfig``, or the in-cluster account.

    :raises ConfigError: naming ``[kubernetes] kubeconfig``.
    """
    try:
        if kubeconfig:
            configuration = client.Configuration()
            k8s_config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration)
        else:
            configuration = client.Configuration()
            k8s_config.load_incluster_config(
                client_configuration=configuration)
    except (k8s_config.ConfigException, OSError) as err:
        raise exception.ConfigError(
            option='[kubernetes] kubeconfig',
            reason='%s: %s' % (kubeconfig or '(in-cluster)', err)) from None
    return client.ApiClient(configuration)


def core_api(conf: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(conf.kubernetes.kubeconfig))


def node_name(conf: Any) -> str:
    """``[kubernetes] node_name``, else the NODE_NAME environment variable.

    :raises ConfigError: neither is set.
    """
    name = conf.kubernetes.node_name or os.environ.get('NODE_NAME')
    if not name:
        raise exception.ConfigError(
            option='[kubernetes] node_name',
            reason='not set, and the NODE_NAME environment variable is '
            'empty (set it from the downward API: spec.nodeName)')
    return name
