"""TLS for the HTTP servers: a server ``SSLContext`` from PEM files,
rebuilt when they change (a rotated Kubernetes secret), for new
connections, with no restart; a set that does not load (half-written
during a rotation) is logged and the previous context kept."""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from typing import Any

from amdgpu_virt import exception

LOG = logging.getLogger(__name__)


class TlsFiles:
    """A server ``SSLContext`` from PEM files, rebuilt when they change.

    :param cert_file: the certificate chain.
    :param key_file: its private key.
    :param client_ca_file: CA certificates that sign the client
        certificates; when given, a client without a valid certificate is
        refused during the handshake.
    :param check_interval: seconds between checks of the files.
    :raises ConfigError: the files do not load now (naming them).
    """

    def __init__(self, cert_file: str, key_file: str,
                 client_ca_file: str | None = None,
                 check_interval: float = 1.0, option: str = 'TLS') -> None:
        self.files = tuple(f for f in (cert_file, key_file, client_ca_file)
                           if f)
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.check_interval = check_interval
        self.option = option
        #: contexts built so far (1 after start; +1 per rotation seen)
        self.loads = 0
        self._lock = threading.Lock()
        self._checked = 0.0
        self._signature = self._stat()
        self._failed: tuple[Any, ...] | None = None
        try:
            self._context = self._build()
        except (OSError, ssl.SSLError) as err:
            raise exception.ConfigError(
                option=option, reason='%s: %s' % (', '.join(self.files),
                                                  err)) from None

    def _stat(self) -> tuple[Any, ...]:
        result: list[tuple[int, int, int] | None] = []
        for path in self.files:
            try:
                st = os.stat(path)
            except OSError:
                result.append(None)
                continue
            result.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(result)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        self.loads += 1
        return context

    def context(self) -> ssl.SSLContext:
        """The context for a new connection (rebuilt if a file changed)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.check_interval:
                return self._context
            self._checked = now
            signature = self._stat()
            if signature == self._signature or signature == self._failed:
                return self._context
            try:
                self._context = self._build()
            except (OSError, ssl.SSLError) as err:
                # a rotation in progress, or a bad secret: keep serving
                self._failed = signature
                LOG.warning('%s: %s do not load (%s); still serving the '
                            'previous certificate', self.option,
                            ', '.join(self.files), err)
                return self._context
            self._signature = signature
            self._failed = None
            LOG.info('%s: certificate reloaded from %s', self.option,
                     ', '.join(self.files))
            return self._context
