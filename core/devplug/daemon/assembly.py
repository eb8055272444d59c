"""How the daemon assembles a front end: one shape for every kubelet API a resource may be served through.

Each API has a module of its own beside this one, :mod:`devplug.daemon.dpassembly`
(the device-plugin API) and :mod:`devplug.daemon.draassembly` (DRA), and each
offers one function, ``assemble(context) -> FrontEndAssembly``. The daemon calls
it (:func:`assemble`) only once some resource of its config is served through that
API (at start, or when a reload adds the first one), so a daemon never imports,
builds nor runs what no resource uses: a DRA-only daemon has no device-plugin
reconciler and leaves the kubelet's device-plugin folder alone, and a
device-plugin daemon never imports the DRA front end nor lightkube.

A :class:`FrontEndAssembly` makes the front end of each resource served through
its API (:meth:`~FrontEndAssembly.frontend`), is told which of those resources are
alive, prepares and runs what they share (for the device-plugin API: the kubelet's
checkpoint, the plugin folder's watch, release reconciliation through
PodResources), and adds its sections to the status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from devplug.config import Config, ResourceConfig
from devplug.config.dra import API_DRA
from devplug.engine import DeviceCodec, DeviceTable, ExitEvidence, FrontEnd, ReleaseQueue, Resource, ResourceStatus

__all__ = ["AssemblyContext", "FrontEndAssembly", "assemble"]


@dataclass(frozen=True)
class AssemblyContext:
    """What the daemon gives every front end's assembly."""

    #: The config running now (a reload changes it).
    config: Callable[[], Config]
    #: The daemon's state folder (each resource keeps its part of it).
    state_dir: Path
    #: The daemon instance's ID (with ``[handover] enabled``, front ends name their sockets after it).
    instance: str
    #: Whether pods' containers are gone (release evidence), node-wide.
    exits: ExitEvidence
    #: Set when something was allocated (release detection polls again).
    release_wake: asyncio.Event
    #: Whether the daemon shuts down.
    stopping: Callable[[], bool]
    #: Told whenever the status may have changed.
    on_change: Callable[[], None]


class FrontEndAssembly(Protocol):
    """One kubelet API's front ends in a daemon, and what they share (see the module's docstring)."""

    def frontend(
        self,
        rc: ResourceConfig,
        table: DeviceTable,
        status: ResourceStatus,
        releases: Callable[[], ReleaseQueue | None],
    ) -> FrontEnd:
        """The front end of ``rc`` (a resource served through this API), with its device table and status;
        ``releases`` gives the resource's release queue once its driver started."""
        ...

    def codec(self) -> DeviceCodec | None:
        """How the device table caches its listing for this API's front end (None: no cache)."""
        ...

    def added(self, resource: Resource, frontend: FrontEnd) -> None:
        """``resource`` (served through this API by ``frontend``) is alive: made at start, or by a reload."""

    def removed(self, resource: Resource) -> None:
        """``resource`` is gone (a reload removed or replaced it)."""

    def prepare(self) -> None:
        """Before anything serves: make what the API needs on the node (:class:`~devplug.errors.ConfigError` naming
        the key when it cannot)."""

    def start(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Future[None]]:
        """Start what the resources share (watches, loops); the loops, which the daemon cancels at shutdown."""
        ...

    def configure(self, config: Config) -> None:
        """A reload applied ``config``'s settings."""

    def status_sections(self) -> dict[str, Any]:
        """The sections this API adds to the status file (empty: none)."""
        ...

    def close(self) -> None:
        """At shutdown, once the loops ended: stop watching."""


def assemble(api: str, context: AssemblyContext) -> FrontEndAssembly:
    """The assembly of ``api``'s front ends (``"dra"`` or ``"device-plugin"``), its module imported only now."""
    if api == API_DRA:
        from devplug.daemon.draassembly import assemble as assemble_dra

        return assemble_dra(context)
    from devplug.daemon.dpassembly import assemble as assemble_device_plugin

    return assemble_device_plugin(context)
