"""ListAndWatch on hot-plug and health changes for every open stream; graceful shutdown."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import DevKubeletThread
from devplug.testing.plugin import DaemonFactory
from devplug_mock import read_calls

from .conftest import PluginClient, Wait, view_of

MOCK = "example.com/mock"
Client = Callable[[str], PluginClient]


def _mock(directory: Path, **options: object) -> dict[str, dict[str, object]]:
    return {MOCK: {"driver": "mock", "options": {"directory": str(directory), **options}}}


class StreamReader:
    """Reads one ListAndWatch stream in a thread; every list lands in a queue as {id: health}."""

    def __init__(self, client: PluginClient) -> None:
        self.lists: queue.Queue[dict[str, str]] = queue.Queue()
        self.stream: Any = client.list_and_watch()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for response in self.stream:
                self.lists.put({d.ID: d.health for d in response.devices})
        except grpc.RpcError:
            pass

    def next_matching(self, predicate: Callable[[dict[str, str]], bool], what: str) -> dict[str, str]:
        seen: list[dict[str, str]] = []
        while True:
            try:
                devices = self.lists.get(timeout=10)
            except queue.Empty:
                raise AssertionError(f"no list matching {what}; saw {seen}") from None
            seen.append(devices)
            if predicate(devices):
                return devices


def test_every_stream_gets_full_list_then_each_change(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client
) -> None:
    devplug_daemon(_mock(mock_dir, count=2))
    readers = [StreamReader(plugin_client(MOCK)) for _ in range(2)]
    for reader in readers:
        assert reader.lists.get(timeout=10) == {"mock0": "Healthy", "mock1": "Healthy"}

    (mock_dir / "mock7").write_text("")  # hot-plug
    for reader in readers:
        reader.next_matching(lambda d: "mock7" in d, "the hot-plugged mock7")
    (mock_dir / "mock0").write_text("unhealthy\n")  # health change
    for reader in readers:
        reader.next_matching(lambda d: d.get("mock0") == "Unhealthy", "mock0 unhealthy")
    (mock_dir / "mock0").write_text("")
    for reader in readers:
        reader.next_matching(lambda d: d.get("mock0") == "Healthy", "mock0 healthy again")
    (mock_dir / "mock1").unlink()  # removal
    for reader in readers:
        assert reader.next_matching(lambda d: "mock1" not in d, "mock1 removed") == {
            "mock0": "Healthy",
            "mock7": "Healthy",
        }
    for reader in readers:
        reader.stream.cancel()


def test_kubelet_sees_capacity_and_allocatable(
    dev_kubelet: DevKubeletThread, devplug_daemon: DaemonFactory, mock_dir: Path, wait_until: Wait
) -> None:
    devplug_daemon(_mock(mock_dir, count=3))
    wait_until(lambda: (view_of(dev_kubelet, MOCK).capacity, view_of(dev_kubelet, MOCK).allocatable) == (3, 3), "3/3")
    (mock_dir / "mock1").write_text("unhealthy\nnuma=1\n")
    wait_until(lambda: view_of(dev_kubelet, MOCK).allocatable == 2, "mock1 unhealthy at the kubelet")
    device = view_of(dev_kubelet, MOCK).device("mock1")
    assert device is not None and device.numa_nodes == (1,)


def test_sigterm_finishes_in_flight_calls_then_exits_cleanly(
    devplug_daemon: DaemonFactory,
    mock_dir: Path,
    plugin_client: Client,
    devplug_root: Path,
    wait_until: Wait,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEVPLUG_TRACE_HOOKS", "1")  # the log then shows each hook as it is entered
    daemon = devplug_daemon(_mock(mock_dir, count=2))
    (mock_dir / "mock1").write_text("delay=allocate:1.5\n")
    client = plugin_client(MOCK)
    result: dict[str, Any] = {}

    def allocate() -> None:
        try:
            result["answer"] = client.allocate(["mock1"])
        except grpc.RpcError as exc:
            result["error"] = exc

    caller = threading.Thread(target=allocate)
    caller.start()
    wait_until(lambda: "allocate [hook]" in daemon.process.log_text(), "the allocate hook to be entered")
    code = daemon.process.stop()  # SIGTERM while the hook sleeps
    caller.join(10)
    assert code == 0, daemon.process.log_text()
    assert "error" not in result, result.get("error")
    assert isinstance(result["answer"], dp.AllocateResponse)
    assert [c["hook"] for c in read_calls(mock_dir)] == ["allocate"]
    plugin_dir = devplug_root / "device-plugins"
    assert not (plugin_dir / "devplug-example.com_mock.sock").exists()
    assert (plugin_dir / "kubelet.sock").exists()  # the kubelet's socket is not the daemon's to remove
