"""Reading and writing the files amdgpu_virt renders, idempotently.

Every file the project writes (rendered configuration, ledgers, move state,
charts) goes through :func:`atomic_write` or :func:`write_if_changed`: a
reader never sees half a file, and a second run with nothing changed writes
nothing.
"""

from __future__ import annotations

import logging
import os
import tempfile

from amdgpu_virt import exception

LOG = logging.getLogger(__name__)


def read_text(path: str) -> str | None:
    """The text of ``path``, or None when it does not exist.

    :raises AmdgpuVirtError: naming the path when it cannot be read.
    """
    try:
        with open(path, encoding='utf-8') as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise exception.AmdgpuVirtError('cannot read %s: %s' % (
            path, getattr(err, 'strerror', None) or err)) from None


def atomic_write(path: str, content: str, mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` through a temporary file and a rename.

    :raises AmdgpuVirtError: naming the path when it cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix='.amdgpu-virt-')
        try:
            with os.fdopen(fd, 'w', encoding='utf-8') as handle:
                handle.write(content)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as err:
        raise exception.AmdgpuVirtError(
            'cannot write %s: %s' % (path, err.strerror)) from None
    LOG.debug('wrote %s', path)


def write_if_changed(path: str, content: str, mode: int = 0o644) -> bool:
    """Write ``content`` to ``path`` unless it already holds exactly that.

    :returns: True if the file was written.
    :raises AmdgpuVirtError: naming the path when it cannot be read/written.
    """
    if read_text(path) == content:
        LOG.debug('%s is up to date', path)
        return False
    atomic_write(path, content, mode)
    return True
