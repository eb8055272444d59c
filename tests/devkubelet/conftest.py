"""Fixtures for the dev kubelet's tests: short temporary folders (unix socket paths stay under 107 bytes)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """``/tmp/dkXXXX/device-plugins`` (not created); its parent is removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dk", dir="/tmp"))
    try:
        yield root / "device-plugins"
    finally:
        shutil.rmtree(root, ignore_errors=True)
