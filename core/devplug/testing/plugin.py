"""devplug's pytest plugin (entry point ``pytest11``): a dev kubelet and a real daemon per test.

Fixtures:

* ``devplug_root`` -- a short temporary folder (unix socket paths must stay
  under 108 bytes, so not pytest's ``tmp_path``);
* ``dev_kubelet`` -- a started :class:`~devplug.devkubelet.DevKubeletThread`
  serving ``<root>/device-plugins/kubelet.sock`` and
  ``<root>/pod-resources/kubelet.sock``;
* ``devplug_daemon`` -- a factory: ``devplug_daemon({"example.com/x": {"driver":
  "mine", "options": {...}}})`` writes a config under the root, starts
  ``devplug run`` as a child process, waits until every resource registered
  with ``dev_kubelet`` and sent its first device list, and returns the :class:`RunningDaemon`. Daemons still
  running at the end of the test get SIGTERM, and must exit 0.

A driver's suite needs nothing else::

    def test_allocate(dev_kubelet, devplug_daemon):
        devplug_daemon({"example.com/x": {"driver": "mine"}})
        pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {"example.com/x": 1})]))
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devplug.devkubelet import DevKubelet, DevKubeletThread
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.daemon import DaemonProcess

__all__ = ["RunningDaemon"]


@dataclass
class RunningDaemon:
    """A daemon started by the ``devplug_daemon`` fixture."""

    process: DaemonProcess
    config_path: Path
    config: dict[str, Any]
    root: Path

    @property
    def state_dir(self) -> Path:
        return Path(self.config["state"]["dir"])

    def restart(self, kubelet: DevKubeletThread, timeout: float = 10.0) -> None:
        """Stop (SIGTERM) and start again; wait until every resource registered again."""
        self.process.stop()
        counts = {name: kubelet.registrations(name) for name in self.config["resources"]}
        self.process.start()
        for name, count in counts.items():
            kubelet.wait_registered(name, timeout=timeout, after=count)


def _first_list_of(resource: str) -> Callable[[DevKubelet], bool]:
    def arrived(kubelet: DevKubelet) -> bool:
        return bool(kubelet.events_of("list-and-watch", resource))

    return arrived


@pytest.fixture
def devplug_root() -> Iterator[Path]:
    """A fresh short folder under /tmp, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dev_kubelet(devplug_root: Path) -> Iterator[DevKubeletThread]:
    """A started dev kubelet in ``devplug_root``."""
    kubelet = DevKubeletThread(
        devplug_root / "device-plugins",
        pod_resources_socket=devplug_root / "pod-resources" / "kubelet.sock",
    )
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.close()


DaemonFactory = Callable[..., RunningDaemon]


@pytest.fixture
def devplug_daemon(devplug_root: Path, dev_kubelet: DevKubeletThread) -> Iterator[DaemonFactory]:
    """Start ``devplug run`` on a config of the given resources; wait for their registration."""
    started: list[RunningDaemon] = []

    def start(
        resources: Mapping[str, Mapping[str, Any]],
        *,
        wait: bool = True,
        timeout: float = 15.0,
        **config_options: Any,
    ) -> RunningDaemon:
        config = dev_config(devplug_root, resources, **config_options)
        path = write_toml(devplug_root / f"devplug-{len(started)}.toml", config)
        process = DaemonProcess(path, devplug_root / f"daemon-{len(started)}.log")
        daemon = RunningDaemon(process, path, config, devplug_root)
        started.append(daemon)
        process.start()
        if wait:
            for name in resources:
                try:
                    dev_kubelet.wait_registered(name, timeout=timeout)
                    # ...and the first device list arrived, so pods can be admitted at once.
                    dev_kubelet.wait_for(_first_list_of(name), timeout=timeout, what=f"the first device list of {name}")
                except TimeoutError as exc:
                    raise TimeoutError(f"{exc}\n--- daemon log ---\n{process.log_text()}") from exc
        return daemon

    yield start
    failures = []
    for daemon in started:
        if daemon.process.running():
            code = daemon.process.stop()
            if code != 0:
                failures.append(f"daemon exited {code}:\n{daemon.process.log_text()}")
    if failures:
        pytest.fail("\n".join(failures))
