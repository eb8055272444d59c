"""Resetting a network VF's administrative settings on its PF, through netlink (pyroute2).

A VF's MAC, VLAN, spoof-check, trust and link state are attributes of the
PF's link (``IFLA_VFINFO_LIST``, ``include/uapi/linux/if_link.h``), set with
``RTM_SETLINK`` on the PF. :class:`VfLinks` is the narrow interface the driver
uses; :class:`NetlinkVfLinks` is the real one (pyroute2, the maintained
netlink library; never a shell-out to ``ip``), and
:class:`devplug_sriov.vfmodel.VfLinkModel` a model of the same attributes for
tests, as no virtual device (dummy, veth) implements them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from devplug import DriverError

__all__ = ["LINK_STATE_AUTO", "NetlinkVfLinks", "VfLinks", "VfSettings"]

#: ``IFLA_VF_LINK_STATE_AUTO``: the VF's link follows the PF's.
LINK_STATE_AUTO = 0
_IFF_UP = 0x1
_IFF_LOWER_UP = 0x10000
ZERO_MAC = "00:00:00:00:00:00"


@dataclass(frozen=True)
class VfSettings:
    """A VF's administrative settings on its PF."""

    mac: str = ZERO_MAC
    vlan: int = 0
    spoofchk: bool = True
    trust: bool = False
    link_state: int = LINK_STATE_AUTO


class VfLinks(Protocol):
    """What the driver does with netlink."""

    def link_up(self, ifname: str) -> bool:
        """True when the interface is up and has carrier; :class:`DriverError` when it does not exist."""
        ...

    def reset_vf(self, pf_ifname: str, vf: int, settings: VfSettings) -> None:
        """Set VF ``vf`` of ``pf_ifname`` to ``settings``; :class:`DriverError` naming both when refused."""
        ...


class NetlinkVfLinks:
    """:class:`VfLinks` over rtnetlink with pyroute2, in the daemon's network namespace or ``netns``."""

    def __init__(self, netns: str = "") -> None:
        self.netns = netns

    def _ipr(self) -> Any:
        from pyroute2 import IPRoute

        return IPRoute(netns=self.netns) if self.netns else IPRoute()

    def _where(self) -> str:
        return f" in network namespace {self.netns}" if self.netns else ""

    def _index(self, ipr: Any, ifname: str) -> int:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise DriverError(f"network interface {ifname} not found{self._where()}")
        return int(found[0])

    def link_up(self, ifname: str) -> bool:
        """Up (``IFF_UP``) with carrier (``IFF_LOWER_UP``)."""
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            with self._ipr() as ipr:
                msg = ipr.link("get", index=self._index(ipr, ifname))[0]
        except NetlinkError as exc:
            raise DriverError(f"{ifname}: cannot read the link{self._where()}: {exc}") from exc
        flags = int(msg["flags"])
        return bool(flags & _IFF_UP) and bool(flags & _IFF_LOWER_UP)

    def reset_vf(self, pf_ifname: str, vf: int, settings: VfSettings) -> None:
        """One ``RTM_SETLINK`` on the PF carrying every VF attribute."""
        from pyroute2.netlink.exceptions import NetlinkError

        spec = {
            "vf": vf,
            "mac": settings.mac,
            "vlan": settings.vlan,
            "spoofchk": int(settings.spoofchk),
            "trust": int(settings.trust),
            "link_state": settings.link_state,
        }
        try:
            with self._ipr() as ipr:
                ipr.link("set", index=self._index(ipr, pf_ifname), vf=spec)
        except NetlinkError as exc:
            raise DriverError(
                f"{pf_ifname} VF {vf}: the kernel refused to reset its settings (MAC, VLAN, spoof-check, trust, "
                f"link state){self._where()}: {exc}"
            ) from exc
