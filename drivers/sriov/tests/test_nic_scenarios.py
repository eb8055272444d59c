"""Scenarios on an SR-IOV NIC, run twice: against the models and against the real igb and igbvf drivers.

The machine: ``NIC_PF`` (``0000:03:00.0``), QEMU's emulated Intel 82576 on the
kernel's igb driver, at most 7 VFs (8086:10ca, on igbvf) at ``03:10.0``,
``03:10.2``, ... In the models it is a :class:`PciSysfsModel` laid out the same
way and a :class:`VfLinkModel` with igb's handlers: no link-state handler,
so a request carrying a link state is refused, even for ``auto``, and the
kernel stops at the first refusal. In the VM the same tests drive the real
driver through netlink (pyroute2) and sysfs.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug import DeviceSpec, DriverError, Health
from devplug.testing.clock import ManualClock
from devplug_sriov import STATE_FILE
from devplug_sriov.netlink import ZERO_MAC, VfRefused, VfState

TENANT = {"mac": "02:00:00:00:00:01", "vlan": 42, "qos": 3, "spoofchk": False, "trust": True}


def _state(harness: Any) -> dict[str, Any]:
    path = Path(harness.ctx.state_dir) / STATE_FILE
    return json.loads(path.read_text())["vfs"] if path.exists() else {}


def _health(harness: Any) -> dict[str, Health]:
    return {d.id: d.health for d in harness.hooks.list_devices()}


# --- facts about igb the reset relies on (and the model must copy) -------------------------


def test_fact_igb_vfs_and_what_their_pf_accepts(nic: Any, kit: ModuleType) -> None:
    sysfs, links = nic.sysfs, nic.links
    assert kit.attr(sysfs, kit.NIC_PF, "sriov_totalvfs") == "7"
    assert kit.attr(sysfs, kit.NIC_PF, "sriov_numvfs") == "0"
    kit.write_attr(sysfs, kit.NIC_PF, "sriov_numvfs", "2")  # autoprobe 1: igbvf takes them at once
    assert [kit.present(sysfs, kit.nic_vf(i)) for i in range(3)] == [True, True, False]
    assert sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / kit.NIC_PF / "virtfn1") == kit.nic_vf(1)
    assert [kit.driver_of(sysfs, kit.nic_vf(i)) for i in range(2)] == ["igbvf", "igbvf"]
    pf = nic.pf_netdev
    assert [links.vf_state(pf, i) for i in range(3)] == [kit.NEW_VF, kit.NEW_VF, None]  # nothing beyond the VFs

    links.set_vf(pf, 0, **TENANT)
    assert links.vf_state(pf, 0) == VfState("02:00:00:00:00:01", 42, 3, False, True, kit.LINK_STATE_AUTO)

    with pytest.raises(VfRefused) as no_link_state:  # igb has no link-state handler: not even "auto"
        links.set_vf(pf, 0, link_state=kit.LINK_STATE_AUTO)
    assert no_link_state.value.errno == errno.EOPNOTSUPP
    with pytest.raises(VfRefused) as all_at_once:  # one request with everything: it stops at the link state
        links.set_vf(pf, 0, mac=ZERO_MAC, vlan=0, spoofchk=True, link_state=kit.LINK_STATE_AUTO, trust=False)
    assert all_at_once.value.errno == errno.EOPNOTSUPP
    assert links.vf_state(pf, 0) == VfState(ZERO_MAC, 0, 0, True, True, kit.LINK_STATE_AUTO)  # still trusted

    refused: list[dict[str, Any]] = [
        {"mac": "01:00:5e:00:00:01"},  # multicast: not a VF's address
        {"vlan": 1, "qos": 8},  # QoS above 7
    ]
    for attributes in refused:
        with pytest.raises(VfRefused) as invalid:
            links.set_vf(pf, 1, **attributes)
        assert invalid.value.errno == errno.EINVAL, attributes
    with pytest.raises(VfRefused) as beyond:
        links.set_vf(pf, 2, trust=True)
    assert beyond.value.errno == errno.EINVAL
    assert links.vf_state(pf, 1) == kit.NEW_VF

    kit.write_attr(sysfs, kit.NIC_PF, "sriov_numvfs", "0")
    kit.write_attr(sysfs, kit.NIC_PF, "sriov_numvfs", "2")
    assert links.vf_state(pf, 0) == kit.NEW_VF  # VFs made anew start from igb's defaults (igb_vf_configure)


def test_fact_removing_the_pf_takes_its_vfs_and_a_rescan_brings_it_back_without(nic: Any, kit: ModuleType) -> None:
    sysfs, pf = nic.sysfs, nic.pf_netdev
    kit.write_attr(sysfs, kit.NIC_PF, "sriov_numvfs", "2")
    kit.write_attr(sysfs, kit.NIC_PF, "remove", "1")  # igb_remove disables SR-IOV first
    assert [kit.present(sysfs, a) for a in (kit.NIC_PF, kit.nic_vf(0), kit.nic_vf(1))] == [False, False, False]
    with pytest.raises(DriverError, match=f"network interface {pf} not found"):
        nic.links.vf_state(pf, 0)

    sysfs.write_text(sysfs.sysfs_root / "bus/pci/rescan", "1")
    kit.eventually(lambda: kit.present(sysfs, kit.NIC_PF), "the PF back after the rescan")
    assert kit.attr(sysfs, kit.NIC_PF, "sriov_numvfs") == "0"
    assert kit.attr(sysfs, kit.NIC_PF, "sriov_drivers_autoprobe") == "1"
    assert kit.driver_of(sysfs, kit.NIC_PF) == "igb"
    assert nic.links.vf_state(nic.pf_netdev, 0) is None


# --- the driver on igb ----------------------------------------------------------------------


def test_kernel_mode_on_igb_a_release_resets_every_setting(nic: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs, links = nic.sysfs, nic.links
    pf = nic.pf_netdev
    h = make_harness(sysfs, links, pfs=[pf], num_vfs=2).start()
    vfs = [kit.nic_vf(0), kit.nic_vf(1)]
    assert h.ids() == vfs
    assert _health(h) == dict.fromkeys(vfs, Health.HEALTHY)
    assert [kit.driver_of(sysfs, a) for a in vfs] == ["igbvf", "igbvf"]

    allocation = h.hooks.allocate(vfs)
    assert allocation.envs == {"PCIDEVICE_EXAMPLE_COM_VF": ",".join(vfs)}
    for index in range(2):  # the tenant's settings, made through the PF as its CNI would
        links.set_vf(pf, index, **{**TENANT, "mac": f"02:00:00:00:00:0{index + 1}"})

    h.release(vfs)

    assert [links.vf_state(pf, i) for i in range(2)] == [kit.NEW_VF, kit.NEW_VF]
    assert _health(h) == dict.fromkeys(vfs, Health.HEALTHY)
    assert [kit.driver_of(sysfs, a) for a in vfs] == ["igbvf", "igbvf"]
    assert _state(h) == {}
    h.release(vfs, retry=True)  # at least once: nothing left to do
    assert h.sink.published == {"reset_failures": {}}


def test_vfio_mode_on_igb_gives_the_vf_back_to_igbvf_and_resets_its_settings(
    nic: Any, kit: ModuleType, make_harness: Any
) -> None:
    sysfs, links = nic.sysfs, nic.links
    pf = nic.pf_netdev
    vf0 = kit.nic_vf(0)
    h = make_harness(sysfs, links, pfs=[kit.NIC_PF], num_vfs=2, vf_driver="vfio-pci", autoprobe=True).start()
    assert kit.driver_of(sysfs, vf0) == "igbvf"
    group = kit.group_of(sysfs, vf0)

    allocation = h.hooks.allocate([vf0])
    assert kit.driver_of(sysfs, vf0) == "vfio-pci"
    assert allocation.devices == (
        DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
        DeviceSpec(f"/dev/vfio/{group}", f"/dev/vfio/{group}", "rw"),
    )
    assert not sysfs.exists(sysfs.sysfs_root / "bus/pci/devices" / vf0 / "net")  # igbvf's interface went with it
    links.set_vf(pf, 0, **TENANT)  # set for the pod on the PF (a DPDK pod's CNI does)

    h.release([vf0])

    assert kit.driver_of(sysfs, vf0) == "igbvf"
    kit.eventually(lambda: sysfs.exists(sysfs.sysfs_root / "bus/pci/devices" / vf0 / "net"), "igbvf's interface back")
    assert links.vf_state(pf, 0) == kit.NEW_VF
    assert _state(h) == {}


def test_a_reset_igb_refuses_keeps_the_vf_out_of_service_until_the_config_changes(
    nic: Any, kit: ModuleType, make_harness: Any, clock: ManualClock
) -> None:
    sysfs, links = nic.sysfs, nic.links
    pf = nic.pf_netdev
    vf0 = kit.nic_vf(0)
    h = make_harness(sysfs, links, pfs=[kit.NIC_PF], num_vfs=2, link_state="disable").start()
    table = h.hooks.list_devices()
    h.hooks.allocate([vf0])
    links.set_vf(pf, 0, **TENANT)

    with pytest.raises(DriverError) as info:
        h.release([vf0])

    message = str(info.value)
    assert message.startswith(f"{pf} VF 0: the kernel refused to reset its settings: link state: auto, wanted disable")
    assert "refused: [Errno 95] Operation not supported" in message
    assert "TRUSTED" not in message  # trust was cleared all the same, and everything else
    assert links.vf_state(pf, 0) == kit.NEW_VF
    assert h.hooks.check_health(table) == {vf0: Health.UNHEALTHY}
    pushed = {d.id: d for d in h.sink.pushes[-1]}
    assert (pushed[vf0].health, pushed[vf0].reason) == (Health.UNHEALTHY, message)
    assert pushed[kit.nic_vf(1)].health is Health.HEALTHY
    assert h.sink.published == {"reset_failures": {vf0: message}}
    clock.advance(kit.RETRY_DUE)
    assert {d.id: d.health for d in h.driver.refresh()}[vf0] is Health.UNHEALTHY  # the retry is refused again
    assert h.driver.retries.failures(vf0) == 2

    h.hooks.stop()  # the operator drops link_state = "disable"; the restarted driver finishes the release
    again = make_harness(sysfs, links, state_dir=h.ctx.state_dir, pfs=[kit.NIC_PF], num_vfs=2).start()
    assert _health(again) == dict.fromkeys([vf0, kit.nic_vf(1)], Health.HEALTHY)
    assert _state(again) == {}
    assert again.sink.published == {"reset_failures": {}}


def test_a_removed_pf_takes_its_vfs_out_of_service_and_a_restart_sets_it_up_again(
    nic: Any, kit: ModuleType, make_harness: Any
) -> None:
    sysfs = nic.sysfs
    vfs = [kit.nic_vf(0), kit.nic_vf(1)]
    h = make_harness(sysfs, nic.links, pfs=[kit.NIC_PF], num_vfs=2).start()
    h.hooks.allocate([vfs[0]])

    kit.write_attr(sysfs, kit.NIC_PF, "remove", "1")

    devices = h.driver.refresh()
    assert [(d.id, d.health, d.reason) for d in devices] == [(a, Health.UNHEALTHY, "the VF vanished") for a in vfs]
    h.release([vfs[0]])  # nothing to reset: the VF is gone, and one made again starts from igb's defaults
    assert _state(h) == {}

    sysfs.write_text(sysfs.sysfs_root / "bus/pci/rescan", "1")
    kit.eventually(lambda: kit.present(sysfs, kit.NIC_PF), "the PF back after the rescan")
    h.hooks.stop()
    restarted = make_harness(sysfs, nic.links, state_dir=h.ctx.state_dir, pfs=[kit.NIC_PF], num_vfs=2).start()
    assert kit.attr(sysfs, kit.NIC_PF, "sriov_numvfs") == "2"
    assert _health(restarted) == dict.fromkeys(vfs, Health.HEALTHY)
