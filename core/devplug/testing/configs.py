"""Daemon configs for tests: everything under one folder, laid out as the dev kubelet expects."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devplug.tomlwrite import dumps_toml, write_toml

__all__ = ["dev_config", "dumps_toml", "write_toml"]


def dev_config(
    root: Path,
    resources: Mapping[str, Mapping[str, Any]],
    *,
    release_interval: float = 0.2,
    grace_period: float = 2.0,
    shutdown_timeout: float | None = None,
    metrics: Mapping[str, Any] | None = None,
    cdi: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A config whose kubelet folders and state dir all live under ``root`` (the dev kubelet's layout).

    ``metrics`` and ``cdi`` are the ``[metrics]`` and ``[cdi]`` tables, when given.
    """
    config: dict[str, Any] = {
        "kubelet": {
            "device_plugin_dir": str(root / "device-plugins"),
            "pod_resources_socket": str(root / "pod-resources" / "kubelet.sock"),
        },
        "state": {"dir": str(root / "state")},
        "release": {"interval": release_interval, "grace_period": grace_period},
    }
    if shutdown_timeout is not None:
        config["shutdown"] = {"timeout": shutdown_timeout}
    if metrics is not None:
        config["metrics"] = dict(metrics)
    if cdi is not None:
        config["cdi"] = dict(cdi)
    config["resources"] = {name: dict(table) for name, table in resources.items()}
    return config
