"""Which of a node's GPUs the role ledger gives to Kubernetes.

With ``[kubernetes] ledger_source`` set, the node agent and the device
plugin offer only the GPUs whose role in the ledger is ``k8s-shared`` or
``k8s-dedicated`` on their node. The ledger is read from the ledger
ConfigMap (``[pool] configmap_namespace`` / ``configmap_name``) or from a
file (``[kubernetes] ledger_file``) each time :meth:`NodeRoles.refresh`
runs.

A ledger that cannot be read (missing, malformed, API unreachable) is
logged with its culprit and the last good one is kept. Until a first good
ledger has been read, no GPU is offered: with a ledger source configured,
a GPU is offered only when a ledger said it may be (fail closed).
"""

from __future__ import annotations

import abc
import logging
import os
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import ledger as av_ledger
from amdgpu_virt.k8s.record import ledgermap
from amdgpu_virt.model import PciAddress

LOG = logging.getLogger(__name__)

SOURCES = ('none', 'configmap', 'file')


class LedgerSource(abc.ABC):
    """Where the role ledger is read from."""

    @abc.abstractmethod
    def read(self) -> av_ledger.Ledger | None:
        """The ledger as it is now.

        :returns: the ledger; None when there is none (no ConfigMap, no
            file).
        :raises AmdgpuVirtError: it cannot be read or is invalid (naming
            the ConfigMap or file and the field).
        """

    @abc.abstractmethod
    def __str__(self) -> str:
        """The source, for log messages."""


class ConfigMapSource(LedgerSource):
    """The ledger ConfigMap, read through a ``CoreV1Api``."""

    def __init__(self, core_api: Any, where: ledgermap.Location) -> None:
        self.api = core_api
        self.where = where

    def read(self) -> av_ledger.Ledger | None:
        return ledgermap.read(self.api, self.where)

    def __str__(self) -> str:
        return str(self.where)


class FileSource(LedgerSource):
    """A ledger file (e.g. the ConfigMap mounted as a volume)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> av_ledger.Ledger | None:
        if not os.path.exists(self.path):
            return None
        return av_ledger.load(self.path)

    def __str__(self) -> str:
        return 'ledger file %s' % self.path


def _address(text: str) -> PciAddress | None:
    try:
        return PciAddress.parse(text)
    except exception.InvalidPciAddress:
        return None


class NodeRoles:
    """The node's GPUs that Kubernetes may offer, by the last good ledger.

    :param source: where the ledger is read.
    :param host: the node name (the ledger's host name).
    :param max_age: :meth:`current` reads the ledger again when the last
        read is older than this many seconds.
    :param clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, source: LedgerSource, host: str,
                 max_age: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.host = host
        self.max_age = max_age
        self.clock = clock
        #: GPUs of the last good ledger; None until one was read
        self.allowed: frozenset[PciAddress] | None = None
        #: failed reads in a row (0 after a good one)
        self.failures = 0
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def refresh(self) -> frozenset[PciAddress]:
        """Read the ledger now; keep the last good one when it fails.

        Never raises: a failure is logged with its culprit.

        :returns: the GPU addresses that may be offered (empty before a
            first good ledger).
        """
        with self._lock:
            self._read_at = self.clock()
            try:
                ledger = self.source.read()
            except Exception as err:  # any failure keeps the last good one
                self._failed('%s is unusable: %s' % (self.source, err))
                return self.allowed or frozenset()
            if ledger is None:
                self._failed('%s does not exist' % self.source)
                return self.allowed or frozenset()
            allowed = frozenset(
                a for a in (_address(t) for t in ledgermap.k8s_gpus(
                    ledger, self.host)) if a is not None)
            if allowed != self.allowed:
                LOG.info('%s gives node %s the GPUs %s', self.source,
                         self.host, ', '.join(sorted(str(a) for a in allowed))
                         or '(none)')
            self.allowed = allowed
            self.failures = 0
            return allowed

    def _failed(self, reason: str) -> None:
        self.failures += 1
        if self.allowed is None:
            LOG.warning('%s; no ledger read yet, so node %s offers no GPU',
                        reason, self.host)
        else:
            LOG.warning('%s; node %s keeps the last good ledger (GPUs %s)',
                        reason, self.host, ', '.join(
                            sorted(str(a) for a in self.allowed)) or
                        '(none)')

    def current(self) -> frozenset[PciAddress]:
        """:meth:`refresh` when the last read is older than ``max_age``,
        else the GPUs of the last good ledger."""
        read_at = self._read_at
        if read_at is None or self.clock() - read_at >= self.max_age:
            return self.refresh()
        return self.allowed or frozenset()

    def offers(self, gpu_address: str,
               allowed: Iterable[PciAddress] | None = None) -> bool:
        """Whether the GPU ``gpu_address`` may be offered.

        :param allowed: the result of :meth:`refresh` or :meth:`current`;
            default: the last good ledger, without reading.
        """
        if allowed is None:
            allowed = self.allowed or frozenset()
        address = _address(gpu_address)
        return address is not None and address in set(allowed)


def from_conf(conf: Any, host: str | None = None,
              core_api: Any = None) -> NodeRoles | None:
    """The node's roles as ``[kubernetes] ledger_source`` says.

    :param host: the node name; default: ``[kubernetes] node_name`` (or
        the NODE_NAME environment variable).
    :param core_api: for ``configmap``; default: built from ``[kubernetes]
        kubeconfig``.
    :returns: None for ``none`` (every amdgpu-driven GPU is offered).
    :raises ConfigError: naming the option at fault.
    """
    group = conf.kubernetes
    kind = group.ledger_source
    if kind == 'none':
        return None
    if host is None:
        from amdgpu_virt.k8s.api import client as k8s_client
        host = k8s_client.node_name(conf)
    if kind == 'configmap':
        if core_api is None:
            from amdgpu_virt.k8s.api import client as k8s_client
            core_api = k8s_client.core_api(conf)
        source: LedgerSource = ConfigMapSource(
            core_api, ledgermap.Location.from_conf(conf))
    elif kind == 'file':
        if not group.ledger_file:
            raise exception.ConfigError(
                option='[kubernetes] ledger_file',
                reason='must be set when [kubernetes] ledger_source is file')
        source = FileSource(group.ledger_file)
    else:
        raise exception.ConfigError(
            option='[kubernetes] ledger_source',
            reason='unknown source %r; one of %s' % (kind,
                                                    ', '.join(SOURCES)))
    return NodeRoles(source, host, max_age=group.registration_interval)
