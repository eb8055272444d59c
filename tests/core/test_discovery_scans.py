"""Reading the installed drivers costs a scan of every distribution on ``sys.path`` (8.5 ms of the daemon's start
each, issue 42): a config reads them once, however many resources it has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devplug.config import parse_config
from devplug.drivers import discovery
from devplug.testing.configs import dev_config


def test_a_config_of_three_resources_scans_the_installed_drivers_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[str] = []
    scan = discovery.entry_points

    def counted(group: str, paths: Any = None) -> Any:
        scans.append(group)
        return scan(group, paths)

    monkeypatch.setattr(discovery, "entry_points", counted)
    resources = {f"example.com/m{i}": {"driver": "mock", "options": {"directory": str(tmp_path)}} for i in range(3)}
    config = parse_config(dev_config(tmp_path, resources))
    assert [r.driver for r in config.resources] == ["mock"] * 3
    assert scans == [discovery.ENTRY_POINT_GROUP]
