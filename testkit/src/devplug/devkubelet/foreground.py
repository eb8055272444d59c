"""``devplug kubelet --dir DIR``: a dev kubelet in the foreground, with its control socket, for trying a driver.

The dev kubelet serves Registration and PodResources as in tests; every event is logged as a line; the control
socket (:mod:`~devplug.devkubelet.control`) takes ``devplug kubelet admit|remove|restart|show`` from a second
terminal. At start it logs what a daemon's config needs to serve it (the ``[kubelet]`` folders, and the
``[liveness]`` table that finds its containers' cgroups). On the way out it kills every container it runs and
removes their cgroups.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from devplug.devkubelet.cgroups import CgroupLayout
from devplug.devkubelet.control import ControlServer, default_control_socket
from devplug.devkubelet.daemonconfig import daemon_settings, no_containers_liveness
from devplug.devkubelet.endpoints import EndpointKeying
from devplug.devkubelet.kubelet import DevKubelet

__all__ = ["liveness_for", "run_foreground"]

_log = logging.getLogger("devplug.devkubelet")


def liveness_for(device_plugin_dir: Path, cgroups: CgroupLayout | None) -> dict[str, Any]:
    """The ``[liveness]`` table a daemon serving this dev kubelet needs.

    With containers in cgroups, where they are; without, the process-less table
    (:func:`~devplug.devkubelet.daemonconfig.no_containers_liveness`): no cgroups to read, a short grace.
    """
    if cgroups is not None:
        return dict(cgroups.liveness_config())
    return no_containers_liveness(Path(device_plugin_dir).absolute().parent)


async def run_foreground(
    device_plugin_dir: Path,
    *,
    kep_mode: bool = False,
    pod_resources_socket: Path | None = None,
    cgroups: CgroupLayout | None = None,
    control_socket: Path | None = None,
    until: asyncio.Event | None = None,
    endpoints_by: EndpointKeying = "socket-path",
    check_device_nodes: bool = False,
) -> None:
    """Serve a dev kubelet and its control socket until ``until`` is set or the task is cancelled, logging every
    event (``devplug.devkubelet``), then kill its containers and remove their cgroups.

    ``cgroups`` runs every container as a real process in a cgroup of that layout (root needed); the control
    socket is ``control_socket`` or ``DIR/../devkubelet.sock``. ``check_device_nodes``: refuse a container whose
    DeviceSpec host path is no device node (see :mod:`~devplug.devkubelet.devicespecs`).
    """
    kubelet = DevKubelet(
        device_plugin_dir,
        kep_mode=kep_mode,
        pod_resources_socket=pod_resources_socket,
        cgroups=cgroups,
        endpoints_by=endpoints_by,
        check_device_nodes=check_device_nodes,
    )
    kubelet.add_listener(lambda event: _log.info("%s", event))
    liveness = liveness_for(device_plugin_dir, cgroups)
    control = ControlServer(kubelet, control_socket or default_control_socket(device_plugin_dir), liveness)
    try:
        await control.start()  # first: it refuses a control socket another dev kubelet serves, before any cleanup
        await kubelet.start()
        _log.info(
            "dev kubelet serving %s and %s%s",
            kubelet.kubelet_socket,
            kubelet.pod_resources_socket,
            " (KEP mode: PostStopContainer and Deallocate are called)" if kep_mode else "",
        )
        _log.info(
            "containers: %s",
            cgroups.describe() if cgroups is not None else "no processes (names with a state, stopped at once)",
        )
        _log.info(
            "control socket %s: devplug kubelet admit|remove|restart|show --dir %s",
            control.path,
            kubelet.device_plugin_dir,
        )
        _log.info(
            "a daemon serving this kubelet needs in its config:\n%s",
            daemon_settings(kubelet.device_plugin_dir, kubelet.pod_resources_socket, liveness),
        )
        await (until or asyncio.Event()).wait()
    finally:
        await control.close()
        await kubelet.close()
        _log.info("dev kubelet stopped")
