"""Request bodies of the HTTP servers: JSON within bounds.

A handler of :class:`amdgpu_virt.k8s.api.httpserver.Server` reads its
request's body with :func:`read_json`: UTF-8, JSON, nested at most
:data:`amdgpu_virt.yamlutil.MAX_DEPTH` deep, or an
:class:`~amdgpu_virt.exception.HttpRequestError` naming what is wrong.
"""

from __future__ import annotations

import http.server
from typing import Any

from amdgpu_virt import exception
from amdgpu_virt import yamlutil


def read_json(handler: http.server.BaseHTTPRequestHandler) -> Any:
    """The JSON body of the request ``handler`` serves (None if empty).

    :raises HttpRequestError: not UTF-8, not JSON, or nested deeper than
        :data:`amdgpu_virt.yamlutil.MAX_DEPTH` (naming what is wrong).
    """
    try:
        length = int(handler.headers.get('Content-Length') or 0)
    except ValueError:
        raise exception.HttpRequestError(
            reason='Content-Length is not a number') from None
    return parse_json(handler.rfile.read(length))


def parse_json(data: bytes) -> Any:
    """:func:`read_json` of a body already read."""
    if not data:
        return None
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as err:
        raise exception.HttpRequestError(
            reason='the body is not UTF-8 (byte %d)' % err.start) from None
    try:
        return yamlutil.load_json(text, 'the request body')
    except exception.AmdgpuVirtError as err:
        raise exception.HttpRequestError(reason=str(err)) from None
