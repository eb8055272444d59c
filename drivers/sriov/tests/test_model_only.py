"""What only the models can stage: network VFs (MAC, VLAN, trust on a PF), RDMA, NUMA, PF links,
failing resets, two resources, the config through the core's parser and ``devplug check-config``, the dry run."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug import ConfigError, DeviceSpec, DriverError, Health, Topology
from devplug.config import parse_config
from devplug.testing.clock import ManualClock
from devplug.testing.configs import write_toml
from devplug.testing.pcisysfs import PciSysfsModel
from devplug.types import DeviceStatus, NetworkData
from devplug_sriov import STATE_FILE, SriovDriver, SriovOptions
from devplug_sriov.netlink import VfRefused, VfSettings, VfState
from devplug_sriov.vfmodel import IGB_VF_OPS, NEW_VF, VfLinkModel

NIC_PF = "0000:3b:00.0"  # ens1f0: an X710-like PF on i40e, NUMA node 1, VFs at 3b:02.0 onwards (offset 16)
IGB_PF, IGB_VF0, IGB_VF1 = "0000:5e:00.0", "0000:5e:10.0", "0000:5e:10.2"  # an 82576 on igb (offset 128, stride 2)
NIC2_PF = "0000:86:00.0"  # ens2f0, NUMA node 0


def nic_vf(index: int, bus: str = "3b") -> str:
    return f"0000:{bus}:02.{index}"


@pytest.fixture
def model(tmp_path: Path) -> PciSysfsModel:
    built = PciSysfsModel(tmp_path / "machine")
    built.add_device(NIC_PF, 0x8086, 0x1572, 0x020000, numa_node=1, iommu_group=20, driver="i40e")
    built.enable_sriov(NIC_PF, 8, 0x154C, offset=16, vf_driver="iavf", netdev="ens1f0")
    built.add_device(NIC2_PF, 0x8086, 0x1572, 0x020000, numa_node=0, iommu_group=21, driver="i40e")
    built.enable_sriov(NIC2_PF, 8, 0x154C, offset=16, vf_driver="iavf", netdev="ens2f0", rdma=True)
    return built


@pytest.fixture
def links() -> VfLinkModel:
    made = VfLinkModel()
    made.add_pf("ens1f0", 8)
    made.add_pf("ens2f0", 8)
    return made


def _state(harness: Any) -> dict[str, Any]:
    path = Path(harness.ctx.state_dir) / STATE_FILE
    return json.loads(path.read_text())["vfs"] if path.exists() else {}


# --- kernel (netdevice) mode ---------------------------------------------------------------


def test_kernel_mode_hands_out_addresses_and_resets_through_netlink_on_release(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    h = make_harness(model, links, pfs=["ens1f0"], num_vfs=4, vfs=["ens1f0#0-1"]).start()
    assert model.numvfs_of(NIC_PF) == 4
    devices = h.hooks.list_devices()
    assert [(d.id, d.topology) for d in devices] == [(nic_vf(0), Topology((1,))), (nic_vf(1), Topology((1,)))]
    assert model.driver_of(nic_vf(0)) == "iavf"  # autoprobe stays 1 in kernel mode

    allocation = h.hooks.allocate([nic_vf(0), nic_vf(1)])
    assert allocation.envs == {"PCIDEVICE_EXAMPLE_COM_VF": f"{nic_vf(0)},{nic_vf(1)}"}
    assert allocation.devices == ()
    links.set_vf("ens1f0", 0, mac="02:00:00:00:00:01", vlan=100, trust=True, spoofchk=False)  # the tenant's

    h.release([nic_vf(0), nic_vf(1)])

    assert links.resets == [("ens1f0", 0), ("ens1f0", 1)]
    assert links.vf("ens1f0", 0) == VfSettings(mac="00:00:00:00:00:00", vlan=0, spoofchk=True, trust=False)
    assert model.driver_of(nic_vf(0)) == "iavf"
    h.release([nic_vf(0), nic_vf(1)], retry=True)  # at least once: already done, nothing more
    assert len(links.resets) == 2


def test_reset_defaults_come_from_the_options(model: PciSysfsModel, links: VfLinkModel, make_harness: Any) -> None:
    h = make_harness(model, links, vfs=["ens1f0#0"], spoofchk=False, trust=True)
    model.write_text(model.sysfs_root / f"bus/pci/devices/{NIC_PF}/sriov_numvfs", "1")
    h.start()
    h.hooks.allocate([nic_vf(0)])
    h.release([nic_vf(0)])
    assert links.vf("ens1f0", 0) == VfSettings(spoofchk=False, trust=True)


def test_a_vf_that_cannot_be_reset_stays_unhealthy_with_the_reason(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any, clock: ManualClock, kit: ModuleType
) -> None:
    h = make_harness(model, links, pfs=["ens1f0"], num_vfs=2).start()
    table = h.hooks.list_devices()
    h.hooks.allocate([nic_vf(0)])
    links.set_vf("ens1f0", 0, vlan=42, trust=True)  # the tenant's; a VF already as wanted needs no request
    links.refuse.add(("ens1f0", 0))

    with pytest.raises(DriverError, match="ens1f0 VF 0: the kernel refused to reset its settings"):
        h.release([nic_vf(0)])

    assert h.hooks.check_health(table) == {nic_vf(0): Health.UNHEALTHY}
    assert [d.health for d in h.hooks.list_devices()] == [Health.UNHEALTHY, Health.HEALTHY]
    assert "Operation not supported" in _state(h)[nic_vf(0)]["reason"]
    links.refuse.clear()  # fixed: the next rescan's retry, once it is due, succeeds
    clock.advance(kit.RETRY_DUE)
    assert {d.id: d.health for d in h.driver.refresh()}[nic_vf(0)] is Health.HEALTHY
    assert links.resets == [("ens1f0", 0)]
    assert _state(h) == {}


def test_a_crash_while_resetting_is_finished_on_restart(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any, kit: ModuleType
) -> None:
    class Dying(VfLinkModel):
        def reset_vf(self, pf_ifname: str, vf: int, settings: VfSettings) -> None:
            raise kit.SimulatedCrash("killed during the netlink reset")

    h = make_harness(model, Dying(), pfs=["ens1f0"], num_vfs=2).start()
    h.hooks.allocate([nic_vf(1)])
    with pytest.raises(kit.SimulatedCrash):
        h.release([nic_vf(1)])
    assert _state(h)[nic_vf(1)]["phase"] == "resetting"

    restarted = make_harness(model, links, state_dir=h.ctx.state_dir, pfs=["ens1f0"], num_vfs=2).start()
    assert links.resets == [("ens1f0", 1)]
    assert model.numvfs_of(NIC_PF) == 2  # nothing re-created
    restarted.release([nic_vf(1)], retry=True)
    assert links.resets == [("ens1f0", 1)]


def _igb_nic(model: PciSysfsModel, links: VfLinkModel) -> None:
    """ens3f0: an 82576 on igb (no link-state handler), its VF settings following the PCI model."""
    model.add_device(IGB_PF, 0x8086, 0x10C9, 0x020000, iommu_group=30, driver="igb")
    model.enable_sriov(IGB_PF, 7, 0x10CA, offset=128, stride=2, vf_driver="igbvf", netdev="ens3f0")
    links.add_pf("ens3f0", ops=IGB_VF_OPS, pci=model, address=IGB_PF)


def test_the_reset_sends_what_differs_each_on_its_own_trust_first_and_checks_it(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    _igb_nic(model, links)
    h = make_harness(model, links, pfs=["ens3f0"], num_vfs=2).start()
    h.hooks.allocate([IGB_VF0, IGB_VF1])
    links.set_vf("ens3f0", 0, mac="02:00:00:00:00:01", vlan=5, qos=2, spoofchk=False, trust=True)
    links.set_vf("ens3f0", 1, vlan=7)
    links.requests.clear()

    h.release([IGB_VF0, IGB_VF1])

    assert links.requests == [  # never the link state: igb reports auto, the wanted value
        ("ens3f0", 0, ("trust",)),
        ("ens3f0", 0, ("mac",)),
        ("ens3f0", 0, ("vlan",)),
        ("ens3f0", 0, ("spoofchk",)),
        ("ens3f0", 1, ("vlan",)),
    ]
    assert [links.vf_state("ens3f0", i) for i in range(2)] == [NEW_VF, NEW_VF]
    assert links.resets == [("ens3f0", 0), ("ens3f0", 1)]


def test_the_old_one_request_reset_fails_on_igb_and_leaves_the_vf_trusted(links: VfLinkModel) -> None:
    links.add_pf("ens3f0", 2, ops=IGB_VF_OPS)
    links.set_vf("ens3f0", 0, mac="02:00:00:00:00:01", vlan=5, trust=True)
    with pytest.raises(VfRefused) as info:  # what the reset sent before: every attribute in one RTM_SETLINK
        links.set_vf("ens3f0", 0, mac="00:00:00:00:00:00", vlan=0, spoofchk=True, link_state=0, trust=False)
    assert info.value.errno == errno.EOPNOTSUPP
    assert links.vf_state("ens3f0", 0) == VfState("00:00:00:00:00:00", 0, 0, True, True, 0)
    links.reset_vf("ens3f0", 0, VfSettings())  # the reset now
    assert links.vf_state("ens3f0", 0) == NEW_VF


def test_a_vf_whose_trust_cannot_be_cleared_stays_out_of_service_saying_so(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any, clock: ManualClock, kit: ModuleType
) -> None:
    _igb_nic(model, links)
    h = make_harness(model, links, pfs=["ens3f0"], num_vfs=2).start()
    table = h.hooks.list_devices()
    h.hooks.allocate([IGB_VF0])
    links.set_vf("ens3f0", 0, mac="02:00:00:00:00:01", vlan=5, trust=True)
    links.fail[("ens3f0", 0, "trust")] = errno.EIO

    with pytest.raises(DriverError) as info:
        h.release([IGB_VF0])

    message = str(info.value)
    assert message == (
        "ens3f0 VF 0: the kernel refused to reset its settings (the VF may still be TRUSTED): "
        "trust: on, wanted off (refused: [Errno 5] Input/output error)"
    )
    assert links.vf("ens3f0", 0) == VfSettings(trust=True)  # the rest was reset all the same
    assert h.hooks.check_health(table) == {IGB_VF0: Health.UNHEALTHY}
    pushed = {d.id: d for d in h.sink.pushes[-1]}
    assert (pushed[IGB_VF0].health, pushed[IGB_VF0].reason) == (Health.UNHEALTHY, message)
    assert h.sink.published == {"reset_failures": {IGB_VF0: message}}
    assert _state(h)[IGB_VF0]["reason"] == message
    links.requests.clear()
    clock.advance(kit.RETRY_DUE)
    assert {d.id: d.health for d in h.driver.refresh()}[IGB_VF0] is Health.UNHEALTHY  # retried, refused again
    assert links.requests == [("ens3f0", 0, ("trust",))]

    del links.fail[("ens3f0", 0, "trust")]  # the driver recovers: the next rescan's retry clears it
    clock.advance(kit.RETRY_DUE)
    assert {d.id: (d.health, d.reason) for d in h.driver.refresh()}[IGB_VF0] == (Health.HEALTHY, "")
    assert links.vf_state("ens3f0", 0) == NEW_VF
    assert h.sink.published == {"reset_failures": {}}


def test_a_reset_the_kernel_refuses_is_retried_with_capped_backoff_not_on_every_rescan(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any, clock: ManualClock
) -> None:
    # Issue 31: igb refuses any link state (it has no ndo_set_vf_link_state), so a resource resetting VFs to
    # "disable" fails for good; the rescan loop sent that reset again on every rescan (0.2 s in the e2e test), each
    # attempt netlink round trips through the PF. Each VF now waits one period (here the kit's 0.5 s minimum)
    # after its first failure, doubling after each further one, up to a minute.
    _igb_nic(model, links)
    h = make_harness(model, links, pfs=["ens3f0"], num_vfs=2, link_state="disable").start()
    h.hooks.allocate([IGB_VF0])
    with pytest.raises(DriverError, match="link state: auto, wanted disable"):
        h.release([IGB_VF0])

    def attempts() -> int:  # each attempt sends the one setting that differs: the link state
        assert {r for r in links.requests if r[:2] == ("ens3f0", 0)} <= {("ens3f0", 0, ("link_state",))}
        return sum(1 for r in links.requests if r[:2] == ("ens3f0", 0))

    for wait in [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]:
        before = attempts()
        for _ in range(3):  # rescans before the wait is over send nothing
            assert {d.id: d.health for d in h.driver.refresh()}[IGB_VF0] is Health.UNHEALTHY
            clock.advance(wait / 4)
        assert attempts() == before, f"retried before its {wait} s wait was over"
        clock.advance(wait / 4)
        h.driver.refresh()
        assert attempts() == before + 1, f"not retried once its {wait} s wait was over"

    failures = h.driver.retries.failures(IGB_VF0)
    with pytest.raises(DriverError):  # the engine's own retry of the release counts as an attempt too
        h.hooks.deallocate([IGB_VF0], True)
    assert h.driver.retries.failures(IGB_VF0) == failures + 1
    before = attempts()
    clock.advance(59.0)
    h.driver.refresh()
    assert attempts() == before  # the loop does not add its attempt right after the engine's

    h.hooks.allocate([IGB_VF1])  # another VF of the resource is not held up by the failing one
    links.set_vf("ens3f0", 1, trust=True)
    with pytest.raises(DriverError, match=r"ens3f0 VF 1: .*link state: auto, wanted disable"):
        h.release([IGB_VF1])  # tried at once, though VF 0 is backing off
    assert links.vf_state("ens3f0", 1) == NEW_VF


def test_a_retry_in_progress_holds_nothing_the_release_of_another_vf_needs(
    model: PciSysfsModel, make_harness: Any, clock: ManualClock, kit: ModuleType
) -> None:
    class Stalling(VfLinkModel):
        """VF 0's trust request, sent from any thread but the test's, waits until the test lets it go."""

        def __init__(self) -> None:
            super().__init__()
            self.inside = threading.Event()
            self.go = threading.Event()

        def set_vf(self, pf_ifname: str, vf: int, **attributes: Any) -> None:
            if vf == 0 and "trust" in attributes and threading.current_thread() is not threading.main_thread():
                self.inside.set()
                self.go.wait(kit.WAIT)
            super().set_vf(pf_ifname, vf, **attributes)

    links = Stalling()
    _igb_nic(model, links)
    h = make_harness(model, links, pfs=["ens3f0"], num_vfs=2).start()
    table = h.hooks.list_devices()
    h.hooks.allocate([IGB_VF0, IGB_VF1])
    for index in range(2):
        links.set_vf("ens3f0", index, trust=True)
    links.fail[("ens3f0", 0, "trust")] = errno.EIO
    with pytest.raises(DriverError, match=r"VF 0: .*TRUSTED"):
        h.release([IGB_VF0])
    del links.fail[("ens3f0", 0, "trust")]

    clock.advance(kit.RETRY_DUE)
    retry = threading.Thread(target=h.driver.refresh, name="rescan")  # as the rescan loop: retries VF 0
    retry.start()
    try:
        assert links.inside.wait(kit.WAIT), "the retry of VF 0 never reached netlink"
        other = threading.Thread(target=h.release, args=([IGB_VF1],), name="hook")
        other.start()
        other.join(kit.WAIT)  # a bound: it waits for nothing of VF 0's retry, so it ends at once
        assert not other.is_alive(), "the release of VF 1 waited for the retry of VF 0"
        assert links.vf_state("ens3f0", 1) == NEW_VF
        assert h.hooks.check_health(table) == {IGB_VF0: Health.UNHEALTHY}  # the scan is not held up either
    finally:
        links.go.set()
        retry.join(kit.WAIT)
    assert not retry.is_alive()
    assert links.vf_state("ens3f0", 0) == NEW_VF  # and the retry, let go, succeeded
    assert _state(h) == {}


def test_start_loads_the_netlink_library_when_the_pool_has_network_pfs_and_only_then(
    model: PciSysfsModel, make_harness: Any, kit: ModuleType, tmp_path: Path
) -> None:
    # Issue 31: the first release paid pyroute2's import (14 s of a 19 s reset in the TCG guest, 0.2 s of CPU on a
    # server); a resource on NVMe PFs has no settings to reset and never imports it.
    class Counted(VfLinkModel):
        def __init__(self) -> None:
            super().__init__()
            self.prepared = 0

        def prepare(self) -> None:
            self.prepared += 1

    network = Counted()
    network.add_pf("ens1f0", 8)
    make_harness(model, network, pfs=["ens1f0"], num_vfs=1).start()
    assert network.prepared == 1
    storage = Counted()
    make_harness(kit.build_model(tmp_path / "nvme"), storage, pfs=[kit.PF], num_vfs=1).start()
    assert storage.prepared == 0


def test_a_setting_the_driver_takes_but_does_not_apply_is_caught_by_the_check(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    _igb_nic(model, links)
    h = make_harness(model, links, pfs=["ens3f0"], num_vfs=1).start()
    h.hooks.allocate([IGB_VF0])
    links.set_vf("ens3f0", 0, vlan=5, qos=1)
    links.ignore.add(("ens3f0", 0, "vlan"))
    with pytest.raises(DriverError, match=r"VF 0: .*settings: VLAN: 5 qos 1, wanted none \(set without error\)$"):
        h.release([IGB_VF0])
    assert [d.health for d in h.hooks.list_devices()] == [Health.UNHEALTHY]


def test_a_link_state_the_driver_has_a_handler_for_is_reset(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    h = make_harness(model, links, pfs=["ens1f0"], num_vfs=1, link_state="disable").start()  # i40e-like: it has one
    h.hooks.allocate([nic_vf(0)])
    links.set_vf("ens1f0", 0, link_state=1, trust=True)
    h.release([nic_vf(0)])
    assert links.vf("ens1f0", 0) == VfSettings(link_state=2)


def test_a_network_pf_without_a_visible_interface_is_not_taken_for_a_non_network_one(
    tmp_path: Path, links: VfLinkModel, make_harness: Any
) -> None:
    machine = PciSysfsModel(tmp_path / "netless")
    machine.add_device(IGB_PF, 0x8086, 0x10C9, 0x020000, iommu_group=30, driver="igb")
    machine.enable_sriov(IGB_PF, 7, 0x10CA, offset=128, stride=2, vf_driver="igbvf")  # its interface elsewhere
    h = make_harness(machine, links, pfs=[IGB_PF], num_vfs=1).start()
    h.hooks.allocate([IGB_VF0])
    with pytest.raises(DriverError, match=rf"{IGB_VF0}: its PF {IGB_PF} .* is a network controller whose interface"):
        h.release([IGB_VF0])
    assert [d.health for d in h.hooks.list_devices()] == [Health.UNHEALTHY]


def test_pf_link_down_makes_its_vfs_unhealthy_when_asked(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    watched = make_harness(model, links, pfs=["ens1f0"], num_vfs=1, pf_link_health=True).start()
    plain = make_harness(model, links, resource="example.com/plain", pfs=["ens2f0"], num_vfs=1).start()
    watched_table, plain_table = watched.hooks.list_devices(), plain.hooks.list_devices()
    links.set_link("ens1f0", False)
    links.set_link("ens2f0", False)
    assert watched.hooks.check_health(watched_table) == {nic_vf(0): Health.UNHEALTHY}
    assert plain.hooks.check_health(plain_table) == {}
    links.set_link("ens1f0", True)
    assert [d.health for d in watched.hooks.list_devices()] == [Health.HEALTHY]


def test_rdma_vfs_bring_their_verbs_devices(model: PciSysfsModel, links: VfLinkModel, make_harness: Any) -> None:
    h = make_harness(model, links, pfs=["ens2f0"], num_vfs=2).start()
    allocation = h.hooks.allocate([nic_vf(0, "86")])
    verbs = model.sysfs_root / f"bus/pci/devices/{nic_vf(0, '86')}/infiniband_verbs"
    (name,) = model.listdir(verbs)
    assert allocation.devices == (
        DeviceSpec(f"/dev/infiniband/{name}", f"/dev/infiniband/{name}", "rw"),
        DeviceSpec("/dev/infiniband/rdma_cm", "/dev/infiniband/rdma_cm", "rw"),
    )
    assert allocation.envs == {"PCIDEVICE_EXAMPLE_COM_VF": nic_vf(0, "86")}


# --- pools ----------------------------------------------------------------------------------


def test_pools_by_pf_range_vendor_device_and_driver(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    low = make_harness(model, links, resource="example.com/low", pfs=["ens1f0"], num_vfs=4, vfs=["ens1f0#0-1"])
    high = make_harness(model, links, resource="example.com/high", vfs=[f"{NIC_PF}#2-3"])
    assert low.start().ids() == [nic_vf(0), nic_vf(1)]
    assert high.start().ids() == [nic_vf(2), nic_vf(3)]
    by_id = make_harness(model, links, resource="example.com/id", vf_devices=["8086:154c"]).start()
    assert by_id.ids() == [nic_vf(i) for i in range(4)]
    model.write_text(model.sysfs_root / f"bus/pci/devices/{NIC2_PF}/sriov_numvfs", "2")
    assert by_id.ids() == [*(nic_vf(i) for i in range(4)), nic_vf(0, "86"), nic_vf(1, "86")]
    by_driver = make_harness(model, links, resource="example.com/drv", vf_kernel_drivers=["iavf"]).start()
    assert len(by_driver.ids()) == 6
    nothing = make_harness(model, links, resource="example.com/none", vf_kernel_drivers=["mlx5_core"]).start()
    assert nothing.ids() == []


def test_vfio_mode_selects_vfs_by_their_own_driver_while_bound(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    model.write_text(model.sysfs_root / f"bus/pci/devices/{NIC_PF}/sriov_numvfs", "2")  # autoprobe 1: on iavf
    h = make_harness(model, links, vf_kernel_drivers=["iavf"], vf_driver="vfio-pci", autoprobe=True).start()
    h.hooks.allocate([nic_vf(0)])
    assert model.driver_of(nic_vf(0)) == "vfio-pci"
    assert h.ids() == [nic_vf(0), nic_vf(1)]  # still selected: its own driver is iavf
    h.release([nic_vf(0)])
    assert model.driver_of(nic_vf(0)) == "iavf"


# --- config ---------------------------------------------------------------------------------


def _tables(model: PciSysfsModel, resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    roots = {"sysfs_root": str(model.sysfs_root), "dev_root": str(model.dev_root)}
    return {name: {"driver": "sriov", "options": {**options, **roots}} for name, options in resources.items()}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "at least one of pfs, vfs, vf_devices or vf_kernel_drivers"),
        ({"pfs": ["ens 1"]}, "pfs: 'ens 1' is not a PCI address"),
        ({"vfs": ["ens1f0"]}, "vfs: 'ens1f0' is not '<pf>#<first>-<last>'"),
        ({"vfs": ["ens1f0#3-1"]}, "the range ends before it starts"),
        ({"vfs": ["8086:1572#0"]}, "name the PF by address or interface name"),
        ({"num_vfs": 4, "vf_devices": ["8086:154c"]}, "num_vfs: say on which physical functions"),
        ({"pfs": ["ens1f0"], "vf_driver": "vfio"}, r"vf_driver: expected one of 'kernel', 'vfio-pci'"),
        ({"pfs": ["ens1f0"], "vf_devices": ["154c"]}, "vf_devices: '154c' is not a 'vendor:device'"),
        ({"pfs": ["ens1f0"], "num_vf": 4}, "num_vf: unknown key; did you mean 'num_vfs'"),
        ({"pfs": ["ens1f0"], "link_state": "down"}, r"link_state: expected one of 'auto', 'enable', 'disable'"),
    ],
)
def test_config_errors_name_the_resource_and_the_key(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as excinfo:
        parse_config({"resources": {"example.com/vf": {"driver": "sriov", "options": options}}}, source="dp.toml")
    assert 'dp.toml: resources."example.com/vf".options' in str(excinfo.value)


def test_two_resources_claiming_one_vf_is_a_config_error_naming_both(model: PciSysfsModel) -> None:
    tables = _tables(
        model,
        {
            "example.com/a": {"pfs": ["ens1f0"], "num_vfs": 4, "vfs": ["ens1f0#0-2"]},
            "example.com/b": {"vfs": [f"{NIC_PF}#2-3"]},
        },
    )
    with pytest.raises(ConfigError, match=f"VF 2 of {NIC_PF} is claimed by both example.com/a and example.com/b"):
        parse_config({"resources": tables}, source="dp.toml")
    tables["example.com/b"]["options"]["vfs"] = [f"{NIC_PF}#3"]
    assert len(parse_config({"resources": tables}, source="dp.toml").resources) == 2


def test_two_resources_setting_one_pf_up_differently_is_a_config_error(model: PciSysfsModel) -> None:
    tables = _tables(
        model,
        {
            "example.com/a": {"pfs": ["ens1f0"], "num_vfs": 4, "vfs": ["ens1f0#0-1"]},
            "example.com/b": {"pfs": [NIC_PF], "num_vfs": 8, "vfs": ["ens1f0#2-3"]},
        },
    )
    with pytest.raises(ConfigError, match=f"example.com/a and example.com/b both set up {NIC_PF}, with num_vfs = 4"):
        parse_config({"resources": tables}, source="dp.toml")


def test_selectors_are_checked_against_the_node(model: PciSysfsModel) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"pfs": ["ens9f9"]}, "pfs: 'ens9f9' names no SR-IOV physical function on this node"),
        ({"pfs": ["ens1f0"], "num_vfs": 9}, f"num_vfs = 9 but {NIC_PF} supports at most 8 VFs"),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message):
            parse_config({"resources": _tables(model, {"example.com/a": options})}, source="dp.toml")


def _config_file(tmp_path: Path, model: PciSysfsModel, resources: dict[str, dict[str, Any]]) -> Path:
    return write_toml(
        tmp_path / "devplug.toml", {"state": {"dir": str(tmp_path / "state")}, "resources": _tables(model, resources)}
    )


def _tree(model: PciSysfsModel) -> dict[str, str]:
    folder = model.sysfs_root / "bus/pci/devices" / NIC_PF
    return {name: model.read_text(folder / name) for name in ("sriov_numvfs", "sriov_drivers_autoprobe")}


def test_check_config_validates_against_the_node_and_changes_nothing(tmp_path: Path, model: PciSysfsModel) -> None:
    before = _tree(model)
    bad = _config_file(
        tmp_path,
        model,
        {"example.com/a": {"pfs": ["ens1f0"], "num_vfs": 4}, "example.com/b": {"vfs": ["ens1f0#3"]}},
    )
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert f"VF 3 of {NIC_PF} is claimed by both example.com/a and example.com/b" in result.stderr
    good = _config_file(tmp_path, model, {"example.com/a": {"pfs": ["ens1f0"], "num_vfs": 4}})
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(good)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert _tree(model) == before


def test_setup_dry_run_prints_what_would_be_written_and_writes_nothing(
    tmp_path: Path, model: PciSysfsModel, kit: ModuleType
) -> None:
    before = _tree(model)
    path = _config_file(tmp_path, model, {"example.com/a": {"pfs": ["ens1f0"], "num_vfs": 4, "vf_driver": "vfio-pci"}})
    result = kit.run_setup("--config", str(path), "--dry-run")
    assert result.returncode == 0, result.stderr
    folder = f"{model.sysfs_root}/bus/pci/devices/{NIC_PF}"
    assert result.stdout.splitlines() == [
        f"would write 0 to {folder}/sriov_drivers_autoprobe  # VFs stay without a driver until vfio-pci takes them "
        "[example.com/a]",
        f"would write 4 to {folder}/sriov_numvfs  # 0 -> 4 VFs [example.com/a]",
    ]
    assert _tree(model) == before


def test_setup_refuses_a_pf_without_driver_clearly(model: PciSysfsModel, links: VfLinkModel, make_harness: Any) -> None:
    model.unload_driver("i40e")
    with pytest.raises(DriverError, match=f"{NIC_PF} has no driver bound; the kernel creates VFs only through"):
        make_harness(model, links, pfs=[NIC_PF], num_vfs=2).start()
    with pytest.raises(ValueError, match="pfs: 'ens1f0' names no SR-IOV physical function"):
        # without its driver the PF has no interface either, so the name selects nothing
        SriovDriver.check_resources(
            {"example.com/a": SriovOptions(pfs=("ens1f0",), sysfs_root=model.sysfs_root, dev_root=model.dev_root)}
        )


def test_the_setup_never_removes_vfs_another_resource_has_handed_out(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    low = make_harness(model, links, resource="example.com/low", pfs=["ens1f0"], num_vfs=2, vfs=["ens1f0#0"]).start()
    low.hooks.allocate([nic_vf(0)])
    other = make_harness(model, links, resource="example.com/high", pfs=["ens1f0"], num_vfs=4, vfs=["ens1f0#1-3"])
    with pytest.raises(DriverError, match=rf"example.com/high: cannot change {NIC_PF} from 2 to 4 VFs.*{nic_vf(0)}"):
        other.start()
    assert model.numvfs_of(NIC_PF) == 2


def test_model_sriov_rules_only_the_model_can_stage(model: PciSysfsModel) -> None:
    numvfs = model.sysfs_root / f"bus/pci/devices/{NIC_PF}/sriov_numvfs"
    model.write_text(numvfs, "2")  # autoprobe 1 (the default): the VF driver takes new VFs at once
    assert [model.driver_of(nic_vf(i)) for i in range(2)] == ["iavf", "iavf"]
    assert model.listdir(model.sysfs_root / f"bus/pci/devices/{nic_vf(1)}/net") == ["ens1f0v1"]
    model.write_text(numvfs, "0")
    model.unload_driver("i40e")
    with pytest.raises(OSError, match="no driver bound") as info:  # sriov_numvfs_store: -ENOENT without a PF driver
        model.write_text(numvfs, "2")
    assert info.value.errno == errno.ENOENT


# --- device status (contract 1.1, issue 41) ---------------------------------------------------------


def test_device_status_is_off_by_default(model: PciSysfsModel, links: VfLinkModel, make_harness: Any) -> None:
    h = make_harness(model, links, pfs=["ens1f0"], num_vfs=2).start()
    assert not h.hooks.allocate([nic_vf(0)]).device_status


def test_device_status_shows_each_vf_its_interface_and_mac(
    model: PciSysfsModel, links: VfLinkModel, make_harness: Any
) -> None:
    h = make_harness(model, links, pfs=["ens1f0"], num_vfs=2, device_status=True).start()
    # the VF's interface shows its MAC in sysfs (the model draws no address file: the test writes the kernel's)
    (model.sysfs_root / f"bus/pci/devices/{nic_vf(0)}/net/ens1f0v0/address").write_text("02:11:22:33:44:55\n")
    links.set_vf("ens1f0", 1, mac="02:00:00:00:00:0b")  # VF 1: only its PF's view knows a MAC

    statuses = h.hooks.allocate([nic_vf(0), nic_vf(1)]).device_status

    assert dict(statuses) == {
        nic_vf(0): DeviceStatus(
            data={"pciAddress": nic_vf(0), "pf": NIC_PF, "vfIndex": 0, "pfInterface": "ens1f0"},
            network_data=NetworkData(interface_name="ens1f0v0", hardware_address="02:11:22:33:44:55"),
        ),
        nic_vf(1): DeviceStatus(
            data={"pciAddress": nic_vf(1), "pf": NIC_PF, "vfIndex": 1, "pfInterface": "ens1f0"},
            network_data=NetworkData(interface_name="ens1f0v1", hardware_address="02:00:00:00:00:0b"),
        ),
    }


def test_a_vfio_bound_vf_shows_no_interface(model: PciSysfsModel, links: VfLinkModel, make_harness: Any) -> None:
    model.write_text(model.sysfs_root / f"bus/pci/devices/{NIC_PF}/sriov_numvfs", "1")
    h = make_harness(model, links, vfs=["ens1f0#0"], vf_driver="vfio-pci", autoprobe=True, device_status=True)
    h.start()
    status = h.hooks.allocate([nic_vf(0)]).device_status[nic_vf(0)]
    assert model.driver_of(nic_vf(0)) == "vfio-pci"
    assert status == DeviceStatus(data={"pciAddress": nic_vf(0), "pf": NIC_PF, "vfIndex": 0, "pfInterface": "ens1f0"})


def test_device_status_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="device_status: expected true or false") as excinfo:
        parse_config(
            {
                "resources": {
                    "example.com/vf": {"driver": "sriov", "options": {"pfs": ["ens1f0"], "device_status": "on"}}
                }
            },
            source="dp.toml",
        )
    assert 'dp.toml: resources."example.com/vf".options' in str(excinfo.value)
