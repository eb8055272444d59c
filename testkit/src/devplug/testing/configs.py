"""Daemon configs for tests: everything under one folder, laid out as the dev kubelet expects."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devplug.config.tomlwrite import dumps_toml, write_toml

__all__ = ["dev_config", "dumps_toml", "write_toml"]


def dev_config(
    root: Path,
    resources: Mapping[str, Mapping[str, Any]],
    *,
    release_interval: float = 0.2,
    grace_period: float = 2.0,
    max_retry_interval: float = 2.0,
    release: Mapping[str, Any] | None = None,
    liveness: Mapping[str, Any] | None = None,
    shutdown_timeout: float | None = None,
    metrics: Mapping[str, Any] | None = None,
    cdi: Mapping[str, Any] | None = None,
    node: Mapping[str, Any] | None = None,
    kubernetes: Mapping[str, Any] | None = None,
    profiles: Mapping[str, Any] | None = None,
    handover: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A config whose kubelet folders and state dir all live under ``root`` (the dev kubelet's layout).

    ``release`` adds keys to the ``[release]`` table (``previous_tenant_wait``, ...); ``metrics`` and ``cdi`` are
    the ``[metrics]`` and ``[cdi]`` tables, when given, as are ``node``, ``kubernetes``, ``profiles`` and
    ``handover`` (the ``[node]``, ``[kubernetes]``, ``[profiles]`` and ``[handover]`` tables). ``liveness`` is the
    ``[liveness]`` table: give the dev kubelet's (:meth:`~devplug.devkubelet.DevKubelet.liveness_config`) when it
    runs containers in cgroups; by default there are none to read
    (:func:`~devplug.devkubelet.daemonconfig.no_containers_liveness`). Failing releases back off to at most
    ``max_retry_interval`` seconds (short, so tests of recovery need not wait a minute).
    """
    config: dict[str, Any] = {
        "kubelet": {
            "device_plugin_dir": str(root / "device-plugins"),
            "pod_resources_socket": str(root / "pod-resources" / "kubelet.sock"),
        },
        "state": {"dir": str(root / "state")},
        "release": {
            "interval": release_interval,
            "grace_period": grace_period,
            "max_retry_interval": max_retry_interval,
            **(release or {}),
        },
    }
    if liveness is None:
        from devplug.devkubelet.daemonconfig import no_containers_liveness  # the dev kubelet's package imports grpc

        liveness = no_containers_liveness(root)
    config["liveness"] = dict(liveness)
    if shutdown_timeout is not None:
        config["shutdown"] = {"timeout": shutdown_timeout}
    if metrics is not None:
        config["metrics"] = dict(metrics)
    if cdi is not None:
        config["cdi"] = dict(cdi)
    for key, table in (("node", node), ("kubernetes", kubernetes), ("handover", handover)):
        if table is not None:
            config[key] = dict(table)
    config["resources"] = {name: dict(table) for name, table in resources.items()}
    if profiles is not None:
        config["profiles"] = {name: dict(table) for name, table in profiles.items()}
    return config
