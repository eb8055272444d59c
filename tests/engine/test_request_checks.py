"""PreStartContainer, PostStopContainer and Deallocate get the same ID checks as Allocate, and each
device is worked on by one call at a time (issue 8, failure 7)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import DevKubeletThread
from devplug.testing.plugin import DaemonFactory
from devplug_mock import read_calls

from .conftest import PluginClient, view_of

MOCK = "example.com/mock"
Client = Callable[[str], PluginClient]


def _start(devplug_daemon: DaemonFactory, mock_dir: Path, count: int = 3) -> None:
    devplug_daemon({MOCK: {"driver": "mock", "options": {"directory": str(mock_dir), "count": count}}})


def _calls(mock_dir: Path, hook: str) -> list[list[str]]:
    return [c["device_ids"] for c in read_calls(mock_dir) if c["hook"] == hook and "error" not in c]


def _pre_start(client: PluginClient, ids: list[str]) -> None:
    client.call("PreStartContainer", dp.PreStartContainerRequest(devices_ids=ids), dp.PreStartContainerResponse)


def _post_stop(client: PluginClient, ids: list[str]) -> None:
    client.call("PostStopContainer", dp.PostStopContainerRequest(devices_ids=ids), dp.PostStopContainerResponse)


def _deallocate(client: PluginClient, ids: list[str]) -> None:
    client.call("Deallocate", dp.DeallocateRequest(devices_ids=ids), dp.DeallocateResponse)


def _refused(call: Callable[[], None]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details() or ""


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        (["mock0", "mock0"], "duplicate device IDs: mock0"),
        (["mock0", "gpu7"], "unknown device IDs: gpu7"),
        (["mock0", "mock1"], "device IDs not allocated: mock1"),
        ([], "no device IDs requested"),
    ],
)
def test_pre_start_refuses_what_allocate_would_and_devices_never_allocated(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client, ids: list[str], named: str
) -> None:
    _start(devplug_daemon, mock_dir)
    client = plugin_client(MOCK)
    client.allocate(["mock0"])
    details = _refused(lambda: _pre_start(client, ids))
    assert named in details
    assert "nothing was done" in details
    assert _calls(mock_dir, "pre_start") == []


def test_pre_start_refuses_an_allocated_device_that_turned_unhealthy(
    dev_kubelet: DevKubeletThread,
    devplug_daemon: DaemonFactory,
    mock_dir: Path,
    plugin_client: Client,
    wait_until: Callable[..., None],
) -> None:
    _start(devplug_daemon, mock_dir)
    client = plugin_client(MOCK)
    client.allocate(["mock0"])
    _pre_start(client, ["mock0"])
    (mock_dir / "mock0").write_text("unhealthy\n")
    wait_until(lambda: view_of(dev_kubelet, MOCK).healthy_ids == ("mock1", "mock2"), "mock0 to turn unhealthy")
    details = _refused(lambda: _pre_start(client, ["mock0"]))
    assert "unhealthy device IDs: mock0" in details
    assert _calls(mock_dir, "pre_start") == [["mock0"]]


@pytest.mark.parametrize("call", ["PostStopContainer", "Deallocate"])
@pytest.mark.parametrize(
    ("ids", "named"),
    [(["mock0", "mock0"], "duplicate device IDs: mock0"), (["mock0", "gpu7"], "unknown device IDs: gpu7")],
)
def test_kep_calls_refuse_unknown_and_duplicate_ids_and_touch_nothing(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client, call: str, ids: list[str], named: str
) -> None:
    _start(devplug_daemon, mock_dir)
    client = plugin_client(MOCK)
    client.allocate(["mock0"])
    send = _post_stop if call == "PostStopContainer" else _deallocate
    details = _refused(lambda: send(client, ids))
    assert named in details and call in details
    assert _calls(mock_dir, "post_stop") == [] and _calls(mock_dir, "deallocate") == []


def test_kep_calls_pass_only_held_devices_to_the_driver(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client
) -> None:
    _start(devplug_daemon, mock_dir)
    client = plugin_client(MOCK)
    client.allocate(["mock0"])
    _post_stop(client, ["mock0", "mock1"])
    _deallocate(client, ["mock0", "mock1"])
    assert _calls(mock_dir, "post_stop") == [["mock0"]]
    assert _calls(mock_dir, "deallocate") == [["mock0"]]
    _deallocate(client, ["mock0"])  # already released: nothing reaches the driver
    assert _calls(mock_dir, "deallocate") == [["mock0"]]


def test_a_deallocate_racing_an_allocate_of_the_same_device_waits_for_it(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client
) -> None:
    _start(devplug_daemon, mock_dir)
    (mock_dir / "mock0").write_text("delay=allocate:1.5\n")
    client = plugin_client(MOCK)
    order: list[str] = []

    def allocate() -> None:
        client.allocate(["mock0"])
        order.append("allocate answered")

    thread = threading.Thread(target=allocate)
    thread.start()
    time.sleep(0.5)  # the only way to race: the Allocate is inside its 1.5 s hook by now
    _deallocate(client, ["mock0"])
    order.append("deallocate answered")
    thread.join(10)
    assert order == ["allocate answered", "deallocate answered"]
    calls = [(c["hook"], c["device_ids"]) for c in read_calls(mock_dir)]
    assert calls == [("allocate", ["mock0"]), ("deallocate", ["mock0"])]
    # The device the Allocate handed out was released after it, and is free: a fresh Allocate needs no release.
    client.allocate(["mock0"])
    assert [c["hook"] for c in read_calls(mock_dir)] == ["allocate", "deallocate", "allocate"]
