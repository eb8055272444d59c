"""A model of the VF attributes a PF keeps, behind :class:`devplug_sriov.netlink.VfLinks`, for tests.

Follows ``net/core/rtnetlink.c`` (``do_setvfinfo``) and the VF ``ndo_set_vf_*``
operations: each attribute of an ``RTM_SETLINK`` is applied in turn (MAC,
VLAN, spoof-check, link state, trust) and the first refusal stops the rest;
a VF index beyond the PF's VF count is ``EINVAL``; a device whose driver has
no SR-IOV operations (dummy, veth) refuses with ``EOPNOTSUPP``; an unknown
interface is ``ENODEV``. Those last two are what a network namespace shows
for real; the attributes themselves need SR-IOV hardware, hence this model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from devplug import DriverError
from devplug_sriov.netlink import VfSettings

__all__ = ["ModelPf", "VfLinkModel"]


@dataclass
class ModelPf:
    """One PF's link and its VFs' settings."""

    num_vfs: int
    up: bool = True
    sriov_ops: bool = True
    vfs: dict[int, VfSettings] = field(default_factory=dict)


class VfLinkModel:
    """PF links by interface name, with VF settings; counts every reset for tests."""

    def __init__(self) -> None:
        self.pfs: dict[str, ModelPf] = {}
        self.resets: list[tuple[str, int]] = []
        self.refuse: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def add_pf(self, ifname: str, num_vfs: int, *, sriov_ops: bool = True) -> ModelPf:
        with self._lock:
            pf = ModelPf(num_vfs, sriov_ops=sriov_ops)
            self.pfs[ifname] = pf
            return pf

    def set_vf(self, ifname: str, vf: int, **changes: object) -> None:
        """A tenant (or an admin) changes a VF's settings, as ``ip link set <pf> vf N ...`` would."""
        with self._lock:
            pf = self.pfs[ifname]
            pf.vfs[vf] = replace(pf.vfs.get(vf, VfSettings()), **changes)  # type: ignore[arg-type]

    def vf(self, ifname: str, vf: int) -> VfSettings:
        with self._lock:
            return self.pfs[ifname].vfs.get(vf, VfSettings())

    def set_link(self, ifname: str, up: bool) -> None:
        with self._lock:
            self.pfs[ifname].up = up

    def link_up(self, ifname: str) -> bool:
        with self._lock:
            pf = self.pfs.get(ifname)
            if pf is None:
                raise DriverError(f"network interface {ifname} not found")
            return pf.up

    def reset_vf(self, pf_ifname: str, vf: int, settings: VfSettings) -> None:
        with self._lock:
            pf = self.pfs.get(pf_ifname)
            if pf is None:
                raise DriverError(f"network interface {pf_ifname} not found: [Errno 19] No such device")
            if not pf.sriov_ops or (pf_ifname, vf) in self.refuse:
                raise DriverError(
                    f"{pf_ifname} VF {vf}: the kernel refused to reset its settings: [Errno 95] Operation not supported"
                )
            if vf >= pf.num_vfs:
                raise DriverError(f"{pf_ifname} VF {vf}: the kernel refused: [Errno 22] Invalid argument")
            pf.vfs[vf] = settings
            self.resets.append((pf_ifname, vf))
