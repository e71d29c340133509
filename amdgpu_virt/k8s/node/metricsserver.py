"""The node agent's metrics listener: ``GET /metrics`` and ``/healthz``.

Served by :class:`amdgpu_virt.k8s.api.httpserver.Server` (anything on the
pod network may connect, so its limits apply); every other path and
method answers 404 or 405 without reading the node.
"""

from __future__ import annotations

import prometheus_client

from amdgpu_virt.k8s.api import httpserver
from amdgpu_virt.k8s.node import telemetry

class _Handler(httpserver.Handler):
    log_name = 'metrics'
    server: _MetricsServer  # type: ignore[assignment]

    def do_GET(self) -> None:
        path = self.path.split('?')[0].rstrip('/')
        if path == '/metrics':
            self._send(200, self.server.telemetry.render(),
                       prometheus_client.CONTENT_TYPE_LATEST)
        elif path == '/healthz':
            self._json(200, {'status': 'ok'})
        else:
            self._json(404, {'error': 'no such path %s' % self.path[:200]})

    def do_POST(self) -> None:
        self._json(405, {'error': 'only GET is served'})

    do_PUT = do_PATCH = do_DELETE = do_POST


class _MetricsServer(httpserver.Server):
    telemetry: telemetry.NodeTelemetry


def make_server(collector: telemetry.NodeTelemetry, host: str = '0.0.0.0',  # noqa: S104
                port: int = 0, limits: httpserver.Limits | None = None
                ) -> _MetricsServer:
    """A server for ``collector``; call ``start`` or ``serve_forever``.

    :raises OSError: the address cannot be bound.
    """
    server = _MetricsServer(_Handler, host, port, limits, name='metrics')
    server.telemetry = collector
    return server
