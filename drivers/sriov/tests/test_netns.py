"""The netlink side for real: pyroute2 against the running kernel, in a network namespace of the test's own.

The PF is a veth interface there. Its link state is real; the VF attributes
(MAC, VLAN, spoof-check, trust, link state) are not emulated by any virtual
device: the kernel answers ``EOPNOTSUPP`` (``do_setvfinfo`` finds no
``ndo_set_vf_*``, and reports no VFs), which is exactly a reset that fails.
What a reset does on a real driver is in ``test_nic_scenarios.py`` (igb in the
VM, and :mod:`devplug_sriov.vfmodel`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug import DriverError, Health
from devplug.testing.pcisysfs import PciSysfsModel
from devplug_sriov.netlink import NetlinkVfLinks, VfSettings, VfState

PF = "0000:3b:00.0"
VF0 = "0000:3b:02.0"


def test_link_state_is_read_from_the_kernel(netns: Any, kit: ModuleType) -> None:
    links = NetlinkVfLinks(netns.name)
    assert links.link_up("pf0") is False
    kit.set_link(netns, "pf0", True)
    kit.set_link(netns, "pf0peer", True)
    kit.eventually(lambda: links.link_up("pf0"), "pf0 up with carrier")
    kit.set_link(netns, "pf0peer", False)  # no carrier: down for the VFs' purpose
    kit.eventually(lambda: not links.link_up("pf0"), "pf0 without carrier")
    with pytest.raises(DriverError, match=f"network interface nope not found in network namespace {netns.name}"):
        links.link_up("nope")


def test_a_reset_the_kernel_refuses_names_the_pf_the_vf_and_why(netns: Any) -> None:
    links = NetlinkVfLinks(netns.name)
    with pytest.raises(DriverError) as info:
        links.reset_vf("pf0", 0, VfSettings())
    message = str(info.value)
    assert message.startswith("pf0 VF 0: the kernel refused to reset its settings")
    assert f"in network namespace {netns.name}" in message
    assert "Operation not supported" in message


def test_at_debug_level_the_log_has_the_drivers_lines_not_pyroute2s(
    netns: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """pyroute2 logs about ten debug lines per request (a daemon run with ``--log-level debug``): they are left out,
    its warnings kept."""
    logging.getLogger("pyroute2").setLevel(logging.NOTSET)  # as in a fresh daemon
    with caplog.at_level(logging.DEBUG):
        links = NetlinkVfLinks(netns.name)
        links.prepare()
        for _ in range(3):
            links.link_up("pf0")
    assert [r for r in caplog.records if r.name.startswith("pyroute2") and r.levelno < logging.INFO] == []
    assert logging.getLogger("pyroute2").getEffectiveLevel() == logging.INFO


def test_a_reset_makes_all_its_requests_on_one_socket(netns: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A reset is a read, up to five writes and a read back; a socket's set-up cost as much as a request, and each
    # request had its own (issue 31: a VF's reset took seconds in the TCG guest, its CPU busy).
    import pyroute2

    opened: list[str] = []

    class Counted(pyroute2.IPRoute):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            opened.append(kwargs.get("netns", ""))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pyroute2, "IPRoute", Counted)
    links = NetlinkVfLinks(netns.name)
    with pytest.raises(DriverError, match="Operation not supported") as info:  # a veth: every setting refused
        links.reset_vf("pf0", 0, VfSettings())
    assert str(info.value).count("refused: [Errno 95]") == 5  # each of the five was sent
    assert opened == [netns.name]
    links.vf_state("pf0", 0)
    assert opened == [netns.name, netns.name]  # a lone request has its own


def test_the_driver_with_real_netlink_keeps_an_unresettable_vf_unhealthy(
    netns: Any, kit: ModuleType, make_harness: Any, tmp_path: Path
) -> None:
    model = PciSysfsModel(tmp_path / "machine")
    model.add_device(PF, 0x8086, 0x1572, 0x020000, iommu_group=20, driver="i40e")
    model.enable_sriov(PF, 4, 0x154C, offset=16, vf_driver="iavf", netdev="pf0")
    links = NetlinkVfLinks(netns.name)
    h = make_harness(model, links, pfs=["pf0"], num_vfs=1, pf_link_health=True, netns=netns.name).start()
    assert [d.health for d in h.hooks.list_devices()] == [Health.UNHEALTHY]  # pf0 is down
    kit.set_link(netns, "pf0", True)
    kit.set_link(netns, "pf0peer", True)
    kit.eventually(lambda: [d.health for d in h.hooks.list_devices()] == [Health.HEALTHY], "VF healthy with pf0 up")
    table = h.hooks.list_devices()

    h.hooks.allocate([VF0])
    with pytest.raises(
        DriverError, match=r"pf0 VF 0: the kernel refused to reset its settings.*Operation not supported"
    ):
        h.release([VF0])

    assert h.hooks.check_health(table) == {VF0: Health.UNHEALTHY}


def test_a_setting_the_driver_does_not_report_reads_as_none() -> None:
    """``rtnl_fill_vfinfo`` presets spoof check and trust to -1 for drivers whose ``ndo_get_vf_config`` leaves them
    unset; the message is built and parsed with pyroute2's own codec, as ``RTM_GETLINK`` answers arrive."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    from devplug_sriov.netlink import _state_from_vfinfo

    unset = 0xFFFFFFFF
    msg = ifinfmsg()
    msg["index"] = 3
    vf = [
        ("IFLA_VF_MAC", {"vf": 1, "mac": "02:00:00:00:00:01"}),
        ("IFLA_VF_VLAN", {"vf": 1, "vlan": 5, "qos": 1}),
        ("IFLA_VF_SPOOFCHK", {"vf": 1, "spoofchk": unset}),
        ("IFLA_VF_LINK_STATE", {"vf": 1, "link_state": 2}),
        ("IFLA_VF_TRUST", {"vf": 1, "trust": unset}),
    ]
    msg["attrs"] = [("IFLA_VFINFO_LIST", {"attrs": [("IFLA_VF_INFO", {"attrs": vf})]})]
    msg.encode()
    parsed = ifinfmsg(msg.data)
    parsed.decode()
    (info,) = parsed.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")
    assert _state_from_vfinfo(info) == (1, VfState("02:00:00:00:00:01", 5, 1, None, None, 2))
