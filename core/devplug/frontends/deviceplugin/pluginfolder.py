"""The kubelet's device-plugin folder (``[kubelet] device_plugin_dir``): made when missing, and watched for the signs
of a kubelet restart (a plugin socket removed, ``kubelet.sock`` recreated), which every resource's device-plugin
front end is told of (:meth:`~devplug.frontends.deviceplugin.frontend.DevicePluginFrontEnd.on_plugin_dir_changed`),
and for each rewrite of the kubelet's checkpoint (:meth:`~.sightings.KubeletSightings.folder_changed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path

from devplug.errors import ConfigError
from devplug.frontends.deviceplugin.frontend import DevicePluginFrontEnd
from devplug.frontends.deviceplugin.sightings import KubeletSightings
from devplug.host.watch import DirectoryWatcher

__all__ = ["PluginFolder"]


class PluginFolder:
    """One node's device-plugin folder, shared by the front ends ``frontends()`` returns (read at each change)."""

    def __init__(
        self,
        path: Path,
        source: str,
        frontends: Callable[[], Iterable[DevicePluginFrontEnd]],
        sightings: KubeletSightings,
    ) -> None:
        """``source`` names the config file in errors."""
        self.path = path
        self.sightings = sightings
        self._source = source
        self._frontends = frontends

    def prepare(self) -> None:
        """Make the folder if missing; :class:`ConfigError` naming the key when it cannot be a folder."""
        where = f"{self._source}: kubelet.device_plugin_dir"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ConfigError(f"{where}: {self.path} exists and is not a folder") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot create {self.path}: {exc.strerror or exc}") from exc
        if not self.path.is_dir():
            raise ConfigError(f"{where}: {self.path} is not a folder")

    async def watch(self) -> None:
        """Watch the folder (in the watcher's thread) until cancelled; the front ends are told on this event loop."""
        loop = asyncio.get_running_loop()

        def changed(names: frozenset[str]) -> None:
            loop.call_soon_threadsafe(self._changed, names)

        watcher = DirectoryWatcher(self.path, changed)
        watcher.start()
        try:
            self.sightings.watching(watcher.uses_inotify)
            await asyncio.Event().wait()  # until cancelled (the daemon's shutdown)
        finally:
            watcher.close()
            self.sightings.not_watching()

    def _changed(self, names: frozenset[str]) -> None:
        self.sightings.folder_changed(names)
        for frontend in list(self._frontends()):
            frontend.on_plugin_dir_changed(names)
