"""Fixtures for the dev kubelet's tests: short temporary folders (unix socket paths stay under 107 bytes), cgroups."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplug.devkubelet.cgroups import CgroupLayout
from devplug.testing.plugin import require_cgroup_layout


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """``/tmp/dkXXXX/device-plugins`` (not created); its parent is removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dk", dir="/tmp"))
    try:
        yield root / "device-plugins"
    finally:
        shutil.rmtree(root, ignore_errors=True)


CGROUP_KINDS = [(1, "cgroupfs"), (1, "systemd"), (2, "cgroupfs"), (2, "systemd")]


@pytest.fixture(params=CGROUP_KINDS, ids=[f"v{v}-{d}" for v, d in CGROUP_KINDS])
def cgroups(request: pytest.FixtureRequest) -> CgroupLayout:
    """Cgroups of each version and driver naming, with a fresh root (skipped where the host cannot give them)."""
    version, driver = request.param
    return require_cgroup_layout(version, driver)


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def cgroups_by_version(request: pytest.FixtureRequest) -> CgroupLayout:
    """Cgroups of each version (cgroupfs names), with a fresh root."""
    return require_cgroup_layout(request.param, "cgroupfs")


@pytest.fixture
def host_cgroups() -> CgroupLayout:
    """The cgroups a kubelet would use on this host, with a fresh root."""
    return require_cgroup_layout(None, "cgroupfs")
