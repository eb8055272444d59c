"""Preferred allocation, Allocate (several containers, all or nothing), pre-start, and the KEP calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import pytest

from devplug import ContainerAllocation, Device, hookimpl
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.daemon.status import read_status
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.errors import StateError
from devplug.testing.daemon import DaemonThread
from devplug.testing.plugin import DaemonFactory
from devplug_mock import read_calls

from .conftest import PluginClient, Wait, in_process_config, view_of

MOCK = "example.com/mock"
Client = Callable[[str], PluginClient]


def _mock(directory: Path, **options: object) -> dict[str, dict[str, object]]:
    return {MOCK: {"driver": "mock", "options": {"directory": str(directory), **options}}}


def _hooks(directory: Path, hook: str) -> list[list[str]]:
    return [c["device_ids"] for c in read_calls(directory) if c["hook"] == hook and "error" not in c]


def test_preferred_allocation_packs_one_numa_node(
    dev_kubelet: DevKubeletThread, devplug_daemon: DaemonFactory, mock_dir: Path
) -> None:
    # Node 0 has 2 devices, node 1 has 3: a request for 3 fits node 1 only.
    for name, node in [("a0", 0), ("a1", 0), ("b0", 1), ("b1", 1), ("b2", 1)]:
        (mock_dir / name).write_text(f"numa={node}\n")
    devplug_daemon(_mock(mock_dir))
    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {MOCK: 3})]))
    assert sorted(pod.containers[0].devices[MOCK]) == ["b0", "b1", "b2"]
    assert _hooks(mock_dir, "allocate") == [["b0", "b1", "b2"]]


def test_multi_container_allocate_answers_each_container(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client
) -> None:
    devplug_daemon(_mock(mock_dir, count=4))
    answer = plugin_client(MOCK).allocate(["mock0", "mock1"], ["mock2"])
    assert [dict(c.envs) for c in answer.container_responses] == [
        {"MOCK_DEVICES": "mock0,mock1"},
        {"MOCK_DEVICES": "mock2"},
    ]
    assert [d.container_path for d in answer.container_responses[1].devices] == ["/dev/mock/mock2"]
    assert _hooks(mock_dir, "allocate") == [["mock0", "mock1"], ["mock2"]]


@pytest.mark.parametrize(
    ("containers", "named"),
    [
        ([["mock0", "gpu9"]], "unknown device IDs: gpu9"),
        ([["mock0"], ["mock3"]], "unhealthy device IDs: mock3"),
        ([["mock0"], ["mock1", "mock0"]], "duplicate device IDs: mock0"),
        ([["mock1", "mock1"]], "duplicate device IDs: mock1"),
    ],
)
def test_bad_device_ids_are_refused_and_nothing_is_done(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client, containers: list[list[str]], named: str
) -> None:
    for i in range(3):
        (mock_dir / f"mock{i}").write_text("")
    (mock_dir / "mock3").write_text("unhealthy\n")
    devplug_daemon(_mock(mock_dir))
    with pytest.raises(grpc.RpcError) as info:
        plugin_client(MOCK).allocate(*containers)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (info.value.details() or "")
    assert "nothing was allocated" in (info.value.details() or "")
    assert read_calls(mock_dir) == []


def test_unhealthy_request_runs_no_hook(devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client) -> None:
    (mock_dir / "sick").write_text("unhealthy\n")
    (mock_dir / "fine").write_text("")
    devplug_daemon(_mock(mock_dir))
    with pytest.raises(grpc.RpcError) as info:
        plugin_client(MOCK).allocate(["fine"], ["sick"])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unhealthy device IDs: sick" in (info.value.details() or "")
    assert read_calls(mock_dir) == []


def test_driver_failing_part_way_rolls_back_earlier_containers(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client
) -> None:
    devplug_daemon(_mock(mock_dir, count=3))
    (mock_dir / "mock2").write_text("fail=allocate\n")
    client = plugin_client(MOCK)
    with pytest.raises(grpc.RpcError) as info:
        client.allocate(["mock0"], ["mock1"], ["mock2"])
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "mock2" in (info.value.details() or "") and "rolled back" in (info.value.details() or "")
    calls = [(c["hook"], c["device_ids"], "error" in c) for c in read_calls(mock_dir)]
    assert calls == [
        ("allocate", ["mock0"], False),
        ("allocate", ["mock1"], False),
        ("allocate", ["mock2"], True),
        ("deallocate", ["mock2"], False),
        ("deallocate", ["mock1"], False),
        ("deallocate", ["mock0"], False),
    ]
    # Nothing is held: the same devices can be allocated at once (a held device would need a pod to reuse it).
    (mock_dir / "mock2").write_text("")
    answer = client.allocate(["mock0", "mock1", "mock2"])
    assert dict(answer.container_responses[0].envs) == {"MOCK_DEVICES": "mock0,mock1,mock2"}


def test_pre_start_at_every_container_start(
    dev_kubelet: DevKubeletThread, devplug_daemon: DaemonFactory, mock_dir: Path
) -> None:
    devplug_daemon(_mock(mock_dir, count=2))
    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {MOCK: 1})]))
    dev_kubelet.start_container("p", "c")
    dev_kubelet.start_container("p", "c")
    device = list(pod.containers[0].devices[MOCK])
    assert _hooks(mock_dir, "pre_start") == [device, device, device]


def test_kep_mode_calls_post_stop_then_deallocate_once(
    dev_kubelet: DevKubeletThread, devplug_daemon: DaemonFactory, mock_dir: Path, wait_until: Wait
) -> None:
    dev_kubelet.kep_mode = True
    devplug_daemon(_mock(mock_dir, count=3), release_interval=0.05)
    pod = dev_kubelet.admit_pod(
        PodSpec("p", [ContainerSpec("init", {MOCK: 1}, init=True), ContainerSpec("app", {MOCK: 2})])
    )
    app = sorted(pod.containers[1].devices[MOCK])
    dev_kubelet.remove_pod("p")
    assert [e.kind for e in dev_kubelet.events if e.kind in ("post-stop", "deallocate")][-1] == "deallocate"
    wait_until(lambda: sorted(d for c in _hooks(mock_dir, "deallocate") for d in c) == app, "the KEP's deallocate")
    hooks = [c["hook"] for c in read_calls(mock_dir) if c["hook"] in ("post_stop", "deallocate")]
    assert hooks.index("post_stop") < hooks.index("deallocate")
    # The KEP release emptied the ledger, so the reconciler has nothing left to release a second time.
    wait_until(lambda: _allocated(dev_kubelet) == 0, "the ledger to be empty")
    assert sorted(d for c in _hooks(mock_dir, "deallocate") for d in c) == app
    assert len(_hooks(mock_dir, "post_stop")) == 2  # one PostStopContainer per container that held devices
    wait_until(lambda: view_of(dev_kubelet, MOCK).allocatable == 3, "every device allocatable")


def _allocated(kubelet: DevKubeletThread) -> int:
    try:
        status = read_status(kubelet.device_plugin_dir.parent / "state")
    except StateError:  # not written yet
        return -1
    return int(status["resources"][0]["counts"]["allocated"])


class Conflicting:
    """A driver whose two allocate contributions disagree, through an extra plugin it registers."""

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("c0")]

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        return ContainerAllocation(envs={"MODE": "a"})


def test_conflicting_contributions_fail_the_allocation(dev_kubelet: DevKubeletThread, devplug_root: Path) -> None:
    config = in_process_config(devplug_root, {"example.com/conflict": Conflicting})
    with DaemonThread(config) as daemon:
        dev_kubelet.wait_registered("example.com/conflict", timeout=10)

        class Other:
            @hookimpl
            def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
                return ContainerAllocation(envs={"MODE": "b"})

        hooks = daemon.daemon.resources[0].hooks
        assert hooks is not None
        hooks.pm.register(Other())
        client = PluginClient(Path(daemon.daemon.resources[0].endpoint))
        with pytest.raises(grpc.RpcError) as info:
            client.allocate(["c0"])
        client.channel.close()
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "env 'MODE' is set twice" in (info.value.details() or "")


def test_preferred_allocation_rpc_stays_within_available(
    devplug_daemon: DaemonFactory, mock_dir: Path, plugin_client: Client
) -> None:
    devplug_daemon(_mock(mock_dir, count=6))
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=["mock1", "mock3", "mock5"], must_include_deviceIDs=["mock3"], allocation_size=2
            )
        ]
    )
    answer = plugin_client(MOCK).call("GetPreferredAllocation", request, dp.PreferredAllocationResponse)
    chosen = list(answer.container_responses[0].deviceIDs)
    assert len(chosen) == 2 and chosen[0] == "mock3" and set(chosen) <= {"mock1", "mock3", "mock5"}
