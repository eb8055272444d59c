"""What a devplug daemon serving the dev kubelet needs in its config to read the dev kubelet's containers.

A dev kubelet that runs no container processes (the process-less model) gives a daemon nothing to tell when a
pod's containers are gone: :func:`no_containers_liveness` is the ``[liveness]`` table for it, with no cgroups to
read and a short grace (:data:`NO_CONTAINERS_GRACE`) in place of the 30 s a real node would need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["NO_CONTAINERS_GRACE", "no_containers_liveness"]

#: ``[liveness] unknown_grace`` against a dev kubelet that runs no container processes: a tenancy whose pod
#: vanished is released this long after (in production the grace is 30 s, the kubelet's default termination grace).
NO_CONTAINERS_GRACE = 0.5


def no_containers_liveness(root: Path) -> dict[str, Any]:
    """The ``[liveness]`` table for a daemon whose dev kubelet (folders under ``root``) runs no containers."""
    return {"cgroup_mount": str(root / "no-cgroups"), "unknown_grace": NO_CONTAINERS_GRACE}
