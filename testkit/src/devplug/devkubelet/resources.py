"""What the dev kubelet keeps about one extended resource, and the device-plugin folder's start-up cleanup.

A :class:`Resource` is the kubelet's ``endpoints[resource]`` (the registered
client, or none while stopped, and its options) together with
``allDevices``/``healthyDevices[resource]`` (the device list, ``listed`` once
the manager has one) of ``pkg/kubelet/cm/devicemanager/manager.go``
(Kubernetes v1.32.10).
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable
from pathlib import Path

from devplug.devkubelet.model import DeviceInfo, PluginOptions
from devplug.devkubelet.plugin_client import PluginClient
from devplug.types import Health

__all__ = ["Resource", "cleanup_plugin_directory", "describe_predicate", "is_socket"]


class Resource:
    """One extended resource: its endpoint (client, options) and its device list."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.client: PluginClient | None = None  # None: the endpoint is stopped (or was never connected)
        self.superseded: list[PluginClient] = []  # older registrations still streaming (see devkubelet.endpoints)
        self.endpoint = ""
        self.options: PluginOptions | None = PluginOptions()  # None: restored from the checkpoint (opts nil)
        self.devices: tuple[DeviceInfo, ...] = ()
        self.listed = False  # the manager has a device list for it (a healthyDevices entry)
        self.stream_open = False
        self.drop_timer: asyncio.TimerHandle | None = None

    @classmethod
    def restored(cls, name: str) -> Resource:
        """A resource ``readCheckpoint`` recreates: no devices, a stopped endpoint without options."""
        res = cls(name)
        res.options = None
        res.listed = True
        return res

    def mark_unhealthy(self) -> None:
        """``markResourceUnhealthy``: every device unhealthy (capacity unchanged)."""
        self.devices = tuple(DeviceInfo(d.id, Health.UNHEALTHY.value, d.numa_nodes) for d in self.devices)
        self.stream_open = False

    def healthy_ids(self) -> tuple[str, ...]:
        """The healthy devices' IDs, in the plugin's order."""
        return tuple(d.id for d in self.devices if d.healthy)

    def cancel_drop(self) -> None:
        """Cancel a pending drop."""
        if self.drop_timer is not None:
            self.drop_timer.cancel()
            self.drop_timer = None


def is_socket(path: Path) -> bool:
    """Whether ``path`` is a unix socket (not following symlinks)."""
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def cleanup_plugin_directory(directory: Path, *, keep: str) -> None:
    """``CleanupPluginDirectory``: remove every entry of ``directory`` that is not a directory, except ``keep``.

    Sockets, regular files and symlinks alike go; subdirectories stay untouched.
    """
    for entry in sorted(directory.iterdir()):
        if entry.name == keep:
            continue
        try:
            mode = entry.lstat().st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            continue
        entry.unlink(missing_ok=True)


def describe_predicate(predicate: Callable[..., bool]) -> str:
    """A predicate's name and where it is defined, for timeout messages."""
    code = getattr(predicate, "__code__", None)
    name = getattr(predicate, "__qualname__", repr(predicate))
    if code is not None:
        return f"{name} ({Path(code.co_filename).name}:{code.co_firstlineno})"
    return name
