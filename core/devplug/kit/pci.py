"""PCI devices as sysfs shows them, and the two moves bind/unbind drivers make: to vfio-pci and back.

Shared by the drivers that hand PCI functions to containers through vfio-pci
(devplug-vfio, devplug-sriov), so the kernel's rules are written down once.
Everything goes through a :class:`devplug.host.sysfs.SysfsAccess`. The moves follow
the kernel's ``driver_override`` mechanism (``Documentation/ABI/testing/sysfs-bus-pci``):

* to vfio-pci: write ``vfio-pci`` to ``driver_override``, unbind the current
  driver, write the address to ``bus/pci/drivers_probe``, then check the
  ``driver`` link: a failed probe (no IOMMU, say) returns success from the
  write and leaves no driver;
* back: unbind vfio-pci, clear ``driver_override`` (write a newline: it then
  reads ``(null)``), probe again and check that the original driver took it.

``new_id`` is never used: it would make vfio-pci claim every device with that ID.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from devplug import DriverError
from devplug.host.sysfs import SysfsAccess
from devplug.kit.sysbus import SysBus

__all__ = ["VFIO_PCI", "PciBus", "PciDevice"]

VFIO_PCI = "vfio-pci"
_BRIDGE_CLASSES = (0x0604, 0x0609)

log = logging.getLogger("devplug.kit.pci")


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as read from sysfs."""

    address: str
    vendor: int
    device: int
    class_: int
    numa_node: int
    iommu_group: int | None
    driver: str | None

    @property
    def is_bridge(self) -> bool:
        """True for PCI-to-PCI bridges (type 1 header), which vfio-pci refuses."""
        return (self.class_ >> 8) in _BRIDGE_CLASSES

    def describe(self) -> str:
        """``0000:00:05.1 (1234:11e8, class 00ff00, driver none)``, for messages."""
        return (
            f"{self.address} ({self.vendor:04x}:{self.device:04x}, class {self.class_:06x}, "
            f"driver {self.driver or 'none'})"
        )


def _hex(text: str) -> int:
    return int(text, 16)


class PciBus(SysBus):
    """Reads PCI devices and moves them between drivers, through a :class:`SysfsAccess`.

    The ``pci`` case of :class:`devplug.kit.sysbus.SysBus` (its bind, unbind and rebind work here too), with what
    PCI adds: the functions' IDs, IOMMU groups and the move to vfio-pci and back.
    """

    def __init__(self, access: SysfsAccess) -> None:
        super().__init__(access, "pci", log=log)
        self.groups_dir = self.sys / "kernel" / "iommu_groups"
        self.vfio_dir = access.dev_root / "vfio"

    # --- reading

    def addresses(self) -> list[str]:
        """Every PCI address present."""
        if not self.access.is_dir(self.devices_dir):
            return []
        return self.access.listdir(self.devices_dir)

    def read(self, address: str) -> PciDevice | None:
        """The device at ``address``, or ``None`` when it is not (or no longer) there."""
        folder = self.devices_dir / address
        try:
            numa = int(self.access.read_text(folder / "numa_node") or "-1")
            group = self.access.link_name(folder / "iommu_group")
            return PciDevice(
                address=address,
                vendor=_hex(self.access.read_text(folder / "vendor")),
                device=_hex(self.access.read_text(folder / "device")),
                class_=_hex(self.access.read_text(folder / "class")),
                numa_node=numa,
                iommu_group=int(group) if group is not None else None,
                driver=self.access.link_name(folder / "driver"),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise DriverError(f"{address}: cannot read the device's sysfs attributes: {exc}") from exc

    def scan(self) -> dict[str, PciDevice]:
        """Every device present, by address."""
        found = {}
        for address in self.addresses():
            dev = self.read(address)
            if dev is not None:
                found[address] = dev
        return found

    def iommu_groups(self) -> list[str]:
        """The IOMMU groups the kernel has (empty without an IOMMU)."""
        if not self.access.is_dir(self.groups_dir):
            return []
        return self.access.listdir(self.groups_dir)

    def group_members(self, group: int) -> list[str]:
        """The addresses in an IOMMU group."""
        folder = self.groups_dir / str(group) / "devices"
        if not self.access.is_dir(folder):
            return []
        return self.access.listdir(folder)

    def vfio_node(self, group: int) -> Path:
        """``/dev/vfio/<group>`` under the dev root."""
        return self.vfio_dir / str(group)

    # --- moving

    def _unbind(self, address: str, driver: str) -> None:
        self._unbind_from(address, driver)

    def bind_vfio(self, address: str) -> None:
        """Move the device to vfio-pci; :class:`DriverError` when the kernel did not bind it."""
        self.bind_by_override(
            address, VFIO_PCI, hint="vfio-pci's probe fails without an IOMMU for the device, see the kernel log (dmesg)"
        )

    def restore(self, address: str, original: str | None) -> None:
        """Give the device back to ``original`` (``None``: leave it without a driver).

        Idempotent: safe to call again after a crash part-way. A device taken
        meanwhile by a driver other than vfio-pci is left with it.
        """
        self.give_back(address, original, taken_by=VFIO_PCI)
