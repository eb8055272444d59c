"""Fixtures for the hardening suite (issue 9): hostile input, files and drivers against a real daemon.

Every test goes through the real thing: a ``devplug run`` child process (or the
``devplug`` command), the dev kubelet, real unix sockets and real files. Waits
are polls on a condition, bounded by a timeout; nothing asserts how long
something took. Test modules cannot import helpers (``--import-mode=importlib``),
so what they share is reached through the ``bench`` fixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplug.devkubelet import DevKubeletThread
from devplug.kube.names import resource_state_dir, socket_file_name
from devplug.testing.apiserver import ApiServer
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.conformance import poll_until
from devplug.testing.plugin import RunningDaemon

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"


class Bench:
    """One test's setting: the dev kubelet, a daemon factory, mock folders, and ways to poke and observe."""

    def __init__(self, root: Path, kubelet: DevKubeletThread, factory: Callable[..., RunningDaemon]) -> None:
        self.root = root
        self.kubelet = kubelet
        self.factory = factory
        self.daemon: RunningDaemon | None = None

    # --- configs and daemons

    def mock_table(self, resource: str = RESOURCE, count: int = 4, **extra: Any) -> dict[str, Any]:
        folder = self.root / ("mock" if resource == RESOURCE else "mock-" + resource.rsplit("/", 1)[1])
        return {"driver": "mock", "options": {"directory": str(folder), "count": count}, **extra}

    def start(self, resources: Mapping[str, Mapping[str, Any]] | None = None, **options: Any) -> RunningDaemon:
        """``devplug run`` on the dev kubelet's layout (default: one mock resource), registered and listed."""
        self.daemon = self.factory(resources or {RESOURCE: self.mock_table()}, **options)
        return self.daemon

    def write_config(self, resources: Mapping[str, Mapping[str, Any]] | None = None, **options: Any) -> Path:
        """A config file on the dev kubelet's layout, edited by ``edit(config)`` when given."""
        edit = options.pop("edit", None)
        config = dev_config(self.root, resources or {RESOURCE: self.mock_table()}, **options)
        if edit is not None:
            edit(config)
        return write_toml(self.root / "hardening.toml", config)

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """The ``devplug`` command, as an operator runs it (bounded by ``timeout``)."""
        return subprocess.run(
            [sys.executable, "-m", "devplug", *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "device-plugins"

    def resource_dir(self, resource: str = RESOURCE) -> Path:
        return resource_state_dir(self.state_dir, resource)

    # --- the plugin socket, as the kubelet (or anyone with access) uses it

    def socket(self, resource: str = RESOURCE) -> Path:
        return self.plugin_dir / socket_file_name(resource, len(str(self.plugin_dir)))

    def channel(self, resource: str = RESOURCE) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self.socket(resource)}")

    def call(self, method: str, request: Any, response_type: Any, resource: str = RESOURCE) -> Any:
        """``/v1beta1.DevicePlugin/<method>`` on the plugin socket."""
        with self.channel(resource) as channel:
            stub = channel.unary_unary(
                f"/v1beta1.DevicePlugin/{method}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=response_type.FromString,
            )
            return stub(request, timeout=30.0)

    def refused(self, method: str, request: Any, response_type: Any, resource: str = RESOURCE) -> grpc.RpcError:
        """The error a call that must fail got."""
        with pytest.raises(grpc.RpcError) as info:
            self.call(method, request, response_type, resource)
        error: grpc.RpcError = info.value
        return error

    # --- what the daemon says

    def log(self) -> str:
        assert self.daemon is not None, "no daemon started"
        return self.daemon.process.log_text()

    def status(self) -> dict[str, Any]:
        """The status file, once written by the running daemon."""
        assert self.daemon is not None, "no daemon started"
        pid = self.daemon.process.pid
        path = self.state_dir / "status.json"

        def read() -> dict[str, Any] | None:
            try:
                data: dict[str, Any] = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                return None
            return data if data.get("pid") == pid else None

        found: dict[str, Any] = self.wait(read, f"{path} written by pid {pid}")
        return found

    def resource_status(self, resource: str = RESOURCE) -> dict[str, Any]:
        found: dict[str, Any] = next(r for r in self.status()["resources"] if r["name"] == resource)
        return found

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
        """:func:`poll_until`, with the daemon log's tail on failure."""

        def tail() -> str:
            lines = self.log().splitlines()[-30:] if self.daemon is not None else []
            return "--- daemon log (tail) ---\n" + "\n".join(lines)

        return poll_until(predicate, what, timeout, details=tail)


@pytest.fixture
def bench(devplug_root: Path, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon]) -> Bench:
    """The setting; daemons it started are stopped (SIGTERM, must exit 0) by ``devplug_daemon``."""
    return Bench(devplug_root, dev_kubelet, devplug_daemon)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    """An API server stand-in for the DRA hardening tests."""
    with ApiServer() as server:
        yield server
