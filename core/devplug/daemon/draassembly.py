"""The daemon's assembly of a DRA front end: imported only for a resource served through DRA, so a daemon
without one never loads the DRA front end nor lightkube."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devplug.config import Config, ResourceConfig
from devplug.config.dra import API_DRA
from devplug.engine import DeviceTable, FrontEnd, ResourceStatus
from devplug.errors import ConfigError

__all__ = ["check_dra_client", "dra_frontend"]


def check_dra_client(config: Config) -> None:
    """A resource served through DRA needs lightkube (the DRA front end's Kubernetes client): refuse the config,
    naming the resources, when it is not installed."""
    dra = [rc.name for rc in config.resources if rc.api == API_DRA]
    if dra and importlib.util.find_spec("lightkube") is None:
        raise ConfigError(
            f'{config.path or "<config>"}: resource(s) {", ".join(dra)} are served through DRA (api = "dra"), '
            "which needs the Kubernetes client lightkube: install it with pip install 'devplug[kubernetes]'"
        )


def dra_frontend(
    config: Config,
    rc: ResourceConfig,
    table: DeviceTable,
    status: ResourceStatus,
    releases: Callable[[], Any],
    *,
    keep_dir: Path,
    successor: Callable[[], bool],
    on_change: Callable[[], None],
) -> FrontEnd:
    """The DRA front end of ``rc``: ``keep_dir`` keeps its claims' CDI specs, ``successor`` says whether another
    resource of the driver follows when it stops (a reload), ``on_change`` is told of status changes."""
    from devplug.frontends.dra.frontend import DraFrontEnd
    from devplug.frontends.dra.slices import field_manager_of
    from devplug.kube.client import make_client

    assert rc.dra is not None  # the config gives every DRA resource its table
    kubeconfig, manager = config.kubernetes.kubeconfig, field_manager_of(rc.dra.driver_name)
    return DraFrontEnd(
        rc.name,
        rc.dra,
        node=config.node.name,
        kubelet=config.kubelet,
        cdi_spec_dir=config.cdi.spec_dir,
        keep_dir=keep_dir,
        table=table,
        status=status,
        releases=releases,
        make_client=lambda: make_client(kubeconfig, field_manager=manager),
        resource_cdi_kind=rc.cdi_kind if config.cdi.enabled else None,
        release_interval=config.release.interval,
        successor=successor,
        on_change=on_change,
    )
