"""The pods waiting for a node, as the extender's pod watch shows them.

``/filter`` decides on the API's pod, not on the request's (see
:mod:`amdgpu_virt.k8s.scheduler.core`). Reading it costs an API round
trip on the path kube-scheduler waits on, once per pod. The pod watch
already delivers every pod: :class:`PendingPods` keeps the ones still to
be placed (not bound, not finished), so that the filter can take the pod
from here.

The watch may be behind. A pod from here is used only with the UID the
request names, and the filter's mirror patch then carries the pod's
``resourceVersion`` as a precondition: when the pod changed since (bound
meanwhile, annotated, deleted and created again), the API server refuses
the patch (``409``) and the filter undoes its booking and decides again
on the pod read from the API. A stale entry costs a retry, never a pod
placed on what it no longer is. A first booking refused because the
record holds the pod already (an earlier booking the watch did not show,
or this filter's own write sent again by the client after its answer was
lost) is taken as an earlier placement by that second decision: removed
when the pod goes to another node or to none.

At most ``known`` pods are kept, the least recently changed going first;
a pod the board does not have is read from the API, as without it.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any

from amdgpu_virt.k8s.api import watch

DONE_PHASES = ('Succeeded', 'Failed')


class PendingPods:
    """Unbound pods by ``namespace/name``, at the newest version seen.

    :param known: pods kept, at most.
    """

    def __init__(self, known: int = 65536) -> None:
        self.known = max(1, known)
        #: key -> (resourceVersion, pod)
        self._pods: collections.OrderedDict[
            str, tuple[int, Mapping[str, Any]]] = collections.OrderedDict()
        self._lock = threading.Lock()
        #: pods served from here (for observability and tests)
        self.hits = 0

    def observe(self, kind: str, obj: Any) -> None:
        """A pod watch event (``ADDED``, ``MODIFIED``, ``DELETED``)."""
        meta = obj.get('metadata') if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping):
            return
        namespace, name = meta.get('namespace'), meta.get('name')
        if not isinstance(namespace, str) or not isinstance(name, str):
            return
        key = '%s/%s' % (namespace, name)
        version = watch.version_of(obj)
        spec = obj.get('spec')
        status = obj.get('status')
        settled = kind == 'DELETED' or version is None or \
            not isinstance(spec, Mapping) or bool(spec.get('nodeName')) or \
            isinstance(status, Mapping) and status.get('phase') in DONE_PHASES
        with self._lock:
            old = self._pods.get(key)
            if old is not None and version is not None and \
                    old[0] > version:
                return
            if settled:
                self._pods.pop(key, None)
                return
            assert version is not None
            self._pods[key] = (version, obj)
            self._pods.move_to_end(key)
            while len(self._pods) > self.known:
                self._pods.popitem(last=False)

    def get(self, namespace: str, name: str, uid: Any
            ) -> tuple[Mapping[str, Any], str] | None:
        """(the pod, its ``resourceVersion``) if it is kept with ``uid``;
        None otherwise (the caller reads the API)."""
        if not isinstance(uid, str) or not uid:
            return None
        with self._lock:
            entry = self._pods.get('%s/%s' % (namespace, name))
            if entry is None or (entry[1].get('metadata') or {}).get(
                    'uid') != uid:
                return None
            self.hits += 1
        return entry[1], str(entry[0])

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)
