"""Idempotent file writes for rendered configuration."""

from __future__ import annotations

import logging
import os
import tempfile

from amdgpu_virt import exception

LOG = logging.getLogger(__name__)


def write_if_changed(path: str, content: str, mode: int = 0o644) -> bool:
    """Write ``content`` to ``path`` unless it already holds exactly that.

    The write is atomic (temporary file in the same directory, then rename).

    :returns: True if the file was written.
    :raises AmdgpuVirtError: naming the path when it cannot be read/written.
    """
    try:
        with open(path, encoding='utf-8') as handle:
            if handle.read() == content:
                LOG.debug('%s is up to date', path)
                return False
    except FileNotFoundError:
        pass
    except OSError as err:
        raise exception.AmdgpuVirtError(
            'cannot read %s: %s' % (path, err.strerror)) from None
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix='.amdgpu-virt-')
        with os.fdopen(fd, 'w', encoding='utf-8') as handle:
            handle.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as err:
        raise exception.AmdgpuVirtError(
            'cannot write %s: %s' % (path, err.strerror)) from None
    LOG.debug('wrote %s', path)
    return True
