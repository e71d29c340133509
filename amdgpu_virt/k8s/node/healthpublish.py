"""What the node shows about its GPUs' health: a label, a condition, Events.

The agent publishes, for the GPUs it registers:

* the label ``amdgpu-virt.io/gpu-health``: ``healthy`` or ``unhealthy``
  (at least one registered GPU is), for node selectors and ``kubectl get
  nodes -L``;
* the NodeCondition ``AMDGPUUnhealthy`` (through ``nodes/status``, as
  node-problem-detector does for its problem conditions): ``True`` with
  reason ``UnhealthyGPUs`` and a message naming each sick GPU and why, or
  ``False`` with reason ``GPUsHealthy``; its ``lastTransitionTime`` moves
  only when the status flips, and it is written only when status, reason
  or message change;
* a ``Warning`` Event ``GpuUnhealthy`` on the Node when a GPU turns
  unhealthy (or is unhealthy when the agent starts), a ``Normal`` Event
  ``GpuHealthy`` when it recovers. Event names are derived from the node,
  GPU and reason, so publishing one twice is one object.

The functions are pure; :class:`HealthPublisher` keeps what it published
and writes through the agent's node store.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import events

LOG = logging.getLogger(__name__)

LABEL = 'amdgpu-virt.io/gpu-health'
HEALTHY = 'healthy'
UNHEALTHY = 'unhealthy'
CONDITION = 'AMDGPUUnhealthy'
REASON_SICK = 'UnhealthyGPUs'
REASON_WELL = 'GPUsHealthy'
EVENT_SICK = 'GpuUnhealthy'
EVENT_WELL = 'GpuHealthy'
#: the longest condition message (the API server allows 32 KiB)
MAX_MESSAGE = 4096


@dataclasses.dataclass(frozen=True)
class NodeHealth:
    """The registered GPUs of a node and the sick ones, with reasons.

    :ivar sick: (GPU address, reason), sorted by address.
    """

    gpus: tuple[str, ...]
    sick: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return UNHEALTHY if self.sick else HEALTHY

    def message(self) -> str:
        if not self.sick:
            return 'all %d AMD GPUs are healthy' % len(self.gpus)
        text = '; '.join('GPU %s: %s' % (a, r or 'unhealthy')
                         for a, r in self.sick)
        text = '%d of %d AMD GPUs unhealthy: %s' % (len(self.sick),
                                                    len(self.gpus), text)
        return text if len(text) <= MAX_MESSAGE else \
            text[:MAX_MESSAGE - 3] + '...'


def node_health(units: Sequence[Any], healthy: Mapping[str, bool],
                reasons: Mapping[str, str]) -> NodeHealth:
    """Per GPU: sick when any of its units is (the first reason given).

    :param units: the registered units (``uuid``, ``gpu_address``).
    :param healthy: unit uuid -> health.
    :param reasons: unit uuid -> reason.
    """
    gpus: dict[str, str | None] = {}
    for unit in units:
        gpus.setdefault(unit.gpu_address, None)
        if not healthy.get(unit.uuid, True) and gpus[unit.gpu_address] is None:
            gpus[unit.gpu_address] = reasons.get(unit.uuid) or 'unhealthy'
    return NodeHealth(tuple(sorted(gpus)), tuple(sorted(
        (a, r) for a, r in gpus.items() if r is not None)))


def condition(state: NodeHealth, current: Mapping[str, Any] | None,
              now: str) -> dict[str, Any] | None:
    """The condition to write, or None when ``current`` already says it."""
    status = 'True' if state.sick else 'False'
    reason = REASON_SICK if state.sick else REASON_WELL
    message = state.message()
    current = current or {}
    if (current.get('status'), current.get('reason'),
            current.get('message')) == (status, reason, message):
        return None
    since = current.get('lastTransitionTime') \
        if current.get('status') == status else None
    return {'type': CONDITION, 'status': status, 'reason': reason,
            'message': message, 'lastHeartbeatTime': now,
            'lastTransitionTime': since or now}


def current_condition(node: Mapping[str, Any]) -> dict[str, Any] | None:
    for item in (node.get('status') or {}).get('conditions') or ():
        if isinstance(item, dict) and item.get('type') == CONDITION:
            return item
    return None


def event_body(node: Mapping[str, Any], address: str, reason: str,
               sick: bool, now: str) -> dict[str, Any]:
    """The Event of a GPU turning unhealthy (or healthy) on the Node."""
    digest = hashlib.sha256(('%s|%s|%s' % (address, sick, reason))
                            .encode()).hexdigest()[:12]
    message = ('GPU %s is unhealthy: %s; its units are listed Unhealthy '
               'and no new work is placed on it' % (address, reason)
               if sick else 'GPU %s is healthy again' % address)
    return events.node_event(
        node, 'gpu-health.%s' % digest, EVENT_SICK if sick else EVENT_WELL,
        'Warning' if sick else 'Normal', message, events.NODE_AGENT, now)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime(
        '%Y-%m-%dT%H:%M:%SZ')


class HealthPublisher:
    """Publishes a node's GPU health through a node store.

    :param store: the agent's node store (``read``, ``label``,
        ``set_condition``, ``record_event``).
    """

    def __init__(self, store: Any, clock: Callable[[], str] = _now) -> None:
        self.store = store
        self.clock = clock
        #: GPU address -> reason ('' healthy) as last published
        self.seen: dict[str, str] | None = None
        #: Events recorded (for observability and tests)
        self.events = 0

    def publish(self, state: NodeHealth) -> bool:
        """Label, condition and Events for ``state``.

        :returns: True if anything was written.
        :raises KubernetesError: the node cannot be read or written.
        """
        now = self.clock()
        node = self.store.read()
        wrote = False
        labels = (node.get('metadata') or {}).get('labels') or {}
        if labels.get(LABEL) != state.label:
            self.store.label(node, {LABEL: state.label})
            node = self.store.read()
            wrote = True
        wanted = condition(state, current_condition(node), now)
        if wanted is not None:
            self.store.set_condition(node, wanted)
            wrote = True
        self._events(node, state, now)
        return wrote

    def _events(self, node: Mapping[str, Any], state: NodeHealth,
                now: str) -> None:
        sick = dict(state.sick)
        current = {a: sick.get(a, '') for a in state.gpus}
        before = self.seen
        published = dict(current)
        for address, reason in sorted(current.items()):
            was = None if before is None else before.get(address)
            if was == reason or (was is None and not reason):
                continue
            body = event_body(node, address, reason, bool(reason), now)
            try:
                self.store.record_event(body)
                self.events += 1
            except exception.KubernetesConflict:
                pass  # the same Event was recorded before
            except exception.KubernetesError as err:
                LOG.warning('Event %s not recorded: %s', body['reason'], err)
                # try again at the next publication
                if before is not None and was is not None:
                    published[address] = was
                else:
                    published.pop(address, None)
                continue
            if reason:
                LOG.warning('GPU %s is unhealthy: %s', address, reason)
            else:
                LOG.info('GPU %s is healthy again', address)
        self.seen = published
