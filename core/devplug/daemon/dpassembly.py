"""The daemon's assembly of device-plugin front ends (:class:`~devplug.daemon.assembly.FrontEndAssembly`): made only
when a resource is served through the device-plugin API, so a DRA-only daemon neither runs the release reconciler
nor touches the kubelet's device-plugin folder.

What its resources share: the kubelet's checkpoint (:class:`CheckpointView`),
what the daemon saw the kubelet do (:class:`KubeletSightings`), the device-plugin
folder and its watch (:class:`PluginFolder`), and release detection through
PodResources (:class:`Reconciler`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from devplug.config import Config, ResourceConfig
from devplug.daemon.assembly import AssemblyContext
from devplug.engine import DeviceTable, FrontEnd, ReleaseQueue, Resource, ResourceStatus
from devplug.frontends.deviceplugin.checkpointview import CHECKPOINT_FILE, CheckpointView
from devplug.frontends.deviceplugin.frontend import DevicePluginCodec, DevicePluginFrontEnd
from devplug.frontends.deviceplugin.pluginfolder import PluginFolder
from devplug.frontends.deviceplugin.reconciler import Reconciler
from devplug.frontends.deviceplugin.sightings import KubeletSightings
from devplug.kube.names import instance_tag

__all__ = ["DevicePluginAssembly", "assemble"]


class DevicePluginAssembly:
    """The device-plugin front ends of a daemon, and what they share."""

    def __init__(self, context: AssemblyContext) -> None:
        self._context = context
        config = context.config()
        kubelet = config.kubelet
        self.checkpoint = CheckpointView(kubelet.device_plugin_dir / CHECKPOINT_FILE)
        #: What the kubelet was seen doing (its runs, its checkpoint's rewrites): how a forgotten tenancy ends.
        self.sightings = KubeletSightings(kubelet.device_plugin_dir, self.checkpoint)
        #: Each live resource's front end (told of changes in the device-plugin folder).
        self._frontends: dict[Resource, DevicePluginFrontEnd] = {}
        self.plugin_folder = PluginFolder(
            kubelet.device_plugin_dir, str(config.path or "<config>"), self._frontends.values, self.sightings
        )
        self.reconciler = Reconciler(
            [],
            kubelet.pod_resources_socket,
            config.release,
            self.checkpoint,
            context.release_wake,
            context.exits,
            self.sightings,
        )

    def frontend(
        self,
        rc: ResourceConfig,
        table: DeviceTable,
        status: ResourceStatus,
        releases: Callable[[], ReleaseQueue | None],
    ) -> FrontEnd:
        context, config = self._context, self._context.config()
        tag = instance_tag(context.instance) if config.handover.enabled else None
        kubelet = config.kubelet
        return DevicePluginFrontEnd(
            rc.name, kubelet, table, self.checkpoint, self.sightings, status, context.on_change, tag
        )

    def codec(self) -> DevicePluginCodec:
        return DevicePluginCodec()

    def added(self, resource: Resource, frontend: FrontEnd) -> None:
        if isinstance(frontend, DevicePluginFrontEnd):
            self._frontends[resource] = frontend
        self.reconciler.add(resource)

    def removed(self, resource: Resource) -> None:
        self.reconciler.remove(resource)
        self._frontends.pop(resource, None)

    def prepare(self) -> None:
        self.plugin_folder.prepare()

    def start(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Future[None]]:
        watching = loop.create_task(self.plugin_folder.watch())
        return [watching, loop.create_task(self.reconciler.run())]

    def configure(self, config: Config) -> None:
        self.reconciler.configure(config.release)

    def status_sections(self) -> dict[str, Any]:
        return {"release": self.reconciler.describe()}

    def close(self) -> None:
        pass  # the folder's watch ended with its loop


def assemble(context: AssemblyContext) -> DevicePluginAssembly:
    """The device-plugin front ends' assembly (see :mod:`devplug.daemon.assembly`)."""
    return DevicePluginAssembly(context)
