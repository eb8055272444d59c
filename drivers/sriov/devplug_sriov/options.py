"""The sriov driver's options: which physical functions it sets up, which VFs a resource pools, and how.

::

    [resources."intel.com/sriov-net"]
    driver = "sriov"
    options = { pfs = ["ens1f0"], num_vfs = 8, vfs = ["ens1f0#0-3"], vf_driver = "kernel" }

* ``pfs`` -- physical functions, each a PCI address (``"0000:3b:00.0"``, the
  domain may be left out), a network interface name (``"ens1f0"``) or a
  ``"vendor:device"`` ID pair (``"8086:1572"``: every SR-IOV PF with it);
* ``num_vfs`` -- VFs to create on each of ``pfs`` at start (unset: leave the
  count as found);
* ``vfs`` -- the pool by PF and VF index ranges, ``"<pf>#<first>-<last>"`` or
  ``"<pf>#<index>"`` (``"ens1f0#0-3"``, ``"0000:3b:00.0#4-7"``); unset: every
  VF of ``pfs``;
* ``vf_devices`` -- ``"vendor:device"`` of the VFs taken; ``vf_kernel_drivers`` --
  the VFs' own kernel driver (``"iavf"``);
* ``vf_driver`` -- ``"kernel"`` (the VF keeps its kernel driver: netdevice
  mode) or ``"vfio-pci"`` (bound to vfio-pci for the pod, restored on release);
* ``autoprobe`` -- ``sriov_drivers_autoprobe`` written on each of ``pfs``
  (unset: 0 for ``vfio-pci``, 1 for ``kernel``);
* ``spoofchk``, ``trust``, ``link_state`` -- what a released network VF's
  spoof check, trust and link state (``"auto"``, ``"enable"``, ``"disable"``)
  are reset to (see :mod:`devplug_sriov.reset`);
* ``pf_link_health`` -- a PF whose link is down makes its VFs unhealthy;
* ``netns`` -- the network namespace (``/var/run/netns/<name>``) where the PFs'
  interfaces are, when it is not the daemon's own;
* ``sysfs_root``, ``dev_root`` -- where the host's sysfs and /dev are mounted;
* ``device_status`` -- ``allocate`` returns each VF's PCI address, PF, interface name and MAC for the DRA
  claim's ``status.devices`` (:mod:`devplug_sriov.status`; default false);
* ``rescan_interval`` -- seconds between scans for VFs that vanished or appeared, and the first wait before a
  failed reset is retried, doubling after each failure up to a minute (0: no scans).

At least one of ``pfs``, ``vfs``, ``vf_devices``, ``vf_kernel_drivers`` is required.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from devplug.host.sysfs import check_roots
from devplug.kit.rescan import check_rescan_interval

__all__ = ["LinkState", "PfSelector", "SriovOptions", "VfDriverMode", "VfRange", "parse_pf_selector", "parse_vf_range"]

VfDriverMode = Literal["kernel", "vfio-pci"]
LinkState = Literal["auto", "enable", "disable"]

_ADDRESS = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_PAIR = re.compile(r"^(?:0x)?([0-9a-f]{4}):(?:0x)?([0-9a-f]{4})$")
_IFNAME = re.compile(r"^[^\s/:#]{1,15}$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class PfSelector:
    """One entry of ``pfs``: exactly one of ``address``, ``netdev``, ``ids`` is set."""

    text: str
    address: str | None = None
    netdev: str | None = None
    ids: tuple[int, int] | None = None


@dataclass(frozen=True)
class VfRange:
    """One entry of ``vfs``: VFs ``first``..``last`` of the PF ``pf``."""

    text: str
    pf: PfSelector
    first: int
    last: int

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and self.first <= index <= self.last


def parse_pf_selector(text: str, key: str = "pfs") -> PfSelector:
    """``"0000:3b:00.0"``, ``"3b:00.0"``, ``"8086:1572"`` or ``"ens1f0"``."""
    value = text.strip()
    lowered = value.lower()
    match = _ADDRESS.match(lowered)
    if match:
        return PfSelector(
            value, address=f"{match.group(1) or '0000'}:{match.group(2)}:{match.group(3)}.{match.group(4)}"
        )
    match = _PAIR.match(lowered)
    if match:
        return PfSelector(value, ids=(int(match.group(1), 16), int(match.group(2), 16)))
    if _IFNAME.match(value):
        return PfSelector(value, netdev=value)
    raise ValueError(
        f"{key}: {text!r} is not a PCI address ('0000:3b:00.0'), a network interface name ('ens1f0') "
        "or a 'vendor:device' pair ('8086:1572')"
    )


def parse_vf_range(text: str) -> VfRange:
    """``"ens1f0#0-3"``, ``"0000:3b:00.0#4"``."""
    pf_text, sep, indexes = text.partition("#")
    match = _RANGE.match(indexes.strip())
    if not sep or not match:
        raise ValueError(f"vfs: {text!r} is not '<pf>#<first>-<last>' or '<pf>#<index>' like 'ens1f0#0-3'")
    pf = parse_pf_selector(pf_text, "vfs")
    if pf.ids is not None:
        raise ValueError(f"vfs: {text!r}: name the PF by address or interface name, not by vendor:device")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last < first:
        raise ValueError(f"vfs: {text!r}: the range ends before it starts")
    return VfRange(text, pf, first, last)


def _pair(value: str) -> str:
    match = _PAIR.match(value.strip().lower())
    if not match:
        raise ValueError(f"vf_devices: {value!r} is not a 'vendor:device' hex pair like '8086:154c'")
    return f"{match.group(1)}:{match.group(2)}"


@dataclass(frozen=True)
class SriovOptions:
    """Options of one sriov resource (see the module docstring)."""

    pfs: tuple[str, ...] = ()
    num_vfs: int | None = None
    vfs: tuple[str, ...] = ()
    vf_devices: tuple[str, ...] = ()
    vf_kernel_drivers: tuple[str, ...] = ()
    vf_driver: VfDriverMode = "kernel"
    autoprobe: bool | None = None
    spoofchk: bool = True
    trust: bool = False
    link_state: LinkState = "auto"
    pf_link_health: bool = False
    netns: str = ""
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    rescan_interval: float = 5.0
    device_status: bool = False

    def __post_init__(self) -> None:
        for text in self.pfs:
            parse_pf_selector(text)
        for text in self.vfs:
            parse_vf_range(text)
        object.__setattr__(self, "vf_devices", tuple(_pair(v) for v in self.vf_devices))
        for name in self.vf_kernel_drivers:
            if not name or any(ch.isspace() or ch == "/" for ch in name):
                raise ValueError(f"vf_kernel_drivers: {name!r} is not a kernel driver name like 'iavf'")
        if not (self.pfs or self.vfs or self.vf_devices or self.vf_kernel_drivers):
            raise ValueError(
                "select VFs with at least one of pfs, vfs, vf_devices or vf_kernel_drivers "
                "(a resource never takes every VF of the node)"
            )
        if self.num_vfs is not None:
            if not self.pfs:
                raise ValueError("num_vfs: say on which physical functions to create them (pfs)")
            if not 0 <= self.num_vfs <= 4096:
                raise ValueError(f"num_vfs: must be from 0 to 4096, got {self.num_vfs}")
        if self.vf_driver not in ("kernel", "vfio-pci"):
            raise ValueError(f"vf_driver: expected 'kernel' or 'vfio-pci', got {self.vf_driver!r}")
        if self.link_state not in ("auto", "enable", "disable"):
            raise ValueError(f"link_state: expected 'auto', 'enable' or 'disable', got {self.link_state!r}")
        if self.netns and ("/" in self.netns or self.netns in (".", "..")):
            raise ValueError(f"netns: {self.netns!r} is not a network namespace name (as in /var/run/netns/)")
        check_rescan_interval(self.rescan_interval)
        check_roots(self.sysfs_root, self.dev_root)
        if not isinstance(self.device_status, bool):
            raise ValueError(f"device_status: must be true or false, got {self.device_status!r}")

    @property
    def pf_selectors(self) -> tuple[PfSelector, ...]:
        """``pfs``, parsed."""
        return tuple(parse_pf_selector(t) for t in self.pfs)

    @property
    def vf_ranges(self) -> tuple[VfRange, ...]:
        """``vfs``, parsed."""
        return tuple(parse_vf_range(t) for t in self.vfs)

    @property
    def wanted_autoprobe(self) -> bool:
        """``autoprobe``, or its default for ``vf_driver``."""
        if self.autoprobe is not None:
            return self.autoprobe
        return self.vf_driver == "kernel"
