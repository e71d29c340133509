"""What the node watch last showed of each node's lock.

:class:`~amdgpu_virt.k8s.record.nodelock.NodeLocker` reads a node before it
takes the lock, and reads it again and again while another pod holds it.
With a :class:`LockBoard` fed by the node watch (and by the locker's own
reads and writes), the read is served from the board, and a wait for a
held lock ends as soon as the watch shows the node changed, instead of on
the next poll.

The board is never the truth. The lock is taken by a merge patch that
carries the ``resourceVersion`` the decision was made on: when the board
was behind, the API server refuses the patch (``409 Conflict``) and the
locker reads the node from the API before it decides again. A board that
shows a lock still held after its release only delays the waiter until
the watch catches up (or its poll interval ends). A stale board costs a
retry, never a second holder.

Only the two annotations the locker reads are kept (HAMi's lock and
:data:`~amdgpu_virt.k8s.record.nodelock.LOCK_UID`), for at most ``known``
nodes, the least recently changed going first. A ``resourceVersion``
that is not an integer is not kept (the locker then reads the API, as
without a board).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any

from amdgpu_virt.k8s.api import watch
from amdgpu_virt.k8s.record.nodelock import LOCK_UID
from amdgpu_virt.sharing import hami


class LockBoard:
    """The lock annotations of each node at the newest version seen.

    :param known: nodes kept, at most.
    """

    def __init__(self, known: int = 65536) -> None:
        self.known = max(1, known)
        #: node -> (resourceVersion, lock annotations)
        self._nodes: collections.OrderedDict[
            str, tuple[int, dict[str, str]]] = collections.OrderedDict()
        self._changed = threading.Condition()
        #: node reads the board answered (for observability and tests)
        self.hits = 0

    def observe(self, obj: Any) -> None:
        """A node as the watch or an API answer showed it; kept if it is
        newer than what the board has."""
        meta = obj.get('metadata') if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping):
            return
        name, version = meta.get('name'), watch.version_of(obj)
        if not isinstance(name, str) or version is None:
            return
        annotations = meta.get('annotations')
        if not isinstance(annotations, Mapping):
            annotations = {}
        kept = {key: str(annotations[key]) for key in (hami.NODE_LOCK,
                                                      LOCK_UID)
                if isinstance(annotations.get(key), str)}
        with self._changed:
            old = self._nodes.get(name)
            if old is not None and old[0] >= version:
                return
            self._nodes[name] = (version, kept)
            self._nodes.move_to_end(name)
            while len(self._nodes) > self.known:
                self._nodes.popitem(last=False)
            self._changed.notify_all()

    def forget(self, name: str) -> None:
        """The node was deleted (or its entry is known to be wrong)."""
        with self._changed:
            if self._nodes.pop(name, None) is not None:
                self._changed.notify_all()

    def node(self, name: str) -> dict[str, Any] | None:
        """The node as the locker reads it (name, ``resourceVersion``,
        the lock annotations), or None when the board has not seen it."""
        with self._changed:
            entry = self._nodes.get(name)
            if entry is None:
                return None
            self.hits += 1
            version, annotations = entry
        return {'metadata': {'name': name, 'resourceVersion': str(version),
                             'annotations': dict(annotations)}}

    def wait(self, name: str, version: Any, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a version of the node newer
        than ``version``; :returns: whether one came."""
        try:
            seen = int(version)
        except (TypeError, ValueError):
            seen = -1

        def newer() -> bool:
            entry = self._nodes.get(name)
            return entry is not None and entry[0] > seen

        with self._changed:
            return self._changed.wait_for(newer, max(0.0, timeout))
