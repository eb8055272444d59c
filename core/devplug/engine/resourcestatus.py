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
    STOPPED = "stopped"


@dataclass
class ResourceStatus:
    """The resource's status, shared by the parts that change it (start, serving, the driver host)."""

    state: ResourceState = ResourceState.STARTING
    last_error: str | None = None
    registrations: int = 0
    registered_at: float | None = None
