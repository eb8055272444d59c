"""A test double of devplug-sriov for the daemon under test (test entry point ``sriov-model``): the real driver
on the kit's shared PCI model of the VM's SR-IOV NVMe controller (4 VFs at most, on nvme;
:func:`devplug.testing.pcisysfs.driver_on_model`: ``<model>/slow-unbind`` stretches a release). An NVMe PF has
no network interface, so releases reset no netlink settings and the netlink model stays empty."""

from __future__ import annotations

from devplug.testing.pcisysfs import PciSysfsModel, driver_on_model
from devplug_sriov import SriovDriver
from devplug_sriov.vfmodel import VfLinkModel

PF = "0000:02:00.0"
NVME = (0x1B36, 0x0010)


def build_machine(model: PciSysfsModel) -> None:
    """A root port and the NVMe PF on nvme, at most 4 VFs, each in an IOMMU group of its own."""
    model.add_device("0000:00:07.0", 0x1B36, 0x000C, 0x060400, iommu_group=8, driver="pcieport")
    model.add_device(PF, *NVME, 0x010802, iommu_group=9, driver="nvme")
    model.enable_sriov(PF, 4, NVME[1], vf_driver="nvme")


SriovOnModel = driver_on_model(SriovDriver, build_machine, links=VfLinkModel)
