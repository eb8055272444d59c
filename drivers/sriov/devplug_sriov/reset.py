"""Resetting a released VF's settings on its PF, in a way real drivers accept, and checking that it took.

Why not one ``RTM_SETLINK`` carrying every attribute: the kernel applies a
request's VF attributes in a fixed order (MAC, VLAN, spoof check, link state,
trust), each through the driver's ``ndo_set_vf_*`` handler, ``EOPNOTSUPP``
where the driver has none, and stops at the first error, keeping what it
applied (``net/core/rtnetlink.c``, ``do_setvfinfo`` and ``do_setlink``). igb
(82576, I350) has no link-state handler (``drivers/net/ethernet/intel/igb/
igb_main.c``, ``igb_netdev_ops``): such a request fails at the link state, even
for ``auto``, and never reaches trust, so the VF would stay trusted.

So :func:`reset_vf`:

1. reads the VF as the PF reports it (``RTM_GETLINK`` with ``RTEXT_FILTER_VF``);
2. sends each attribute that differs from the wanted value (every attribute
   when the PF reports nothing) in a request of its own, trust first, so a
   refusal stops nothing else;
3. reads the VF again and checks every attribute the reset promises: MAC,
   VLAN (and its QoS: none), spoof check, trust, link state;
4. raises :class:`VfResetError` naming each attribute that is not as wanted,
   with the kernel's answer to its request, if it refused one.

A driver without a handler reports that setting's only value: a driver with no
link-state handler reports ``auto`` (``rtnl_fill_vfinfo`` presets it), so
wanting ``auto`` sends nothing; one with no trust handler reports no trust
(-1), which counts as untrusted, as no such driver can trust a VF. A driver
that does not report spoof checking fails the check: the reset cannot show
it took.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devplug import DriverError
from devplug_sriov.netlink import LINK_STATES, VfRefused, VfSettings, VfState, describe_errno

if TYPE_CHECKING:
    from devplug_sriov.netlink import VfRequests

__all__ = ["ATTRIBUTES", "AttributeFailure", "VfResetError", "reset_vf"]

#: The attributes a reset sends, in the order it sends them: trust first, then the kernel's order.
ATTRIBUTES = ("trust", "mac", "vlan", "spoofchk", "link_state")
#: How each attribute is named in messages (``ip link``'s words).
_NAMES = {"trust": "trust", "mac": "MAC", "vlan": "VLAN", "spoofchk": "spoof checking", "link_state": "link state"}
_LINK_STATE_NAMES = {value: name for name, value in LINK_STATES.items()}


@dataclass(frozen=True)
class AttributeFailure:
    """One promised attribute that is not as wanted after the reset."""

    attribute: str
    found: str
    wanted: str
    refused: VfRefused | None = None

    def describe(self) -> str:
        """``trust: on, wanted off (refused: [Errno 95] Operation not supported)``."""
        why = f"refused: {describe_errno(self.refused.errno)}" if self.refused is not None else "set without error"
        return f"{_NAMES[self.attribute]}: {self.found}, wanted {self.wanted} ({why})"


class VfResetError(DriverError):
    """A VF's reset did not take: ``failures`` names each attribute left as it was not wanted (every attribute,
    with ``unread`` saying why, when the VF could not be read back)."""

    def __init__(self, pf: str, vf: int, failures: list[AttributeFailure], unread: str = "", where: str = "") -> None:
        self.pf = pf
        self.vf = vf
        self.failures = tuple(failures)
        #: Why the VF could not be read back (empty when it was).
        self.unread = unread
        parts = [f.describe() for f in self.failures]
        if unread:
            parts.append(unread)
        trusted = " (the VF may still be TRUSTED)" if self.still_trusted else ""
        super().__init__(f"{pf} VF {vf}: the kernel refused to reset its settings{where}{trusted}: " + "; ".join(parts))

    @property
    def still_trusted(self) -> bool:
        """True when trust was not read back as wanted (on, or unknown): the next tenant could get it."""
        return "trust" in self.refused

    @property
    def refused(self) -> list[str]:
        """The attributes that are not as wanted, by their ``VfSettings`` names."""
        return [f.attribute for f in self.failures]


def _on(value: bool | None) -> str:
    return "not reported by the driver" if value is None else ("on" if value else "off")


def _vlan(vlan: int, qos: int) -> str:
    return (f"{vlan}" if vlan else "none") + (f" qos {qos}" if qos else "")


def _link(value: int) -> str:
    return _LINK_STATE_NAMES.get(value, str(value))


def _wanted_values(settings: VfSettings) -> dict[str, Any]:
    return {
        "trust": settings.trust,
        "mac": settings.mac.lower(),
        "vlan": settings.vlan,
        "spoofchk": settings.spoofchk,
        "link_state": settings.link_state,
    }


def _matches(attribute: str, state: VfState, settings: VfSettings) -> bool:
    """Whether ``state`` shows ``attribute`` as ``settings`` want it (see the module docstring for unreported ones)."""
    if attribute == "trust":
        return (state.trust is None and not settings.trust) or state.trust == settings.trust
    if attribute == "mac":
        return state.mac.lower() == settings.mac.lower()
    if attribute == "vlan":
        return state.vlan == settings.vlan and state.qos == 0
    if attribute == "spoofchk":
        return state.spoofchk is not None and state.spoofchk == settings.spoofchk
    return state.link_state == settings.link_state


def _found(attribute: str, state: VfState) -> str:
    """How ``attribute`` reads in ``state``, for messages."""
    found: dict[str, Callable[[VfState], str]] = {
        "trust": lambda s: _on(s.trust),
        "mac": lambda s: s.mac,
        "vlan": lambda s: _vlan(s.vlan, s.qos),
        "spoofchk": lambda s: _on(s.spoofchk),
        "link_state": lambda s: _link(s.link_state),
    }
    return found[attribute](state)


def _wanted(attribute: str, settings: VfSettings) -> str:
    """How the wanted value of ``attribute`` reads, for messages."""
    wanted: dict[str, Callable[[VfSettings], str]] = {
        "trust": lambda s: _on(s.trust),
        "mac": lambda s: s.mac.lower(),
        "vlan": lambda s: _vlan(s.vlan, 0),
        "spoofchk": lambda s: _on(s.spoofchk),
        "link_state": lambda s: _link(s.link_state),
    }
    return wanted[attribute](settings)


def reset_vf(links: VfRequests, pf: str, vf: int, settings: VfSettings, where: str = "") -> None:
    """Reset VF ``vf`` of ``pf`` to ``settings`` through ``links`` (see the module docstring): a
    :class:`~devplug_sriov.netlink.VfLinks`, or the requests of one open socket.

    :class:`VfResetError` when any promised attribute is not as wanted
    afterwards; the :class:`DriverError` of ``links`` when the PF's interface
    is gone.
    """
    before = links.vf_state(pf, vf)
    wanted = _wanted_values(settings)
    refusals: dict[str, VfRefused] = {}
    for attribute in ATTRIBUTES:
        if before is not None and _matches(attribute, before, settings):
            continue
        try:
            links.set_vf(pf, vf, **{attribute: wanted[attribute]})
        except VfRefused as exc:
            refusals[attribute] = exc
    after = links.vf_state(pf, vf)
    if after is None:
        failures = [AttributeFailure(a, "unknown", _wanted(a, settings), refusals.get(a)) for a in ATTRIBUTES]
        raise VfResetError(
            pf,
            vf,
            failures,
            unread=f"{pf} reports no settings for VF {vf}, so the reset cannot be checked",
            where=where,
        )
    failures = [
        AttributeFailure(a, _found(a, after), _wanted(a, settings), refusals.get(a))
        for a in ATTRIBUTES
        if not _matches(a, after, settings)
    ]
    if failures:
        raise VfResetError(pf, vf, failures, where=where)
