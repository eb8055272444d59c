"""The benchmark's temporary folder, mock device folders, and daemons started on them.

Everything lives under one short folder in /tmp (unix socket paths are
limited to 107 bytes). Each daemon gets a sub-folder of its own laid out like
a node (``device-plugins/``, ``pod-resources/``, ``state/``) and mock folders
whose files are its devices.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.kube.names import socket_file_name
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.daemon import DaemonProcess

__all__ = ["Node", "Workspace", "flip_device", "make_mock_folder", "stage_flip"]

#: The release interval devplug ships with (``[release] interval``).
DEFAULT_RELEASE_INTERVAL = 1.0


def _device_text(index: int, numa_nodes: int, unhealthy: bool = False) -> str:
    lines = []
    if numa_nodes:
        lines.append(f"numa={index % numa_nodes}")
    if unhealthy:
        lines.append("unhealthy")
    return "".join(f"{line}\n" for line in lines)


def make_mock_folder(folder: Path, count: int, numa_nodes: int = 0) -> Path:
    """``count`` device files ``mock0`` .. (each ``numa=i % numa_nodes`` when asked), before the daemon starts."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"mock{i}").write_text(_device_text(i, numa_nodes))
    return folder


def stage_flip(folder: Path, index: int, unhealthy: bool, numa_nodes: int = 0) -> tuple[Path, Path]:
    """Write device ``mock<index>``'s new content to a dotfile (the mock ignores it); rename it to apply."""
    tmp = folder / f".flip-{index}"
    tmp.write_text(_device_text(index, numa_nodes, unhealthy))
    return tmp, folder / f"mock{index}"


def flip_device(folder: Path, index: int, unhealthy: bool, numa_nodes: int = 0) -> None:
    """Rewrite device ``mock<index>`` atomically (a dotfile renamed over it): one change, never a torn read."""
    os.replace(*stage_flip(folder, index, unhealthy, numa_nodes))


@dataclass
class Node:
    """One daemon's node: its folder, config, process and resources."""

    root: Path
    config: dict[str, Any]
    config_path: Path
    process: DaemonProcess

    @property
    def plugin_dir(self) -> Path:
        return Path(self.config["kubelet"]["device_plugin_dir"])

    def socket(self, resource: str) -> Path:
        return self.plugin_dir / socket_file_name(resource, len(str(self.plugin_dir)))

    def mock_folder(self, resource: str) -> Path:
        return Path(self.config["resources"][resource]["options"]["directory"])

    def start(self) -> float:
        """Start the daemon; returns ``time.time()`` just before the process was created."""
        at = time.time()
        self.process.start()
        return at

    def stop(self) -> None:
        if self.process.running():
            code = self.process.stop(30)
            if code != 0:
                raise RuntimeError(f"daemon exited {code}:\n{self.process.log_text()[-4000:]}")


class Workspace:
    """A short temporary folder under /tmp, removed at the end (kept with ``keep=True``).

    ``daemon_env``: added to the environment of every daemon its nodes start (``bench.compare`` runs another
    commit's daemons with its ``PYTHONPATH``, :meth:`bench.trees.Tree.daemon_env`)."""

    def __init__(self, keep: bool = False, daemon_env: Mapping[str, str] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
        self.keep = keep
        self.daemon_env = dict(daemon_env or {})

    def path(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def node(
        self,
        name: str,
        mocks: Mapping[str, tuple[int, int]],
        *,
        release_interval: float = DEFAULT_RELEASE_INTERVAL,
        grace_period: float = 10.0,
        log_level: str = "info",
        replicas: Mapping[str, int] | None = None,
        threaded_hooks: Collection[str] = (),
        liveness: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        handover: Mapping[str, Any] | None = None,
        daemon_env: Mapping[str, str] | None = None,
    ) -> Node:
        """A node ``name`` whose daemon serves one mock resource per ``mocks`` entry: name -> (devices, NUMA nodes);
        ``replicas``: the resources whose devices are shared, and by how many containers.

        The mock runs its hooks on the event loop (``inline_hooks``: they only append to the call log and look
        devices up in memory), but for the resources in ``threaded_hooks``, whose hooks take the thread hop every
        driver that touches sysfs or runs tools takes."""
        root = self.path(name)
        resources: dict[str, dict[str, Any]] = {}
        for i, (resource, (count, numa)) in enumerate(mocks.items()):
            folder = make_mock_folder(root / f"m{i}", count, numa)
            options = {"directory": str(folder), "inline_hooks": resource not in threaded_hooks}
            resources[resource] = {"driver": "mock", "options": options}
            if replicas and resource in replicas:
                resources[resource]["replicas"] = replicas[resource]
        config = dev_config(
            root,
            resources,
            release_interval=release_interval,
            grace_period=grace_period,
            liveness=liveness,
            metrics=metrics,
            handover=handover,
        )
        config_path = write_toml(root / "devplug.toml", config)
        env = self.daemon_env if daemon_env is None else daemon_env
        process = DaemonProcess(config_path, root / "daemon.log", log_level=log_level, env=env)
        return Node(root, config, config_path, process)

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
