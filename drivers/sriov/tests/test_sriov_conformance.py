"""devplug-sriov against the kit's driver contract checks, on the kernel model (no VM needed).

The daemon under test loads ``sriov-model`` (:mod:`sriov_on_model`, a test double declared through
``test_drivers``): the real driver on a :class:`~devplug.testing.pcisysfs.PciSysfsModel` of an SR-IOV NVMe
controller, shared with the child process through its state file; the VFs go to vfio-pci for their pods and
back on release. Its hook calls are recorded by the kit's stand-in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from devplug import ContainerAllocation, DeviceSpec
from devplug.testing.conformance import DriverConformance
from devplug.testing.pcisysfs import SLOW_UNBIND_FILE, device_iommu_group, model_options, shared_model

HERE = Path(__file__).resolve().parent
PF = "0000:02:00.0"  # sriov_on_model.PF (test modules cannot import each other)


class TestSriovConformance(DriverConformance):
    apis = ("device-plugin", "dra")
    driver = "sriov-model"
    test_drivers: ClassVar[Mapping[str, str]] = {"sriov-model": "sriov_on_model:SriovOnModel"}
    python_path = (HERE,)
    records_itself = False
    resource = "example.com/vf"
    device_count = 2
    release_hooks = ("deallocate",)  # sriov has no post_stop hook
    bad_option_key = "num_vfs"

    def options(self, folder: Path) -> Mapping[str, Any]:
        machine = folder / "machine"
        return {
            "pfs": [PF],
            "num_vfs": self.device_count,
            "vf_driver": "vfio-pci",
            "rescan_interval": 0,
            **model_options(machine),
        }

    def node_dev_root(self, folder: Path) -> Path:
        return folder / "machine" / "dev"  # the model's /dev/vfio

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        assert dict(allocation.envs) == {"PCIDEVICE_EXAMPLE_COM_VF": ",".join(device_ids)}
        model = shared_model(folder / "machine", lambda _: None)
        groups = sorted({device_iommu_group(model, vf) for vf in device_ids})
        assert allocation.devices == (
            DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
            *(DeviceSpec(f"/dev/vfio/{g}", f"/dev/vfio/{g}", "rw") for g in groups),
        )

    def slow_release(self, folder: Path, device_id: str) -> bool:
        (folder / "machine" / SLOW_UNBIND_FILE).write_text(f"{device_id}\n")  # only this VF's unbind waits
        return True

    def fast_release(self, folder: Path, device_id: str) -> None:
        (folder / "machine" / SLOW_UNBIND_FILE).unlink()

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {**self.options(folder), "num_vfs": -1}


class TestSriovConformanceWithDeviceStatus(TestSriovConformance):
    """The same contract with ``device_status`` on: each VF's status from allocate (an NVMe controller's VFs:
    data only, no interface), while the kubelet sees what it saw without it."""

    def options(self, folder: Path) -> Mapping[str, Any]:
        return {**super().options(folder), "device_status": True}
