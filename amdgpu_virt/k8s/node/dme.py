"""GPU health from AMD's device metrics exporter (``gpu_health``).

AMD's exporter serves Prometheus text on port 5000 (``/metrics``); its
gauge ``gpu_health`` is 1 for a healthy GPU and 0 for an unhealthy one,
labelled with the exporter's ``gpu_id`` (and ``gpu_partition_id`` on
partitioned GPUs). :func:`parse_health` keeps the ``gpu_health`` lines of
partition 0 (or without a partition) only; :class:`ExporterHealth` reads
the URL with a timeout and a size bound. The exporter is a neighbour on
the network: what it answers is input, never trusted beyond "GPU n said
unhealthy", and an exporter that does not answer makes no GPU unhealthy.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client import parser as prom_parser

from amdgpu_virt import exception

LOG = logging.getLogger(__name__)

METRIC = 'gpu_health'
#: bytes of an exporter answer read at most
MAX_BYTES = 8 * 1024 * 1024
#: GPUs a node can have (a larger gpu_id is ignored)
MAX_GPU_ID = 1024

#: url, timeout -> body (bytes)
Fetch = Callable[[str, float], bytes]


def parse_health(text: str) -> dict[int, bool]:
    """``gpu_id`` -> healthy, from the exporter's text.

    Only ``gpu_health`` samples are parsed (the other lines are skipped
    unread); a sample with a bad ``gpu_id`` is ignored; two samples of one
    GPU: unhealthy wins.

    :raises TelemetryError: the ``gpu_health`` lines are not Prometheus
        text.
    """
    lines = [line for line in text.splitlines()
             if line.startswith((METRIC + '{', METRIC + ' '))]
    if not lines:
        return {}
    try:
        families = list(prom_parser.text_string_to_metric_families(
            '\n'.join(lines) + '\n'))
    except Exception as err:  # the parser raises ValueError and others
        raise exception.TelemetryError(
            source='the device metrics exporter',
            reason='its %s lines are not Prometheus text: %s' % (
                METRIC, str(err)[:200])) from None
    result: dict[int, bool] = {}
    for family in families:
        for sample in family.samples:
            if sample.name != METRIC:
                continue
            partition = sample.labels.get('gpu_partition_id', '0')
            raw_id = sample.labels.get('gpu_id', '')
            if partition not in ('', '0') or not raw_id.isdigit() or \
                    int(raw_id) > MAX_GPU_ID:
                continue
            gpu = int(raw_id)
            healthy = sample.value == 1
            result[gpu] = result.get(gpu, True) and healthy
    return result


def _fetch(url: str, timeout: float) -> bytes:
    if not url.lower().startswith(('http://', 'https://')):
        raise ValueError('only http and https URLs are read')
    request = urllib.request.Request(  # noqa: S310 (http(s) only)
        url, headers={'Accept': 'text/plain;version=0.0.4'})
    with urllib.request.urlopen(  # noqa: S310 (http(s) only)
            request, timeout=timeout) as response:
        body: bytes = response.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise ValueError('the answer is larger than %d bytes' % MAX_BYTES)
    return body


class ExporterHealth:
    """Reads ``gpu_health`` from the exporter at ``url``.

    :param fetch: url, timeout -> body; the default uses urllib.
    """

    def __init__(self, url: str, timeout: float = 2.0,
                 fetch: Fetch | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.fetch = fetch or _fetch

    def read(self) -> dict[int, bool]:
        """``gpu_id`` -> healthy.

        :raises TelemetryError: no usable answer (naming the URL).
        """
        try:
            body = self.fetch(self.url, self.timeout)
            text = body.decode('utf-8')
        except (OSError, ValueError, urllib.error.URLError) as err:
            raise exception.TelemetryError(
                source=self.url, reason=str(err)[:200]
            ) from None
        return parse_health(text)
