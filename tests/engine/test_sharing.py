"""Shared devices through the engine with drivers of the test's own: a driver's preferred allocation choosing
physical devices (the core picks their free replicas), and hooks declaring ``replicas`` or not."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from devplug import ContainerAllocation, Device, Replicas, hookimpl
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import DevKubeletThread
from devplug.testing.daemon import DaemonThread

from .conftest import PluginClient, in_process_config

RESOURCE = "example.com/gpu"


class ChoosesTheLastDevice:
    """Prefers gpu2 for everything; records what its hooks saw."""

    seen: ClassVar[list[tuple[str, Any, Any]]] = []

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("gpu0"), Device("gpu1"), Device("gpu2")]

    @hookimpl
    def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int, replicas: Replicas
    ) -> list[str]:
        self.seen.append(("preferred", [d.id for d in available], dict(replicas.by_device)))
        return ["gpu2"] * size

    @hookimpl
    def allocate(self, device_ids: Sequence[str], replicas: Replicas) -> ContainerAllocation:
        self.seen.append(("allocate", list(device_ids), dict(replicas.by_device)))
        return ContainerAllocation(envs={"GPUS": ",".join(device_ids)})

    @hookimpl
    def deallocate(self, device_ids: Sequence[str]) -> None:  # written before sharing: no replicas argument
        self.seen.append(("deallocate", list(device_ids), None))


def _last() -> tuple[str, Any, Any]:
    """What the driver's last hook call saw."""
    return ChoosesTheLastDevice.seen[-1]


def _preferred(client: PluginClient, available: list[str], must: list[str], size: int) -> list[str]:
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    answer = client.call("GetPreferredAllocation", request, dp.PreferredAllocationResponse)
    return list(answer.container_responses[0].deviceIDs)


def test_a_drivers_physical_choice_becomes_free_replicas(dev_kubelet: DevKubeletThread, devplug_root: Path) -> None:
    ChoosesTheLastDevice.seen = []
    config = in_process_config(devplug_root, {RESOURCE: ChoosesTheLastDevice}, replicas=3)
    with DaemonThread(config) as daemon:
        dev_kubelet.wait_registered(RESOURCE, timeout=10)
        client = PluginClient(Path(daemon.daemon.resources[0].endpoint))
        try:
            available = ["gpu0::0", "gpu1::0", "gpu2::0", "gpu2::2"]
            assert _preferred(client, available, ["gpu0::0"], 3) == ["gpu0::0", "gpu2::0", "gpu2::2"]
            assert _last() == (
                "preferred",
                ["gpu0", "gpu1", "gpu2"],
                {"gpu0": ("gpu0::0",), "gpu1": ("gpu1::0",), "gpu2": ("gpu2::0", "gpu2::2")},
            )
            answer = client.allocate(["gpu2::0", "gpu2::2"])
            assert answer.container_responses[0].envs["GPUS"] == "gpu2"
            assert answer.container_responses[0].envs["DEVPLUG_SHARED_DEVICES_EXAMPLE_COM_GPU"] == "gpu2"
            assert _last() == ("allocate", ["gpu2"], {"gpu2": ("gpu2::0", "gpu2::2")})
            client.call("Deallocate", dp.DeallocateRequest(devices_ids=["gpu2::0", "gpu2::2"]), dp.DeallocateResponse)
            assert _last() == ("deallocate", ["gpu2"], None)
        finally:
            client.channel.close()
