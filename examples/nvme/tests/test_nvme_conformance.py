"""The NVMe-like example driver against the driver contract checks: a real daemon, the dev kubelet, pods, on the
class-tree model with a fake erase tool. The driver is not installed: the daemon loads it as a test driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from devplug import ContainerAllocation, DeviceSpec
from devplug.testing.classsysfs import SysfsClassModel
from devplug.testing.conformance import DriverConformance
from devplug.testing.fakecommand import FakeCommand

EXAMPLE = Path(__file__).resolve().parent.parent  # where nvme_example.py is


class TestNvmeConformance(DriverConformance):
    apis = ("device-plugin", "dra")
    driver = "nvme-example"
    resource = "example.com/nvme"
    test_drivers: ClassVar[Mapping[str, str]] = {"nvme-example": "nvme_example:NvmeDriver"}
    python_path: ClassVar[Sequence[Path]] = (EXAMPLE,)
    records_itself = False  # the kit's recording stand-in records the hook calls
    release_hooks = ("deallocate",)
    device_count = 2
    bad_option_key = "erase_timeout"

    def options(self, folder: Path) -> Mapping[str, Any]:
        machine = SysfsClassModel(folder / "machine")
        for number in range(self.device_count):
            if f"nvme{number}" not in machine.devices("nvme"):
                machine.add_device("nvme", f"nvme{number}", {"state": "live"}, number=(240, number))
        tool = FakeCommand(folder / "tool", name="nvme")
        return {
            "sysfs_root": str(machine.sysfs_root),
            "dev_root": str(machine.dev_root),
            "erase_command": [str(tool.path), "format", "{device}", "--ses=1"],
            "erase_timeout": 300.0,
        }

    def node_dev_root(self, folder: Path) -> Path:
        return folder / "machine" / "dev"  # the model's /dev/nvmeN

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        assert allocation.devices == tuple(DeviceSpec(f"/dev/{d}", f"/dev/{d}", "rw") for d in device_ids)
        assert allocation.envs["NVME_DEVICES"] == ",".join(device_ids)

    def slow_release(self, folder: Path, device_id: str) -> bool:
        node = folder / "machine" / "dev" / device_id
        FakeCommand(folder / "tool", name="nvme").behave({f"format:{node}": {"hang": True}})
        return True

    def fast_release(self, folder: Path, device_id: str) -> None:
        tool = FakeCommand(folder / "tool", name="nvme")
        tool.behave()
        tool.release("format")

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {**self.options(folder), "erase_timeout": -1}
