"""What a devplug daemon serving the dev kubelet needs in its config to read the dev kubelet's containers.

A dev kubelet that runs no container processes (the process-less model) gives a daemon nothing to tell when a
pod's containers are gone: :func:`no_containers_liveness` is the ``[liveness]`` table for it, with no cgroups to
read and a short grace (:data:`NO_CONTAINERS_GRACE`) in place of the 30 s a real node would need.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["NO_CONTAINERS_GRACE", "daemon_settings", "no_containers_liveness"]

#: ``[liveness] unknown_grace`` against a dev kubelet that runs no container processes: a tenancy whose pod
#: vanished is released this long after (in production the grace is 30 s, the kubelet's default termination grace).
NO_CONTAINERS_GRACE = 0.5


def no_containers_liveness(root: Path) -> dict[str, Any]:
    """The ``[liveness]`` table for a daemon whose dev kubelet (folders under ``root``) runs no containers."""
    return {"cgroup_mount": str(root / "no-cgroups"), "unknown_grace": NO_CONTAINERS_GRACE}


def daemon_settings(device_plugin_dir: Path, pod_resources_socket: Path, liveness: Mapping[str, Any]) -> str:
    """The TOML a daemon's config needs to serve a dev kubelet: ``[kubelet]``'s two paths and ``[liveness]``."""
    lines = [
        "[kubelet]",
        f"device_plugin_dir = {json.dumps(str(device_plugin_dir))}",
        f"pod_resources_socket = {json.dumps(str(pod_resources_socket))}",
        "",
        "[liveness]",
        *(f"{key} = {json.dumps(value)}" for key, value in liveness.items()),
    ]
    return "\n".join(lines)
