"""Embedded sample data: the demo fleet and workload mix."""

from __future__ import annotations

import os

DATA_DIR = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """Absolute path of the embedded data file ``name``."""
    return os.path.join(DATA_DIR, name)
