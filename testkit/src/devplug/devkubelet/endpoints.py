"""Two instances of one device plugin: what the end of the older instance's stream does, per kubelet version.

A rolling update with ``maxSurge > 0`` runs the new plugin instance beside the
old one: the new one registers while the old one still streams. In every
kubelet ``registerClient`` keeps the older client (it is not closed) and
``PluginListAndWatchReceiver`` takes device lists by resource name, so the
older stream keeps feeding the resource until it ends. When it ends,
``runClient`` disconnects the client that ``getClient`` finds for it
(``pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go``):

* **keyed by resource name** (every kubelet before Kubernetes PR #135437,
  v1.32.10 included): ``clients[name]`` holds one client, the newest, and
  ``getClient(name)`` returns it, so the old stream's end disconnects the
  *new* registration (``disconnectClient`` closes its connection and
  ``PluginDisconnected(resourceName)`` marks every device unhealthy and
  stops the endpoint). The new instance sees its own stream end and must
  register again;
* **keyed by socket path** (PR #135437, "DRA-like fix for device-plugin race
  condition problem", merged 2025-11-25): ``clients[name]`` is a list,
  ``getClient(name, socketPath)`` and ``deregisterClient(name, socketPath)``
  match the instance's socket path, and ``PluginDisconnected`` takes the
  socket path too (``ClientHandler.PluginDisconnected(logger, resource,
  socketPath)``, as ``handler_test.go`` implements it), so an older instance
  on *another* socket disconnects only itself. An older registration on the
  *same* socket path still disconnects the current endpoint: the PR fixes
  unique socket names only (Kubernetes PR #139338 documents the same-socket
  take-over as unsupported).
"""

from __future__ import annotations

import enum
from typing import Literal

__all__ = ["ENDPOINT_KEYINGS", "EndpointKeying", "OlderStreamEnd", "older_stream_end"]

#: How a device manager keys plugin endpoints.
EndpointKeying = Literal["socket-path", "resource-name"]
#: Every :data:`EndpointKeying`, newest kubelet first.
ENDPOINT_KEYINGS: tuple[EndpointKeying, ...] = ("socket-path", "resource-name")


class OlderStreamEnd(enum.Enum):
    """What the end of an older registration's stream does to the current registration."""

    #: Only the older client is disconnected; the current endpoint keeps serving.
    ONLY_ITSELF = "only-itself"
    #: The current client is found by resource name and disconnected (before PR #135437).
    CURRENT_BY_NAME = "current-by-name"
    #: The current endpoint shares the older one's socket path and is disconnected (PR #135437 too).
    CURRENT_BY_SOCKET = "current-by-socket"


def older_stream_end(keying: EndpointKeying, older_endpoint: str, current_endpoint: str | None) -> OlderStreamEnd:
    """What the older registration at ``older_endpoint`` ending does, the current one being at ``current_endpoint``."""
    if current_endpoint is None:
        return OlderStreamEnd.ONLY_ITSELF
    if keying == "resource-name":
        return OlderStreamEnd.CURRENT_BY_NAME
    if older_endpoint == current_endpoint:
        return OlderStreamEnd.CURRENT_BY_SOCKET
    return OlderStreamEnd.ONLY_ITSELF
