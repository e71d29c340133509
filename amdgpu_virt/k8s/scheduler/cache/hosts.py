"""The hosts beside the GPUs, as the extender's cache counts them.

What every node offers pods (``status.allocatable``) and what every live
pod asks of the node it is on, whatever its scheduler: pods the extender
never sees at its filter (daemons, services, batch jobs without GPUs) take
the CPU and memory that GPU pods need beside their GPUs. A pod counts on
the node it is bound to, or, for a pod the extender placed and that is not
bound yet, on the node of its placement (its reservation or mirror), with
the request the placement carries.

One entry per live pod (its node and request, a few integers) and one sum
per node: memory bounded by what the cluster holds, each change O(1). A
pod or node whose amounts cannot be read makes its node's free amount
unknown (None) while it lasts: the extender then leaves that host out,
and kube-scheduler's own check of the node stands.

Not locked: the cache holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Iterable

from amdgpu_virt.k8s.fit import host as fithost


class HostLedger:
    """Allocatable and requested CPU and memory per node."""

    def __init__(self) -> None:
        #: node -> allocatable (None: not reported or unreadable)
        self._allocatable: dict[str, fithost.HostAmount | None] = {}
        #: pod key -> (node it is bound to, request) as the API shows it
        self._pods: dict[str, tuple[str, fithost.HostAmount | None]] = {}
        #: pod key -> (node, request, whether the request the API shows
        #: counts instead) of the extender's own placement
        self._placed: dict[str, tuple[str, fithost.HostAmount | None,
                                      bool]] = {}
        #: pod key -> (node, request) it is counted with
        self._counted: dict[str, tuple[str, fithost.HostAmount | None]] = {}
        #: node -> requests counted there, and pods whose request is
        #: unreadable
        self._used: dict[str, fithost.HostAmount] = {}
        self._unreadable: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._counted)

    # -- nodes -------------------------------------------------------------

    def set_allocatable(self, node: str,
                        amount: fithost.HostAmount | None) -> None:
        self._allocatable[node] = amount

    def drop_node(self, node: str) -> None:
        self._allocatable.pop(node, None)

    def load_nodes(self, amounts: Iterable[tuple[str,
                                                 fithost.HostAmount | None]]
                   ) -> None:
        self._allocatable = dict(amounts)

    def free(self, node: str) -> fithost.HostAmount | None:
        """What the node's host has left for pods (may be negative when
        over-committed), or None when unknown."""
        allocatable = self._allocatable.get(node)
        if allocatable is None or self._unreadable.get(node):
            return None
        used = self._used.get(node)
        return allocatable if used is None else allocatable - used

    # -- pods --------------------------------------------------------------

    def set_pod(self, key: str, use: tuple[str, fithost.HostAmount | None]
                | None) -> None:
        """The pod as the API shows it (None: gone or finished)."""
        if use is None:
            self._pods.pop(key, None)
        else:
            self._pods[key] = use
        self._recount(key)

    def place(self, key: str, node: str | None,
              amount: fithost.HostAmount | None = None,
              shown: bool = False) -> None:
        """The extender's own placement of the pod (None: none).

        :param amount: its request.
        :param shown: count the request the API shows (when it shows the
            pod) rather than ``amount``.
        """
        if node is None:
            if self._placed.pop(key, None) is None:
                return
        else:
            self._placed[key] = (node, amount, shown)
        self._recount(key)

    def load_pods(self, uses: Iterable[tuple[str, tuple[
            str, fithost.HostAmount | None]]],
            placed: Iterable[tuple[str, str, fithost.HostAmount | None,
                                   bool]] = ()) -> None:
        """A fresh list: every pod the API shows, and the extender's own
        placements (key, node, request, whether the API's request counts,
        as :meth:`place` takes them)."""
        self._pods = dict(uses)
        self._placed = {key: (node, amount, shown)
                        for key, node, amount, shown in placed}
        self._counted.clear()
        self._used.clear()
        self._unreadable.clear()
        for key in self._pods.keys() | self._placed.keys():
            self._recount(key)

    def _recount(self, key: str) -> None:
        old = self._counted.pop(key, None)
        if old is not None:
            self._count(old, -1)
        shown = self._pods.get(key)
        placed = self._placed.get(key)
        new = None
        if placed is not None:
            node, amount, from_api = placed
            new = (node, shown[1] if from_api and shown is not None
                   else amount)
        elif shown is not None and shown[0]:
            new = shown
        if new is not None:
            self._counted[key] = new
            self._count(new, 1)

    def _count(self, use: tuple[str, fithost.HostAmount | None],
               sign: int) -> None:
        node, amount = use
        if amount is None:
            left = self._unreadable.get(node, 0) + sign
            if left:
                self._unreadable[node] = left
            else:
                del self._unreadable[node]
            return
        used = self._used.get(node, fithost.NOTHING)
        used = used + amount if sign > 0 else used - amount
        if used == fithost.NOTHING:
            self._used.pop(node, None)
        else:
            self._used[node] = used
