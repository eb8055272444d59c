"""The vfio driver's options: which PCI devices a resource takes, and how it binds them.

::

    [resources."example.com/nic"]
    driver = "vfio"
    options = { vendors = ["8086"], classes = ["0200"], bind = "on-allocate" }

Selection keys (every key given must match; within a key, any entry may):

* ``vendors`` -- vendor IDs, hex (``"8086"``);
* ``devices`` -- ``"vendor:device"`` ID pairs, hex (``"8086:10d3"``);
* ``addresses`` -- PCI addresses or shell globs (``"0000:3b:00.*"``; a missing
  domain means ``0000``);
* ``classes`` -- class code prefixes, hex: 2, 4 or 6 digits (``"02"``, ``"0200"``);
* ``drivers`` -- the device's own driver (before devplug moved it to vfio-pci);
* ``exclude_addresses`` -- addresses or globs never taken.

At least one of the first five is required: a resource never takes every PCI
device. Bridges are never taken (vfio-pci refuses them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from devplug.host.sysfs import check_roots
from devplug.kit.rescan import check_rescan_interval

__all__ = ["BindMode", "VfioOptions"]

BindMode = Literal["on-allocate", "at-start"]

_HEX4 = re.compile(r"^(0x)?[0-9a-f]{4}$")
_PAIR = re.compile(r"^(0x)?([0-9a-f]{4}):(0x)?([0-9a-f]{4})$")
_CLASS = re.compile(r"^(0x)?([0-9a-f]{2}|[0-9a-f]{4}|[0-9a-f]{6})$")
_GLOB = re.compile(r"^[0-9a-f:.*?\[\]!-]+$")


def _hex4(value: str, key: str) -> str:
    value = value.strip().lower()
    if not _HEX4.match(value):
        raise ValueError(f"{key}: {value!r} is not a 4-digit hex ID like '8086'")
    return value.removeprefix("0x")


def _pair(value: str) -> str:
    match = _PAIR.match(value.strip().lower())
    if not match:
        raise ValueError(f"devices: {value!r} is not a 'vendor:device' hex pair like '8086:10d3'")
    return f"{match.group(2)}:{match.group(4)}"


def _class(value: str) -> str:
    match = _CLASS.match(value.strip().lower())
    if not match:
        raise ValueError(f"classes: {value!r} is not a class code prefix of 2, 4 or 6 hex digits like '0200'")
    return match.group(2)


def _glob(value: str, key: str) -> str:
    value = value.strip().lower()
    if not value or not _GLOB.match(value):
        raise ValueError(f"{key}: {value!r} is not a PCI address or glob like '0000:3b:00.0' or '0000:3b:*'")
    if value.count(":") == 1:  # bus:slot.function without a domain
        value = "0000:" + value
    return value


@dataclass(frozen=True)
class VfioOptions:
    """Options of one vfio resource (see the module docstring for the selection keys).

    ``bind``: ``"on-allocate"`` (default) keeps a free device on its own driver
    and moves it to vfio-pci for the pod; ``"at-start"`` moves every selected
    device at start and keeps it there.
    ``allow_partial_groups``: accept IOMMU groups that also hold bridges this
    resource does not select (they stay on pcieport or without a driver, as
    the kernel permits); other foreign devices are still refused.
    ``sysfs_root``, ``dev_root``: where this daemon finds the host's sysfs and
    /dev (a container may mount them elsewhere); device specs handed to the
    kubelet always name the host's own ``/dev/vfio/...`` paths. Neither may
    point into another kernel tree (``sysfs_root`` under ``/proc`` or ``/dev``,
    ``dev_root`` under ``/proc`` or ``/sys``).
    ``rescan_interval``: seconds between scans for hot-plugged or removed
    devices (0: only when the engine lists devices or checks health).
    """

    vendors: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    exclude_addresses: tuple[str, ...] = ()
    bind: BindMode = "on-allocate"
    allow_partial_groups: bool = False
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    rescan_interval: float = 5.0

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "vendors", tuple(_hex4(v, "vendors") for v in self.vendors))
        setattr_(self, "devices", tuple(_pair(v) for v in self.devices))
        setattr_(self, "addresses", tuple(_glob(v, "addresses") for v in self.addresses))
        setattr_(self, "classes", tuple(_class(v) for v in self.classes))
        setattr_(self, "exclude_addresses", tuple(_glob(v, "exclude_addresses") for v in self.exclude_addresses))
        for name in self.drivers:
            if not name or any(ch.isspace() or ch == "/" for ch in name):
                raise ValueError(f"drivers: {name!r} is not a kernel driver name like 'e1000e'")
        setattr_(self, "drivers", tuple(self.drivers))
        if not (self.vendors or self.devices or self.addresses or self.classes or self.drivers):
            raise ValueError(
                "select devices with at least one of vendors, devices, addresses, classes or drivers "
                "(a resource never takes every PCI device)"
            )
        if self.bind not in ("on-allocate", "at-start"):
            raise ValueError(f"bind: expected 'on-allocate' or 'at-start', got {self.bind!r}")
        check_rescan_interval(self.rescan_interval)
        check_roots(self.sysfs_root, self.dev_root)
