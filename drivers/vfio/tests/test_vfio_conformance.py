"""devplug-vfio against the kit's driver contract checks, on the kernel model (no VM needed).

The daemon under test loads ``vfio-model`` (:mod:`vfio_on_model`, a test double declared
through ``test_drivers``): the real driver on a :class:`~devplug.testing.pcisysfs.PciSysfsModel`
shared with the child process through its state file, its hook calls recorded by the kit's stand-in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from devplug import ContainerAllocation, DeviceSpec
from devplug.testing.conformance import DriverConformance
from devplug.testing.pcisysfs import SLOW_UNBIND_FILE, model_options

HERE = Path(__file__).resolve().parent


class TestVfioConformance(DriverConformance):
    apis = ("device-plugin", "dra")
    driver = "vfio-model"
    test_drivers: ClassVar[Mapping[str, str]] = {"vfio-model": "vfio_on_model:VfioOnModel"}
    python_path = (HERE,)
    resource = "example.com/nic"
    device_count = 2
    release_hooks = ("deallocate",)  # vfio has no post_stop hook
    records_itself = False  # the kit's recording stand-in watches it
    bad_option_key = "rescan_interval"

    def options(self, folder: Path) -> Mapping[str, Any]:
        machine = folder / "machine"
        return {
            "devices": ["8086:10d3"],
            "rescan_interval": 0,
            **model_options(machine),
        }

    def node_dev_root(self, folder: Path) -> Path:
        return folder / "machine" / "dev"  # the model's /dev/vfio

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        assert dict(allocation.envs) == {"PCI_RESOURCE_EXAMPLE_COM_NIC": ",".join(device_ids)}
        assert DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw") in allocation.devices
        assert len(allocation.devices) == 1 + len(device_ids)  # one group per NIC

    def slow_release(self, folder: Path, device_id: str) -> bool:
        (folder / "machine" / SLOW_UNBIND_FILE).write_text(f"{device_id}\n")  # only its unbind waits
        return True

    def fast_release(self, folder: Path, device_id: str) -> None:
        (folder / "machine" / SLOW_UNBIND_FILE).unlink()

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {**self.options(folder), "rescan_interval": -1}
