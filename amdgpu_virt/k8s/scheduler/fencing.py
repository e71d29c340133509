"""Fencing the extender on the kube-scheduler leader lease.

kube-scheduler elects a leader through a ``coordination.k8s.io`` Lease
(``leaderElection.resourceName``/``resourceNamespace``); its holder
identity is ``<hostname>_<uuid>``, the hostname being the pod's name. An
extender answers only while the kube-scheduler of its own pod holds a
lease that has not expired: a stuck old leader's extender stops booking
as soon as its lease runs out. This is the second line: the allocation
record's ``resourceVersion`` preconditions already keep two writers from
booking the same CUs.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import client as k8s_client

LOG = logging.getLogger(__name__)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def holds(spec: Any, identity: str, now: datetime.datetime) -> str | None:
    """Why a Lease ``spec`` is not held by ``identity`` now, or None.

    ``identity`` matches a holder equal to it or starting with it and
    ``_`` (kube-scheduler's form).
    """
    if not isinstance(spec, dict):
        return 'the lease has no spec'
    holder = spec.get('holderIdentity')
    if not isinstance(holder, str) or not holder:
        return 'the lease has no holder'
    if holder != identity and not holder.startswith(identity + '_'):
        return 'the lease is held by %r, not %r' % (holder[:100], identity)
    renewed = spec.get('renewTime') or spec.get('acquireTime')
    duration = spec.get('leaseDurationSeconds')
    if not isinstance(renewed, str) or not isinstance(duration, int) or \
            isinstance(duration, bool):
        return 'the lease has no renewTime or leaseDurationSeconds'
    try:
        when = datetime.datetime.fromisoformat(renewed)
    except ValueError:
        return 'the lease renewTime %r is not a time' % renewed[:40]
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    if when + datetime.timedelta(seconds=duration) < now:
        return 'the lease expired at %s' % (
            when + datetime.timedelta(seconds=duration)).isoformat()
    return None


class LeaseFence:
    """Checks, at most every ``ttl`` seconds, that ``identity`` leads.

    :param coordination_api: a ``CoordinationV1Api``.
    :param namespace: the lease's namespace.
    :param name: the lease's name.
    :param identity: kube-scheduler's identity (the pod's hostname).
    :param ttl: seconds a positive answer is reused.
    """

    def __init__(self, coordination_api: Any, namespace: str, name: str,
                 identity: str, ttl: float = 1.0,
                 clock: Callable[[], datetime.datetime] = _utcnow) -> None:
        self.api = coordination_api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._good_until = 0.0

    @property
    def lease(self) -> str:
        return '%s/%s' % (self.namespace, self.name)

    def check(self) -> None:
        """:raises NotLeader: naming the lease and why."""
        with self._lock:
            if time.monotonic() < self._good_until:
                return
        try:
            response = k8s_client.call('GET lease %s' % self.lease,
                                       self.api.read_namespaced_lease,
                                       self.name, self.namespace,
                                       _preload_content=False)
            spec = json.loads(response.data).get('spec')
        except exception.KubernetesError as err:
            raise exception.NotLeader(reason=str(err),
                                      lease=self.lease) from None
        except (ValueError, AttributeError):
            raise exception.NotLeader(reason='the lease is not JSON',
                                      lease=self.lease) from None
        why = holds(spec, self.identity, self.clock())
        if why is not None:
            with self._lock:
                self._good_until = 0.0
            raise exception.NotLeader(reason=why, lease=self.lease)
        with self._lock:
            self._good_until = time.monotonic() + self.ttl
