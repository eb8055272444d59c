"""The shared driver's options, from ``[resources."<name>".options]``.

::

    [resources."example.com/camera"]
    driver = "shared"
    [resources."example.com/camera".options]
    capacity = 2                        # slots per device: <device>-0, <device>-1
    node_name = "node-a"                # default: $NODE_NAME, else the host name
    refresh_interval = 1.0              # seconds between reads of the slots' holders
    watch_store = true                  # read them at once when the store says a claim changed (local, etcd)
    discovery = { handler = "tcp", targets = { cam-a = "10.0.0.5:554" } }
    coordination = { backend = "etcd", endpoints = ["http://10.0.0.1:2379"], lease_ttl = 10.0 }

``discovery`` and ``coordination`` are checked with the handler's and the
backend's own option schemas when the config is checked, so a typo there is an
error naming ``options.discovery.<key>``.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from devplug import ConfigError
from devplug.options import parse_options
from devplug_shared.backends import parse_coordination
from devplug_shared.backends.common import check_seconds
from devplug_shared.discovery import load_handler_class

__all__ = ["SharedOptions", "resolve_node_name"]

_NODE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def resolve_node_name(configured: str | None) -> str:
    """The node's name: the option, else ``$NODE_NAME`` (the downward API), else the host name."""
    name = configured or os.environ.get("NODE_NAME") or socket.gethostname()
    return name.lower()


@dataclass(frozen=True)
class SharedOptions:
    """Options of one shared resource (see the module docstring)."""

    discovery: dict[str, Any]
    capacity: int = 1
    node_name: str | None = None
    coordination: dict[str, Any] = field(default_factory=dict)
    refresh_interval: float = 1.0
    #: Watch the store (inotify on the SQLite file, etcd's watch API) and read the holders as soon as a claim
    #: changed elsewhere; false: read them only every ``refresh_interval``.
    watch_store: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or not 1 <= self.capacity <= 1024:
            raise ValueError(f"capacity: must be an integer 1-1024 (slots per device), got {self.capacity!r}")
        if self.node_name is not None and not _NODE.match(self.node_name):
            raise ValueError(f"node_name: {self.node_name!r} is not a Kubernetes node name (lowercase DNS name)")
        check_seconds("refresh_interval", self.refresh_interval, 0.01, 3600.0)
        if not isinstance(self.watch_store, bool):
            raise ValueError(f"watch_store: expected true or false, got {self.watch_store!r}")
        try:
            rest = dict(self.discovery)
            name = rest.pop("handler", "static")
            if not isinstance(name, str):
                raise ConfigError(f"discovery.handler: expected a handler name, got {name!r}")
            cls = load_handler_class(name, "discovery")
            parse_options(getattr(cls, "Options", None), rest, "discovery")
            parse_coordination(self.coordination, "coordination")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
