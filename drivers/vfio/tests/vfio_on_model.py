"""A test double of devplug-vfio for the daemon under test (test entry point ``vfio-model``): the real driver on
the kit's shared PCI model, a host bridge and two e1000e NICs each alone in its IOMMU group
(:func:`devplug.testing.pcisysfs.driver_on_model`: ``<model>/slow-unbind`` stretches a release)."""

from __future__ import annotations

from devplug.testing.pcisysfs import PciSysfsModel, driver_on_model
from devplug_vfio import VfioDriver

NICS = ("0000:00:04.0", "0000:00:08.0")
E1000E = (0x8086, 0x10D3)


def build_machine(model: PciSysfsModel) -> None:
    """A host bridge and two NICs."""
    model.add_device("0000:00:00.0", 0x8086, 0x29C0, 0x060000, iommu_group=0)
    for group, address in enumerate(NICS, start=4):
        model.add_device(address, *E1000E, 0x020000, iommu_group=group, driver="e1000e")


VfioOnModel = driver_on_model(VfioDriver, build_machine)
