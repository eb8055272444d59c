"""SR-IOV as sysfs shows it: physical functions, their virtual functions, and the two knobs the set-up turns.

Attributes (``Documentation/ABI/testing/sysfs-bus-pci``): ``sriov_totalvfs``
(the most VFs), ``sriov_numvfs`` (enabled VFs; the kernel refuses a change
between two non-zero counts with ``EBUSY``), ``sriov_drivers_autoprobe``
(whether new VFs get a driver at once), ``virtfn<N>`` on the PF and
``physfn`` on each VF. A network function shows its interface under
``net/``; an RDMA-capable one its verbs device under ``infiniband_verbs/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from devplug import DriverError
from devplug.kit.pci import PciBus, PciDevice

__all__ = ["PhysFn", "SriovBus", "VirtFn"]

_VIRTFN = re.compile(r"^virtfn(\d+)$")


@dataclass(frozen=True)
class VirtFn:
    """One VF: its PCI function, the PF it belongs to and its index there."""

    dev: PciDevice
    pf: str
    index: int
    netdev: str | None

    @property
    def address(self) -> str:
        return self.dev.address


@dataclass(frozen=True)
class PhysFn:
    """One SR-IOV capable PF and its VFs (by index)."""

    dev: PciDevice
    total_vfs: int
    num_vfs: int
    autoprobe: bool
    netdev: str | None
    vfs: dict[int, str]

    @property
    def address(self) -> str:
        return self.dev.address


class SriovBus:
    """Reads PFs and VFs and writes the set-up knobs, through a :class:`devplug.kit.pci.PciBus`."""

    def __init__(self, bus: PciBus) -> None:
        self.bus = bus
        self.access = bus.access

    def _folder(self, address: str) -> Path:
        return self.bus.devices_dir / address

    def netdev(self, address: str) -> str | None:
        """The device's network interface (the first under ``net/``), if it has one."""
        folder = self._folder(address) / "net"
        try:
            names = self.access.listdir(folder) if self.access.is_dir(folder) else []
        except OSError:
            return None
        return names[0] if names else None

    def verbs(self, address: str) -> list[str]:
        """The device's RDMA verbs devices (``uverbs0``), empty without RDMA."""
        folder = self._folder(address) / "infiniband_verbs"
        try:
            return self.access.listdir(folder) if self.access.is_dir(folder) else []
        except OSError:
            return []

    def physfn(self, address: str) -> PhysFn | None:
        """The SR-IOV PF at ``address`` (``None``: absent, or not SR-IOV capable)."""
        folder = self._folder(address)
        if not self.access.exists(folder / "sriov_totalvfs"):
            return None  # checked first: most functions are not PFs, and each rescan looks at every one
        dev = self.bus.read(address)
        if dev is None:
            return None
        try:
            total = int(self.access.read_text(folder / "sriov_totalvfs"))
            num = int(self.access.read_text(folder / "sriov_numvfs"))
            autoprobe = self.access.read_text(folder / "sriov_drivers_autoprobe") != "0"
            vfs = {}
            for name in self.access.listdir(folder):
                match = _VIRTFN.match(name)
                if match:
                    target = self.access.link_name(folder / name)
                    if target is not None:
                        vfs[int(match.group(1))] = target
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise DriverError(f"{address}: cannot read its SR-IOV attributes: {exc}") from exc
        return PhysFn(dev, total, num, autoprobe, self.netdev(address), vfs)

    def physfns(self) -> dict[str, PhysFn]:
        """Every SR-IOV capable PF, by address."""
        found = {}
        for address in self.bus.addresses():
            pf = self.physfn(address)
            if pf is not None:
                found[address] = pf
        return found

    def virtfns(self, pf: PhysFn) -> list[VirtFn]:
        """The PF's VFs that are present, by index."""
        out = []
        for index, address in sorted(pf.vfs.items()):
            dev = self.bus.read(address)
            if dev is not None:
                out.append(VirtFn(dev, pf.address, index, self.netdev(address)))
        return out

    def set_num_vfs(self, pf: str, count: int) -> None:
        """Write ``sriov_numvfs``; an :class:`OSError` from the kernel becomes a :class:`DriverError`."""
        self._write(pf, "sriov_numvfs", str(count))

    def set_autoprobe(self, pf: str, enabled: bool) -> None:
        """Write ``sriov_drivers_autoprobe``."""
        self._write(pf, "sriov_drivers_autoprobe", "1" if enabled else "0")

    def _write(self, pf: str, name: str, value: str) -> None:
        try:
            self.access.write_text(self._folder(pf) / name, value)
        except OSError as exc:
            raise DriverError(f"{pf}: cannot write {value} to {name}: {exc}") from exc
