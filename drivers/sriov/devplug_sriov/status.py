"""What a prepared VF shows in a DRA claim's ``status.devices`` (contract 1.1, KEP-4817), with the
``device_status`` option.

``data``: ``{"pciAddress": <the VF's>, "pf": <the PF's PCI address>, "vfIndex": <N>}`` and ``"pfInterface"``
when the PF has a network interface. ``network_data`` (``networkData`` of the claim's status), for a VF with a
network interface or a MAC:

* ``interface_name``: the VF's interface as the host sees it at ``allocate`` (``net/<name>`` of the VF in sysfs).
  The driver moves no interface: a CNI plugin (SR-IOV CNI, Multus) moves it into the pod's network namespace
  later and may rename it there (``net1``), which the driver cannot know. In ``vfio-pci`` mode the VF has no
  interface once bound: none is shown;
* ``hardware_address``: the interface's MAC (``net/<name>/address``), else the MAC its PF reports for the VF
  (``IFLA_VF_MAC`` through netlink) when one was set (not ``00:00:00:00:00:00``);
* ``ips``: none: the VF's addresses are the CNI's to give, in the pod, after the driver is done.
"""

from __future__ import annotations

from typing import Any

from devplug import DriverError
from devplug.types import DeviceStatus, NetworkData
from devplug_sriov.netlink import VfRequests
from devplug_sriov.sriov import PhysFn, SriovBus, VirtFn

__all__ = ["vf_status"]

_ZERO_MAC = "00:00:00:00:00:00"


def _interface_mac(sriov: SriovBus, vf: VirtFn, interface: str) -> str:
    try:
        mac = sriov.access.read_text(sriov.bus.devices_dir / vf.address / "net" / interface / "address").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return mac.lower() if mac and mac != _ZERO_MAC else ""


def _pf_mac(links: VfRequests, pf: PhysFn | None, vf: VirtFn) -> str:
    if pf is None or pf.netdev is None:
        return ""
    try:
        state = links.vf_state(pf.netdev, vf.index)
    except DriverError:
        return ""
    return state.mac.lower() if state is not None and state.mac != _ZERO_MAC else ""


def vf_status(sriov: SriovBus, links: VfRequests, vf: VirtFn, pf: PhysFn | None, interface: str | None) -> DeviceStatus:
    """The status of ``vf`` (of ``pf``), whose interface is ``interface`` now (``None``: it has none)."""
    data: dict[str, Any] = {"pciAddress": vf.address, "pf": vf.pf, "vfIndex": vf.index}
    if pf is not None and pf.netdev is not None:
        data["pfInterface"] = pf.netdev
    mac = (_interface_mac(sriov, vf, interface) if interface else "") or _pf_mac(links, pf, vf)
    network = None
    if interface or mac:
        network = NetworkData(interface_name=interface or "", hardware_address=mac)
    return DeviceStatus(data=data, network_data=network)
