"""A VF's administrative settings on its PF, read and set through netlink (pyroute2).

A VF's MAC, VLAN, spoof check, trust and link state are attributes of its
PF's link (``IFLA_VFINFO_LIST``, ``include/uapi/linux/if_link.h``):
``RTM_GETLINK`` reports them when asked with ``RTEXT_FILTER_VF`` in
``IFLA_EXT_MASK``, as ``ip link show`` asks (``net/core/rtnetlink.c``,
``rtnl_fill_vf`` and ``rtnl_fill_vfinfo``); ``RTM_SETLINK`` sets them
(``do_setvfinfo``). :class:`VfLinks` is the narrow interface the driver uses;
:class:`NetlinkVfLinks` is the real one (pyroute2, the maintained netlink
library; never a shell-out to ``ip``), and
:class:`devplug_sriov.vfmodel.VfLinkModel` a model of the same kernel
behaviour for tests, as no virtual device (dummy, veth) has VFs. Both reset a
VF the same way, :func:`devplug_sriov.reset.reset_vf` over their two
primitives (read a VF, set some of its attributes).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from devplug import DriverError

__all__ = [
    "LINK_STATES",
    "LINK_STATE_AUTO",
    "ZERO_MAC",
    "NetlinkVfLinks",
    "VfLinks",
    "VfRefused",
    "VfRequests",
    "VfSettings",
    "VfState",
    "describe_errno",
]

#: ``IFLA_VF_LINK_STATE_AUTO``: the VF's link follows the PF's. The value a driver without a link-state handler
#: reports (``rtnl_fill_vfinfo`` presets it).
LINK_STATE_AUTO = 0
#: ``IFLA_VF_LINK_STATE_*`` by the names ``ip link set <pf> vf N state ...`` takes.
LINK_STATES = {"auto": LINK_STATE_AUTO, "enable": 1, "disable": 2}
_IFF_UP = 0x1
_IFF_LOWER_UP = 0x10000
#: ``RTEXT_FILTER_VF`` (``include/uapi/linux/rtnetlink.h``): report the VFs in ``RTM_GETLINK``.
_RTEXT_FILTER_VF = 1
#: What the kernel reports for a spoof-check or trust setting the driver left unset (``rtnl_fill_vfinfo``: -1).
_NOT_REPORTED = 0xFFFFFFFF
ZERO_MAC = "00:00:00:00:00:00"


def describe_errno(code: int) -> str:
    """``[Errno 95] Operation not supported``: how an errno reads in messages."""
    return f"[Errno {code}] {os.strerror(code)}"


@dataclass(frozen=True)
class VfSettings:
    """What a released VF's administrative settings are reset to (VLAN 0 means no VLAN, and no QoS)."""

    mac: str = ZERO_MAC
    vlan: int = 0
    spoofchk: bool = True
    trust: bool = False
    link_state: int = LINK_STATE_AUTO


@dataclass(frozen=True)
class VfState:
    """What the PF reports for one VF (``RTM_GETLINK``, ``rtnl_fill_vfinfo``).

    ``spoofchk`` and ``trust`` are ``None`` when the driver does not report
    them (the kernel's -1: its ``ndo_get_vf_config`` left them unset).
    """

    mac: str
    vlan: int
    qos: int
    spoofchk: bool | None
    trust: bool | None
    link_state: int


class VfRefused(DriverError):
    """The kernel refused an ``RTM_SETLINK`` of VF attributes; ``errno`` is its answer."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.errno = code


class VfRequests(Protocol):
    """The two primitives a reset is made of (:func:`devplug_sriov.reset.reset_vf`)."""

    def vf_state(self, pf_ifname: str, vf: int) -> VfState | None:
        """VF ``vf`` as ``pf_ifname`` reports it; ``None`` when it reports nothing for that VF (no such VF, or a
        driver without SR-IOV operations); :class:`DriverError` when the interface does not exist."""
        ...

    def set_vf(self, pf_ifname: str, vf: int, **attributes: Any) -> None:
        """One ``RTM_SETLINK`` on ``pf_ifname`` carrying the given attributes of VF ``vf`` (``mac``, ``vlan`` with
        ``qos``, ``spoofchk``, ``link_state``, ``trust``); :class:`VfRefused` with the kernel's errno."""
        ...


class VfLinks(VfRequests, Protocol):
    """What the driver does with netlink."""

    def prepare(self) -> None:
        """Load what requests need, so that no release pays for it (called by ``start`` when there are network
        PFs); nothing to do for a model."""
        ...

    def link_up(self, ifname: str) -> bool:
        """True when the interface is up and has carrier; :class:`DriverError` when it does not exist."""
        ...

    def reset_vf(self, pf_ifname: str, vf: int, settings: VfSettings) -> None:
        """Reset VF ``vf`` to ``settings`` and check it took (:func:`devplug_sriov.reset.reset_vf`);
        :class:`devplug_sriov.reset.VfResetError` naming every attribute that is not as wanted."""
        ...


def _state_from_vfinfo(info: Any) -> tuple[int, VfState]:
    """The VF index and settings in one ``IFLA_VF_INFO`` of a pyroute2 link message."""
    mac = info.get_attr("IFLA_VF_MAC")
    vlan = info.get_attr("IFLA_VF_VLAN")
    spoofchk = info.get_attr("IFLA_VF_SPOOFCHK")
    trust = info.get_attr("IFLA_VF_TRUST")
    link_state = info.get_attr("IFLA_VF_LINK_STATE")

    def flag(nla: Any, key: str) -> bool | None:
        if nla is None or int(nla[key]) == _NOT_REPORTED:
            return None
        return bool(nla[key])

    state = VfState(
        mac=str(mac["mac"]).lower(),
        vlan=int(vlan["vlan"]) if vlan is not None else 0,
        qos=int(vlan["qos"]) if vlan is not None else 0,
        spoofchk=flag(spoofchk, "spoofchk"),
        trust=flag(trust, "trust"),
        link_state=int(link_state["link_state"]) if link_state is not None else LINK_STATE_AUTO,
    )
    return int(mac["vf"]), state


def _quiet_pyroute2() -> None:
    """pyroute2 logs about ten debug lines per request: with the daemon at debug level they cost a request more CPU
    than the request (+55 % measured) and bury the driver's own lines, which say what each reset did and how long
    it took. Its warnings and errors still show."""
    logger = logging.getLogger("pyroute2")
    if logger.level < logging.INFO:
        logger.setLevel(logging.INFO)


class NetlinkVfLinks:
    """:class:`VfLinks` over rtnetlink with pyroute2, in the daemon's network namespace or ``netns``.

    Each call opens a socket of its own, and a reset one for all its requests
    (:class:`_Requests`): a reset is a read, up to five writes and a read back,
    and a socket's set-up (pyroute2's, the interface's index looked up) costs
    as much as a request or more, on a node whose CPUs are busy most of all.
    """

    def __init__(self, netns: str = "") -> None:
        self.netns = netns

    @property
    def where(self) -> str:
        """`` in network namespace <name>`` (empty in the daemon's own), for messages."""
        return f" in network namespace {self.netns}" if self.netns else ""

    def prepare(self) -> None:
        """Load pyroute2 now (the driver's ``start``, when it has network PFs): its import is the costliest part
        of the first request (0.2 s of CPU on a server, seconds on a slow or busy one), which a release would
        otherwise pay."""
        _quiet_pyroute2()
        from pyroute2 import IPRoute  # noqa: F401

    @contextmanager
    def _requests(self) -> Iterator[_Requests]:
        _quiet_pyroute2()
        from pyroute2 import IPRoute

        ipr = IPRoute(netns=self.netns) if self.netns else IPRoute()
        try:
            yield _Requests(ipr, self.where)
        finally:
            ipr.close()

    def link_up(self, ifname: str) -> bool:
        """Up (``IFF_UP``) with carrier (``IFF_LOWER_UP``)."""
        with self._requests() as requests:
            return requests.link_up(ifname)

    def vf_state(self, pf_ifname: str, vf: int) -> VfState | None:
        """``RTM_GETLINK`` with ``RTEXT_FILTER_VF``; the entry of ``IFLA_VFINFO_LIST`` for VF ``vf``."""
        with self._requests() as requests:
            return requests.vf_state(pf_ifname, vf)

    def set_vf(self, pf_ifname: str, vf: int, **attributes: Any) -> None:
        """One ``RTM_SETLINK`` with one ``IFLA_VF_INFO`` holding the given attributes."""
        with self._requests() as requests:
            requests.set_vf(pf_ifname, vf, **attributes)

    def reset_vf(self, pf_ifname: str, vf: int, settings: VfSettings) -> None:
        """:func:`devplug_sriov.reset.reset_vf` through this namespace's netlink, on one socket."""
        from devplug_sriov.reset import reset_vf

        with self._requests() as requests:
            reset_vf(requests, pf_ifname, vf, settings, where=self.where)


class _Requests:
    """Requests on one open rtnetlink socket (pyroute2's ``IPRoute``), each interface's index looked up once."""

    def __init__(self, ipr: Any, where: str) -> None:
        self.ipr = ipr
        self.where = where
        self._indexes: dict[str, int] = {}

    def _index(self, ifname: str) -> int:
        index = self._indexes.get(ifname)
        if index is None:
            found = self.ipr.link_lookup(ifname=ifname)
            if not found:
                raise DriverError(f"network interface {ifname} not found{self.where}")
            index = self._indexes[ifname] = int(found[0])
        return index

    def link_up(self, ifname: str) -> bool:
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            msg = self.ipr.link("get", index=self._index(ifname))[0]
        except NetlinkError as exc:
            raise DriverError(f"{ifname}: cannot read the link{self.where}: {describe_errno(exc.code)}") from exc
        flags = int(msg["flags"])
        return bool(flags & _IFF_UP) and bool(flags & _IFF_LOWER_UP)

    def vf_state(self, pf_ifname: str, vf: int) -> VfState | None:
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            msg = self.ipr.link("get", index=self._index(pf_ifname), ext_mask=_RTEXT_FILTER_VF)[0]
        except NetlinkError as exc:
            raise DriverError(
                f"{pf_ifname}: cannot read its VFs' settings{self.where}: {describe_errno(exc.code)}"
            ) from exc
        vfinfo = msg.get_attr("IFLA_VFINFO_LIST")
        if vfinfo is None:
            return None
        for info in vfinfo.get_attrs("IFLA_VF_INFO"):
            index, state = _state_from_vfinfo(info)
            if index == vf:
                return state
        return None

    def set_vf(self, pf_ifname: str, vf: int, **attributes: Any) -> None:
        from pyroute2.netlink.exceptions import NetlinkError

        spec: dict[str, Any] = {"vf": vf}
        for name, value in attributes.items():
            if name == "qos":
                continue
            if name == "vlan":
                spec["vlan"] = {"vlan": int(value), "qos": int(attributes.get("qos", 0))}
            elif name in ("spoofchk", "trust"):
                spec[name] = int(bool(value))
            elif name in ("mac", "link_state"):
                spec[name] = value
            else:
                raise ValueError(f"set_vf: unknown VF attribute {name!r}")
        try:
            self.ipr.link("set", index=self._index(pf_ifname), vf=spec)
        except NetlinkError as exc:
            code = exc.code or errno.EIO
            shown = ", ".join(f"{k} {v}" for k, v in attributes.items())
            raise VfRefused(
                f"{pf_ifname} VF {vf}: the kernel refused {shown}{self.where}: {describe_errno(code)}", code
            ) from exc
