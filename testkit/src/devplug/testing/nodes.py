"""Simulated nodes on one machine: each a dev kubelet and a real ``devplug run``, in a folder of its own.

For drivers whose devices span nodes (devplug-shared's demo and benchmark):
several :class:`LocalNode` objects side by side are several nodes, each with
its own kubelet folders, state dir and daemon, talking to whatever shared
store the driver's options name. Drivers may use it without importing the dev
kubelet (not part of the public surface) themselves.

::

    node = LocalNode("node-a", Path("/tmp/x/node-a"), {"example.com/cam": {"driver": "shared", "options": {...}}})
    node.start()
    devices = node.admit("pod-1", {"example.com/cam": 1})   # KubeletError when the kubelet rejects the pod
    node.remove("pod-1")
    node.close()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devplug.devkubelet import ContainerSpec, DevKubelet, DevKubeletThread, PodSpec
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.daemon import DaemonProcess
from devplug.testing.waiting import poll_until

#: The kit's one wait helper (:func:`devplug.testing.waiting.poll_until`), by the name this module gave it first.
wait_for = poll_until

__all__ = ["LocalNode", "wait_for"]


def _listed(resource: str) -> Callable[[DevKubelet], bool]:
    return lambda kubelet: bool(kubelet.events_of("list-and-watch", resource))


class LocalNode:
    """One node: a dev kubelet in ``root`` and ``devplug run`` on a config serving ``resources`` there."""

    def __init__(
        self,
        name: str,
        root: Path,
        resources: Mapping[str, Mapping[str, Any]],
        *,
        release_interval: float = 0.2,
        grace_period: float = 2.0,
        log_level: str = "info",
    ) -> None:
        self.name = name
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.resources = list(resources)
        self.kubelet = DevKubeletThread(
            self.root / "device-plugins", pod_resources_socket=self.root / "pod-resources" / "kubelet.sock"
        )
        config = dev_config(self.root, resources, release_interval=release_interval, grace_period=grace_period)
        self.config = config
        self.config_path = write_toml(self.root / "devplug.toml", config)
        self.daemon = DaemonProcess(self.config_path, self.root / "daemon.log", log_level=log_level)

    @property
    def state_dir(self) -> Path:
        """The daemon's ``[state] dir``."""
        return Path(self.config["state"]["dir"])

    def start(self, timeout: float = 30.0) -> None:
        """Start the kubelet (once) and the daemon; wait until every resource sent its first device list."""
        if not self.kubelet.kubelet.running:
            self.kubelet.start()
        counts = {name: self.kubelet.registrations(name) for name in self.resources}
        self.daemon.start()
        for name in self.resources:
            self.kubelet.wait_registered(name, timeout=timeout, after=counts[name])
            self.kubelet.wait_for(_listed(name), timeout, what=f"{name}'s first device list")

    def devices(self, resource: str) -> dict[str, str]:
        """The kubelet's view of ``resource``: device ID -> health (``Healthy``/``Unhealthy``)."""
        view = self.kubelet.resource(resource)
        return {} if view is None else {d.id: d.health for d in view.devices}

    def admit(self, pod: str, requests: Mapping[str, int]) -> dict[str, tuple[str, ...]]:
        """Admit a one-container pod (container ``app``); the devices it got, by resource.

        Raises :class:`devplug.errors.KubeletError` with the kubelet's message when the pod is rejected.
        """
        admitted = self.kubelet.admit_pod(PodSpec(pod, [ContainerSpec("app", dict(requests))]))
        return dict(admitted.container("app").devices)

    def remove(self, pod: str) -> None:
        """Delete the pod object: its containers are gone, its devices free for the kubelet."""
        self.kubelet.remove_pod(pod)

    def close(self) -> None:
        """Stop the daemon (SIGTERM) and the kubelet."""
        if self.daemon.running():
            self.daemon.stop()
        self.kubelet.close()
