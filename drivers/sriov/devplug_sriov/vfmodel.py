"""A model of the VF settings a PF's driver keeps, as rtnetlink shows and sets them, for tests: as strict as the
kernel and its drivers, behind :class:`devplug_sriov.netlink.VfLinks`.

What it follows:

* **Setting** (``net/core/rtnetlink.c``, ``do_setvfinfo``, called by
  ``do_setlink`` for each ``IFLA_VF_INFO``): the VF attributes of one
  ``RTM_SETLINK`` are applied in a fixed order -- MAC, VLAN, spoof check, link
  state, trust -- each through the driver's ``ndo_set_vf_*`` handler, and
  ``EOPNOTSUPP`` when the driver has none. The first error ends the request
  (``if (err < 0) return err``, then ``goto errout``): the attributes applied
  before it stay applied, those after it are never tried.
* **Reading** (``rtnl_fill_vf``, ``rtnl_fill_vfinfo``): ``RTM_GETLINK`` with
  ``RTEXT_FILTER_VF`` lists one entry per enabled VF, and only when the driver
  has ``ndo_get_vf_config``; the kernel presets spoof check and trust to -1
  (not reported) and the link state to ``IFLA_VF_LINK_STATE_AUTO``, so a driver
  without a link-state handler always reports ``auto``.
* **The drivers' handlers**, by profile (``ops``, the ``ndo_set_vf_*`` a driver has):

  - :data:`IGB_VF_OPS`, the 82576/I350 driver (``drivers/net/ethernet/intel/igb/
    igb_main.c``, ``igb_netdev_ops``): MAC, VLAN, spoof check and trust, and
    **no** ``ndo_set_vf_link_state``, so any link state (``auto`` too) is
    ``EOPNOTSUPP``. ``igb_ndo_set_vf_mac``: ``EINVAL`` for a VF index beyond
    the VFs and for a MAC that is neither zero (which removes the
    administratively set MAC) nor a valid unicast one;
    ``igb_ndo_set_vf_vlan``: ``EINVAL`` beyond the VFs, for a VLAN above 4095
    or a QoS above 7; ``igb_ndo_set_vf_spoofchk``: ``EOPNOTSUPP`` while the PF
    has no VFs, ``EINVAL`` beyond them; ``igb_ndo_set_vf_trust``: ``EINVAL``
    beyond them. A new VF (``igb_vf_configure``) has a zero MAC, no VLAN, spoof
    checking on and no trust, and ``igb_ndo_get_vf_config`` reports all of those.
  - :data:`ALL_VF_OPS`, a driver with every handler, as ``i40e_netdev_ops``
    (``drivers/net/ethernet/intel/i40e/i40e_main.c``) has them, link state
    included (``i40e_ndo_set_vf_link_state``: auto, enable or disable,
    ``EINVAL`` otherwise); the same argument checks as above.
  - :data:`NO_VF_OPS`, a device whose driver has no SR-IOV operations (dummy,
    veth): every attribute is ``EOPNOTSUPP`` and nothing is reported, which is
    what the network-namespace tests see on a real veth.

* An unknown interface is a :class:`devplug.DriverError` (``ENODEV``), as
  :class:`~devplug_sriov.netlink.NetlinkVfLinks` raises before any request.
* Following a PCI model (the test kit's ``devplug.testing.pcisysfs.PciSysfsModel``) (``add_pf(...,
  pci=model, address=pf)``): the interface exists while that PCI function is
  present and bound to its driver, the VF count is its ``sriov_numvfs``, and a
  VF created anew (``sriov_numvfs`` through 0) starts from the driver's defaults.

Fault injection for tests, apart from the modelled behaviour: ``refuse`` (a
VF whose every handler answers ``EOPNOTSUPP``), ``fail`` (one handler of one
VF answering a given errno) and ``ignore`` (one handler of one VF answering 0
without changing anything, as a firmware that drops a request would).
"""

from __future__ import annotations

import errno
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from devplug import DriverError
from devplug_sriov.netlink import LINK_STATES, VfRefused, VfSettings, VfState, describe_errno


class PciSriovView(Protocol):
    """What this model reads of a PF's SR-IOV capability in a PCI model: its VFs' addresses."""

    @property
    def vfs(self) -> Sequence[str]: ...


class PciFunctionView(Protocol):
    """What this model reads of a PCI function in a PCI model: its interface and its SR-IOV capability."""

    @property
    def netdev(self) -> str | None: ...

    @property
    def sriov(self) -> PciSriovView | None: ...


class PciModelView(Protocol):
    """What this model reads of a PCI model (the test kit's ``devplug.testing.pcisysfs.PciSysfsModel``, which
    the driver's package never imports): its functions by address."""

    @property
    def devices(self) -> Mapping[str, PciFunctionView]: ...


__all__ = ["ALL_VF_OPS", "IGB_VF_OPS", "NO_VF_OPS", "ModelPf", "VfLinkModel"]

#: The VF attributes in the order ``do_setvfinfo`` applies them.
KERNEL_ORDER = ("mac", "vlan", "spoofchk", "link_state", "trust")
#: The handlers of ``igb_netdev_ops``: no ``ndo_set_vf_link_state``.
IGB_VF_OPS = frozenset({"mac", "vlan", "spoofchk", "trust"})
#: Every handler (``i40e_netdev_ops``, ``ice``, ``mlx5e``).
ALL_VF_OPS = frozenset(KERNEL_ORDER)
#: No SR-IOV operations at all (dummy, veth).
NO_VF_OPS: frozenset[str] = frozenset()
#: A new VF, as ``igb_vf_configure`` sets it up.
NEW_VF = VfState(mac="00:00:00:00:00:00", vlan=0, qos=0, spoofchk=True, trust=False, link_state=LINK_STATES["auto"])
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


@dataclass
class ModelPf:
    """One PF's interface, its driver's handlers and its VFs' settings."""

    num_vfs: int
    up: bool = True
    ops: frozenset[str] = ALL_VF_OPS
    vfs: dict[int, VfState] = field(default_factory=dict)
    pci: PciModelView | None = None
    address: str | None = None
    #: The PCI model's VF device each VF's settings belong to (a new device means a new VF).
    devices: dict[int, object] = field(default_factory=dict)


class VfLinkModel:
    """PF interfaces by name, with their VFs' settings; records every request and every reset that took."""

    def __init__(self) -> None:
        self.pfs: dict[str, ModelPf] = {}
        #: ``(pf, vf)`` of every reset that succeeded.
        self.resets: list[tuple[str, int]] = []
        #: ``(pf, vf, attribute names)`` of every ``RTM_SETLINK``, in order.
        self.requests: list[tuple[str, int, tuple[str, ...]]] = []
        #: Fault injection: ``(pf, vf)`` whose every handler answers ``EOPNOTSUPP``.
        self.refuse: set[tuple[str, int]] = set()
        #: Fault injection: ``(pf, vf, attribute)`` whose handler answers the given errno.
        self.fail: dict[tuple[str, int, str], int] = {}
        #: Fault injection: ``(pf, vf, attribute)`` whose handler answers 0 and changes nothing.
        self.ignore: set[tuple[str, int, str]] = set()
        self._lock = threading.RLock()

    def add_pf(
        self,
        ifname: str,
        num_vfs: int = 0,
        *,
        sriov_ops: bool = True,
        ops: frozenset[str] | None = None,
        pci: PciModelView | None = None,
        address: str | None = None,
    ) -> ModelPf:
        """A PF interface with ``num_vfs`` VFs and the handlers ``ops`` (default: every one; none without
        ``sriov_ops``), or following the PCI function ``address`` of ``pci`` (see the module docstring)."""
        with self._lock:
            handlers = ops if ops is not None else (ALL_VF_OPS if sriov_ops else NO_VF_OPS)
            pf = ModelPf(num_vfs, ops=handlers, pci=pci, address=address)
            self.pfs[ifname] = pf
            return pf

    # --- the kernel's side ------------------------------------------------------------------

    def _pf(self, ifname: str) -> ModelPf:
        """The PF behind ``ifname``, its VFs brought in line with the PCI model it follows."""
        pf = self.pfs.get(ifname)
        pci = pf.pci if pf is not None else None
        if pf is not None and pci is not None and pf.address is not None:
            dev = pci.devices.get(pf.address)
            if dev is None or dev.netdev != ifname:
                pf = None  # removed, or its driver unbound: no interface
            else:
                addresses = list(dev.sriov.vfs) if dev.sriov is not None else []
                pf.num_vfs = len(addresses)
                for index in list(pf.vfs):
                    if index >= pf.num_vfs:
                        del pf.vfs[index]
                for index, vf_address in enumerate(addresses):
                    vf_dev = pci.devices.get(vf_address)
                    if pf.devices.get(index) is not vf_dev:
                        pf.vfs.pop(index, None)  # created anew: the driver's defaults
                        pf.devices[index] = vf_dev
        if pf is None:
            raise DriverError(f"network interface {ifname} not found: {describe_errno(errno.ENODEV)}")
        return pf

    def _handler(self, ifname: str, pf: ModelPf, vf: int, attribute: str, value: Any, qos: int) -> int:
        """The driver's ``ndo_set_vf_<attribute>``: 0, or the errno it answers."""
        if attribute not in pf.ops or (ifname, vf) in self.refuse:
            return errno.EOPNOTSUPP
        if attribute == "spoofchk" and pf.num_vfs == 0:
            return errno.EOPNOTSUPP  # igb_ndo_set_vf_spoofchk: no VFs allocated
        if vf >= pf.num_vfs:
            return errno.EINVAL
        injected = self.fail.get((ifname, vf, attribute))
        if injected is not None:
            return injected
        if (ifname, vf, attribute) in self.ignore:
            return 0
        state = pf.vfs.get(vf, NEW_VF)
        if attribute == "mac":
            mac = str(value).lower()
            if not _MAC.match(mac):
                raise ValueError(f"set_vf: {value!r} is not a MAC address")
            first = int(mac[:2], 16)
            if mac != NEW_VF.mac and (first & 1 or mac == "ff:ff:ff:ff:ff:ff"):
                return errno.EINVAL  # neither zero nor a valid unicast address
            pf.vfs[vf] = replace(state, mac=mac)
        elif attribute == "vlan":
            if not 0 <= int(value) <= 4095 or not 0 <= qos <= 7:
                return errno.EINVAL
            pf.vfs[vf] = replace(state, vlan=int(value), qos=qos)
        elif attribute == "spoofchk":
            pf.vfs[vf] = replace(state, spoofchk=bool(value))
        elif attribute == "link_state":
            if int(value) not in LINK_STATES.values():
                return errno.EINVAL
            pf.vfs[vf] = replace(state, link_state=int(value))
        else:
            pf.vfs[vf] = replace(state, trust=bool(value))
        return 0

    def set_vf(self, pf_ifname: str, vf: int, **attributes: Any) -> None:
        """One ``RTM_SETLINK``: the attributes in the kernel's order, stopping at the first refusal."""
        unknown = set(attributes) - {*KERNEL_ORDER, "qos"}
        if unknown:
            raise ValueError(f"set_vf: unknown VF attribute {sorted(unknown)[0]!r}")
        with self._lock:
            pf = self._pf(pf_ifname)
            self.requests.append((pf_ifname, vf, tuple(a for a in KERNEL_ORDER if a in attributes)))
            qos = int(attributes.get("qos", 0))
            for attribute in KERNEL_ORDER:
                if attribute not in attributes:
                    continue
                code = self._handler(pf_ifname, pf, vf, attribute, attributes[attribute], qos)
                if code:
                    shown = ", ".join(f"{k} {v}" for k, v in attributes.items())
                    raise VfRefused(f"{pf_ifname} VF {vf}: the kernel refused {shown}: {describe_errno(code)}", code)

    def vf_state(self, pf_ifname: str, vf: int) -> VfState | None:
        """``RTM_GETLINK`` with ``RTEXT_FILTER_VF``: nothing without ``ndo_get_vf_config`` or beyond the VFs."""
        with self._lock:
            pf = self._pf(pf_ifname)
            if not pf.ops or not 0 <= vf < pf.num_vfs:
                return None
            return pf.vfs.get(vf, NEW_VF)

    def prepare(self) -> None:
        """Nothing to load (the model is this module)."""

    def link_up(self, ifname: str) -> bool:
        with self._lock:
            return self._pf(ifname).up

    def reset_vf(self, pf_ifname: str, vf: int, settings: VfSettings) -> None:
        """The driver's reset (:func:`devplug_sriov.reset.reset_vf`) over this model; recorded when it took."""
        from devplug_sriov.reset import reset_vf

        reset_vf(self, pf_ifname, vf, settings)
        with self._lock:
            self.resets.append((pf_ifname, vf))

    # --- for tests ---------------------------------------------------------------------------

    def set_link(self, ifname: str, up: bool) -> None:
        """The PF's link goes up or down (carrier included)."""
        with self._lock:
            self._pf(ifname).up = up

    def vf(self, ifname: str, vf: int) -> VfSettings:
        """VF ``vf``'s settings as :class:`VfSettings` (a VLAN's QoS is in :meth:`vf_state`)."""
        state = self.vf_state(ifname, vf)
        if state is None:
            raise AssertionError(f"{ifname} reports no settings for VF {vf}")
        return VfSettings(
            mac=state.mac,
            vlan=state.vlan,
            spoofchk=bool(state.spoofchk),
            trust=bool(state.trust),
            link_state=state.link_state,
        )
