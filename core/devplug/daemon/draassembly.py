"""The daemon's assembly of DRA front ends (:class:`~devplug.daemon.assembly.FrontEndAssembly`): imported only when
a resource is served through DRA, so a daemon without one never loads the DRA front end nor lightkube."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Any

from devplug.config import Config, ResourceConfig
from devplug.config.dra import API_DRA
from devplug.daemon.assembly import AssemblyContext
from devplug.engine import DeviceCodec, DeviceTable, FrontEnd, ReleaseQueue, Resource, ResourceStatus
from devplug.errors import ConfigError
from devplug.kube.names import resource_state_dir

__all__ = ["DraAssembly", "assemble", "check_dra_client"]


def check_dra_client(config: Config) -> None:
    """A resource served through DRA needs lightkube (the DRA front end's Kubernetes client): refuse the config,
    naming the resources, when it is not installed."""
    dra = [rc.name for rc in config.resources if rc.api == API_DRA]
    if dra and importlib.util.find_spec("lightkube") is None:
        raise ConfigError(
            f'{config.path or "<config>"}: resource(s) {", ".join(dra)} are served through DRA (api = "dra"), '
            "which needs the Kubernetes client lightkube: install it with pip install 'devplug[kubernetes]'"
        )


class DraAssembly:
    """The DRA front ends of a daemon: each a DRA kubelet plugin of its own, sharing nothing but the config."""

    def __init__(self, context: AssemblyContext) -> None:
        check_dra_client(context.config())
        self._context = context

    def frontend(
        self,
        rc: ResourceConfig,
        table: DeviceTable,
        status: ResourceStatus,
        releases: Callable[[], ReleaseQueue | None],
    ) -> FrontEnd:
        """The DRA front end of ``rc``: its claims' CDI specs kept in the resource's state folder; at stop it leaves
        the slices when another resource of the same driver follows in this daemon (a reload)."""
        from devplug.frontends.dra.frontend import DraFrontEnd
        from devplug.frontends.dra.slices import field_manager_of
        from devplug.kube.client import make_client

        dra = rc.dra
        if dra is None:  # the config gives every DRA resource its table
            raise ConfigError(f"{rc.name}: served through DRA without a [resources.dra] table")
        config = self._context.config()
        kubeconfig, manager = config.kubernetes.kubeconfig, field_manager_of(dra.driver_name)
        return DraFrontEnd(
            rc.name,
            dra,
            node=config.node.name,
            kubelet=config.kubelet,
            cdi_spec_dir=config.cdi.spec_dir,
            keep_dir=resource_state_dir(self._context.state_dir, rc.name) / "dra-claims",
            table=table,
            status=status,
            releases=releases,
            make_client=lambda: make_client(kubeconfig, field_manager=manager),
            resource_cdi_kind=rc.cdi_kind if config.cdi.enabled else None,
            release_interval=config.release.interval,
            successor=lambda: self._successor_of(dra.driver_name),
            on_change=self._context.on_change,
        )

    def _successor_of(self, driver: str) -> bool:
        """Whether a DRA resource of ``driver`` stopping now is followed by another in this daemon: not at shutdown,
        and the config (a reload applies it before restarting a resource) still serves the driver through DRA."""
        return not self._context.stopping() and any(
            rc.api == API_DRA and rc.dra is not None and rc.dra.driver_name == driver
            for rc in self._context.config().resources
        )

    def codec(self) -> DeviceCodec | None:
        return None

    def added(self, resource: Resource, frontend: FrontEnd) -> None:
        pass  # each DRA front end reconciles its own claims

    def removed(self, resource: Resource) -> None:
        pass

    def prepare(self) -> None:
        pass  # each front end makes its sockets' folders as it serves

    def start(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Future[None]]:
        return []

    def configure(self, config: Config) -> None:
        pass  # read from the config when a front end is made

    def status_sections(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def assemble(context: AssemblyContext) -> DraAssembly:
    """The DRA front ends' assembly (see :mod:`devplug.daemon.assembly`)."""
    return DraAssembly(context)
