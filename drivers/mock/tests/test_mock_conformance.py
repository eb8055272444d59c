"""The mock driver against the kit's driver contract checks (:class:`devplug.testing.conformance.DriverConformance`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devplug import ContainerAllocation, DeviceSpec, Mount
from devplug.testing.conformance import DriverConformance
from devplug.testing.devnodes import is_device_node


class TestMockConformance(DriverConformance):
    driver = "mock"
    resource = "example.com/mock"
    device_count = 3
    bad_option_key = "count"
    apis = ("device-plugin", "dra")

    def options(self, folder: Path) -> Mapping[str, Any]:
        return {"directory": str(folder / "devices"), "count": self.device_count}

    def calls_dir(self, folder: Path) -> Path:
        return folder / "devices"  # the mock keeps its record in its device folder

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        devices = folder / "devices"
        assert allocation == ContainerAllocation(
            envs={"MOCK_DEVICES": ",".join(device_ids)},
            devices=tuple(DeviceSpec(f"/dev/mock/{i}", str(devices / ".dev" / i), "rw") for i in device_ids),
            mounts=tuple(Mount(f"/var/run/mock/{i}", str(devices / i), read_only=True) for i in device_ids),
        )
        assert all(is_device_node(devices / ".dev" / i) for i in device_ids)  # containerd takes them

    def slow_release(self, folder: Path, device_id: str) -> bool:
        (folder / "devices" / device_id).write_text("delay=post_stop:120\n")
        return True

    def fast_release(self, folder: Path, device_id: str) -> None:
        (folder / "devices" / device_id).write_text("")

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {"directory": str(folder / "devices"), "count": -1}


class TestMockConformanceWithReplicas(TestMockConformance):
    """The same contract with every device shared by three containers (``replicas = 3``)."""

    replicas = 3


class TestMockConformanceWithDraWords(TestMockConformance):
    """The same contract with the mock's issue 41 options on: every device a part of one parent (each takes 1 of
    its 3 slots, so the counters forbid nothing the contract asks) and a status from every allocate; through the
    device-plugin API the kubelet sees what it saw without them."""

    def options(self, folder: Path) -> Mapping[str, Any]:
        parts = {f"mock{i}": {"slots": 1} for i in range(self.device_count)}
        return {
            **super().options(folder),
            "partitions": [{"parent": "board0", "counters": {"slots": self.device_count}, "devices": parts}],
            "device_status": "network",
        }
