"""Where a resource stands, as ``devplug status`` shows it: state, last error, registrations."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ResourceState", "ResourceStatus"]


class ResourceState(str, enum.Enum):
    """Where a resource is in its life."""

    STARTING = "starting"
    FAILED = "failed"  # the driver's start failed; retried with backoff
    REGISTERING = "registering"
    REGISTERED = "registered"
    DRAINING = "draining"  # removed from the config by a reload: advertises nothing, waits for its releases
    STOPPED = "stopped"


@dataclass
class ResourceStatus:
    """The resource's status, shared by the parts that change it (start, serving, the driver host)."""

    state: ResourceState = ResourceState.STARTING
    last_error: str | None = None
    registrations: int = 0
    registered_at: float | None = None
    #: Kubelet restarts seen: signs of one (socket removed, kubelet.sock recreated, the kubelet's stream ended)
    #: while registered, each ending that registration (further signs until registered again count no more).
    kubelet_restarts: int = 0
