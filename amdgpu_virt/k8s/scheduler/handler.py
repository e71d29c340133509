"""The scheduler extender's HTTP side: handlers and server.

``POST /filter``, ``/prioritize`` and ``/bind`` go to an
:class:`~amdgpu_virt.k8s.scheduler.core.Extender`; a body that is not
JSON, too large or malformed is answered with the verb's error shape
(``400`` for ``/prioritize``, whose answer has no error field) naming
the fault, an :class:`~amdgpu_virt.exception.ExtenderRequestError` with
``400``, anything else with ``500``, never a dropped connection.
``GET /healthz``, ``/readyz`` (once the cache is synced) and ``/metrics``
(Prometheus, :class:`Metrics`) complete it; :func:`make_server` with
``probes_only`` serves only those (the listener on the pod address).
Connections are held by :class:`amdgpu_virt.k8s.api.httpserver.Server`.
"""

from __future__ import annotations

import logging
from typing import Any

import prometheus_client

from amdgpu_virt import exception
from amdgpu_virt.k8s.api import httpbody
from amdgpu_virt.k8s.api import httpserver
from amdgpu_virt.k8s.api import tls as api_tls
from amdgpu_virt.k8s.scheduler.core import Extender

LOG = logging.getLogger(__name__)


class _Handler(httpserver.Handler):
    log_name = 'extender'
    server: _ExtenderServer  # type: ignore[assignment]

    def do_GET(self) -> None:
        path = self.path.split('?')[0].rstrip('/')
        extender = self.server.extender
        if path.endswith('/healthz'):
            self._json(200, {'status': 'ok'})
        elif path.endswith('/readyz'):
            if extender.cache.synced:
                self._json(200, {'status': 'ok'})
            else:
                self._json(503, {'status': 'cache not synced'})
        elif path.endswith('/metrics'):
            self._send(200, extender.metrics.render(),
                       prometheus_client.CONTENT_TYPE_LATEST)
        else:
            self._json(404, {'error': 'no such path %s' % self.path})

    def do_POST(self) -> None:
        verb = self.path.split('?')[0].rstrip('/').rsplit('/', 1)[-1]
        extender = self.server.extender
        handlers = {'filter': extender.filter,
                    'prioritize': extender.prioritize,
                    'bind': extender.bind}
        if verb not in handlers:
            self._json(404, {'error': 'no such path %s' % self.path})
            return
        try:
            args = httpbody.read_json(self)
        except exception.HttpRequestError as err:
            body: Any = {'Error': str(err)}
            if verb == 'filter':
                body.update(NodeNames=None, FailedNodes={})
            self._json(400 if verb == 'prioritize' else 200, body)
            return
        try:
            self._json(200, handlers[verb](args))
        except exception.ExtenderRequestError as err:
            self._json(400, {'Error': str(err)})
        except Exception as err:  # answer rather than drop the connection
            LOG.exception('extender %s failed', verb)
            self._json(500, {'Error': 'internal error: %s' % err})


class _ProbeHandler(_Handler):
    """Only the GET paths: probes and metrics on the pod address."""

    def do_POST(self) -> None:
        self._json(404, {'error': 'no such path %s' % self.path})


class _ExtenderServer(httpserver.Server):
    extender: Extender


def make_server(extender: Extender, host: str = '127.0.0.1',
                port: int = 0, limits: httpserver.Limits | None = None,
                tls: api_tls.TlsFiles | None = None,
                probes_only: bool = False) -> _ExtenderServer:
    """An HTTP(S) server for the extender; call ``serve_forever``.

    :param probes_only: serve only ``GET /healthz``, ``/readyz`` and
        ``/metrics`` (the listener on the pod address).
    """
    server = _ExtenderServer(_ProbeHandler if probes_only else _Handler,
                             host, port, limits, tls,
                             name='metrics' if probes_only else 'extender')
    server.extender = extender
    return server

