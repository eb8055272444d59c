"""The idxd-like example driver against the driver contract checks through both front ends (the device plugin API
and DRA): a real daemon, the dev kubelet, pods, on the /sys/bus/dsa model. The driver is not installed: the daemon
loads it as a test driver, on the model (idxd_on_model.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from devplug import ContainerAllocation, DeviceSpec
from devplug.testing.bussysfs import SysBusModel
from devplug.testing.conformance import DriverConformance
from idxd_on_model import lay_out

EXAMPLE = Path(__file__).resolve().parent.parent  # where idxd_example.py is


class TestIdxdConformance(DriverConformance):
    apis = ("device-plugin", "dra")
    driver = "idxd-example"
    resource = "example.com/dsa"
    test_drivers: ClassVar[Mapping[str, str]] = {"idxd-example": "idxd_on_model:IdxdOnModel"}
    python_path: ClassVar[Sequence[Path]] = (EXAMPLE, EXAMPLE / "tests")
    records_itself = False  # the kit's recording stand-in records the hook calls
    release_hooks = ("deallocate",)
    device_count = 2
    bad_option_key = "bus"

    def options(self, folder: Path) -> Mapping[str, Any]:
        machine = SysBusModel(folder / "machine", "dsa")
        lay_out(machine, self.device_count)
        return {"sysfs_root": str(machine.sysfs_root), "dev_root": str(machine.dev_root)}

    def node_dev_root(self, folder: Path) -> Path:
        return folder / "machine" / "dev"  # the model's /dev/dsa/wqX.Y, made by the user driver

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        assert allocation.devices == tuple(DeviceSpec(f"/dev/dsa/{d}", f"/dev/dsa/{d}", "rw") for d in device_ids)
        assert allocation.envs["DSA_WQS"] == ",".join(device_ids)

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {**self.options(folder), "bus": "dsa/../pci"}
