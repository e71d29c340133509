"""The node agent's metrics listener: ``GET /metrics`` and ``/healthz``.

Served by :class:`amdgpu_virt.k8s.api.httpserver.Server` (anything on the
pod network may connect, so its limits apply); every other path and
method answers 404 or 405 without reading the node.
"""

from __future__ import annotations

import http.server
import json
import logging
from typing import Any

import prometheus_client

from amdgpu_virt.k8s.api import httpserver
from amdgpu_virt.k8s.node import telemetry

LOG = logging.getLogger(__name__)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    disable_nagle_algorithm = True
    server: _MetricsServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        LOG.debug('metrics %s - %s', self.address_string(), format % args)

    def _send(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, code: int, body: Any) -> None:
        self._send(code, json.dumps(body).encode(), 'application/json')

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
