"""What only the kernel model can stage: IOMMU switched off, busy devices, bridges in groups, NUMA,
hot-plug of new hardware, two resources, read-only sysfs; and the config through the core's parser."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug import ConfigError, DriverError, Health, Topology
from devplug.config import parse_config
from devplug.testing.pcisysfs import PciSysfsModel
from devplug_vfio import STATE_FILE, VfioDriver, VfioOptions


@pytest.fixture
def model(tmp_path: Path, kit: ModuleType) -> PciSysfsModel:
    built: PciSysfsModel = kit.build_model(tmp_path / "machine")
    return built


def _config(options: dict[str, Any], name: str = "example.com/gpu") -> Any:
    return parse_config({"resources": {name: {"driver": "vfio", "options": options}}}, source="devplug.toml")


# --- config -----------------------------------------------------------------------------


def test_config_builds_the_driver_with_normalised_options() -> None:
    cfg = _config({"vendors": ["0x10DE"], "addresses": ["3b:00.*"], "classes": ["0302"], "bind": "at-start"})
    resource = cfg.resources[0]
    assert resource.driver_class is VfioDriver
    assert resource.options == VfioOptions(
        vendors=("10de",), addresses=("0000:3b:00.*",), classes=("0302",), bind="at-start"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "at least one of vendors, devices, addresses, classes or drivers"),
        ({"exclude_addresses": ["0000:00:01.0"]}, "at least one of vendors"),
        ({"vendors": ["80860"]}, "vendors: '80860' is not a 4-digit hex ID"),
        ({"devices": ["10d3"]}, "devices: '10d3' is not a 'vendor:device' hex pair"),
        ({"classes": ["020"]}, "classes: '020' is not a class code prefix"),
        ({"addresses": ["0000:3b:00.0/1"]}, "addresses: '0000:3b:00.0/1' is not a PCI address or glob"),
        ({"vendors": ["8086"], "bind": "now"}, r"bind: expected one of 'on-allocate', 'at-start'"),
        ({"vendors": ["8086"], "vendor": ["8086"]}, "vendor: unknown key; did you mean 'vendors'"),
        ({"vendors": "8086"}, "vendors: expected a list of a string"),
        ({"vendors": ["8086"], "rescan_interval": -1}, "rescan_interval: must be a finite number of seconds from 0"),
    ],
)
def test_config_errors_name_the_resource_and_the_key(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as excinfo:
        _config(options)
    assert 'devplug.toml: resources."example.com/gpu".options' in str(excinfo.value)


# --- selection --------------------------------------------------------------------------


def test_selection_keys_combine_and_exclusions_win(model: PciSysfsModel, make_harness: Any, kit: ModuleType) -> None:
    h = make_harness(model, vendors=["1234"], exclude_addresses=["0000:00:05.*"]).start()
    assert [d.id for d in h.hooks.list_devices()] == [kit.LONE]
    both = make_harness(model, resource="example.com/b", devices=["1234:11e8"], addresses=["00:05.*"]).start()
    assert [d.id for d in both.hooks.list_devices()] == list(kit.PAIR)


def test_unselected_devices_are_never_written(model: PciSysfsModel, make_harness: Any, kit: ModuleType) -> None:
    h = make_harness(model, devices=["8086:10d3"]).start()
    h.hooks.allocate([kit.NIC])
    h.release([kit.NIC])
    touched = {path for path, _ in model.writes}
    assert all(kit.NIC in path or data.strip() == kit.NIC for path, data in model.writes), touched
    assert not any(path.endswith("new_id") for path in touched)


def test_numa_node_becomes_the_topology(model: PciSysfsModel, make_harness: Any) -> None:
    model.add_device("0000:3b:00.0", 0x10DE, 0x2330, 0x030200, numa_node=1, iommu_group=20)
    model.add_device("0000:86:00.0", 0x10DE, 0x2330, 0x030200, numa_node=0, iommu_group=21)
    h = make_harness(model, vendors=["10de"]).start()
    assert {d.id: d.topology for d in h.hooks.list_devices()} == {
        "0000:3b:00.0": Topology((1,)),
        "0000:86:00.0": Topology((0,)),
    }


def test_two_resources_selecting_one_device_is_an_error_naming_both(
    model: PciSysfsModel, make_harness: Any, kit: ModuleType
) -> None:
    first = make_harness(model, resource="example.com/edu", vendors=["1234"]).start()
    second = make_harness(model, resource="example.com/lone", addresses=[kit.LONE])
    with pytest.raises(DriverError, match=r"0000:00:03\.0 is selected by both example\.com/edu and example\.com/lone"):
        second.start()
    first.hooks.stop()  # the first resource lets go: the second may take the device
    second.start()
    assert [d.id for d in second.hooks.list_devices()] == [kit.LONE]


def test_two_resources_selecting_one_device_is_a_config_error_naming_both(
    model: PciSysfsModel, kit: ModuleType
) -> None:
    roots = {"sysfs_root": str(model.sysfs_root), "dev_root": str(model.dev_root)}
    tables = {
        "example.com/edu": {"driver": "vfio", "options": {"vendors": ["1234"], **roots}},
        "example.com/lone": {"driver": "vfio", "options": {"addresses": [kit.LONE], **roots}},
    }
    with pytest.raises(ConfigError) as info:
        parse_config({"resources": tables}, source="devplug.toml")
    message = str(info.value)
    assert message.startswith('devplug.toml: resources "example.com/edu", "example.com/lone" (driver vfio)')
    assert f"{kit.LONE} (1234:11e8" in message
    assert "selected by both example.com/edu and example.com/lone" in message
    tables["example.com/edu"]["options"]["exclude_addresses"] = [kit.LONE]  # type: ignore[index]
    assert len(parse_config({"resources": tables}, source="devplug.toml").resources) == 2


# --- groups with bridges ------------------------------------------------------------------


def _group_with_bridge(model: PciSysfsModel) -> None:
    model.add_device("0000:00:1c.0", 0x8086, 0xA110, 0x060400, iommu_group=30, driver="pcieport")
    model.add_device("0000:01:00.0", 0x10DE, 0x2330, 0x030200, iommu_group=30, driver="nvidia")


def test_a_bridge_in_the_group_is_refused_unless_partial_groups_are_allowed(
    model: PciSysfsModel, make_harness: Any
) -> None:
    _group_with_bridge(model)
    strict = make_harness(model, vendors=["10de"])
    with pytest.raises(DriverError, match=r"IOMMU group 30 holds 0000:00:1c\.0 .*allow_partial_groups"):
        strict.start()
    partial = make_harness(model, resource="example.com/p", vendors=["10de"], allow_partial_groups=True).start()
    assert [d.id for d in partial.hooks.list_devices()] == ["0000:01:00.0"]
    partial.hooks.allocate(["0000:01:00.0"])
    assert model.driver_of("0000:01:00.0") == "vfio-pci"
    assert model.driver_of("0000:00:1c.0") == "pcieport"  # the bridge stays behind
    partial.release(["0000:01:00.0"])
    assert model.driver_of("0000:01:00.0") == "nvidia"


def test_partial_groups_still_refuse_a_foreign_endpoint(model: PciSysfsModel, make_harness: Any) -> None:
    _group_with_bridge(model)
    model.add_device("0000:01:00.1", 0x10DE, 0x22BB, 0x040300, iommu_group=30, driver="snd_hda_intel")
    h = make_harness(model, devices=["10de:2330"], allow_partial_groups=True)
    with pytest.raises(DriverError, match=r"IOMMU group 30 holds 0000:01:00\.1 \(10de:22bb.*snd_hda_intel"):
        h.start()


# --- the kernel saying no ---------------------------------------------------------------


def test_start_fails_clearly_without_an_iommu(tmp_path: Path, make_harness: Any, kit: ModuleType) -> None:
    model = kit.build_model(tmp_path / "machine")
    model.set_iommu(False)
    with pytest.raises(DriverError, match=r"no IOMMU groups under .*intel_iommu=on"):
        make_harness(model, devices=["8086:10d3"]).start()


def test_start_fails_clearly_on_read_only_sysfs(model: PciSysfsModel, make_harness: Any) -> None:
    (model.sysfs_root / "bus/pci/drivers_probe").chmod(0o444)
    with pytest.raises(DriverError, match=r"drivers_probe is not writable: sysfs under .* is read-only"):
        make_harness(model, devices=["8086:10d3"]).start()


def test_a_bind_that_fails_for_want_of_an_iommu_is_caught(
    model: PciSysfsModel, make_harness: Any, kit: ModuleType
) -> None:
    h = make_harness(model, devices=["8086:10d3"]).start()
    model.set_iommu(False)  # the probe now fails with EINVAL, and drivers_probe says nothing
    with pytest.raises(DriverError, match=r"did not bind it to vfio-pci .*without an IOMMU"):
        h.hooks.allocate([kit.NIC])
    assert model.driver_of(kit.NIC) == "e1000e"


def test_a_busy_device_stays_releasing_until_it_can_be_given_back(
    model: PciSysfsModel, make_harness: Any, kit: ModuleType
) -> None:
    h = make_harness(model, devices=["8086:10d3"]).start()
    h.hooks.allocate([kit.NIC])
    model.set_busy(kit.NIC)
    with pytest.raises(DriverError, match=r"0000:00:04\.0: cannot unbind it from vfio-pci: .*busy"):
        h.release([kit.NIC])
    state = json.loads((Path(h.ctx.state_dir) / STATE_FILE).read_text())["devices"]
    assert state[kit.NIC]["phase"] == "restoring"
    model.set_busy(kit.NIC, False)
    h.hooks.deallocate([kit.NIC])  # the engine calls again until it succeeds
    assert model.driver_of(kit.NIC) == "e1000e"


def test_a_missing_group_node_while_held_is_unhealthy(model: PciSysfsModel, make_harness: Any, kit: ModuleType) -> None:
    h = make_harness(model, addresses=[kit.LONE]).start()
    h.hooks.allocate([kit.LONE])
    devices = h.hooks.list_devices()
    group = kit.group_of(model, kit.LONE)
    (model.dev_root / "vfio" / str(group)).unlink()  # someone removes the node (rm, or a /dev not shared)
    assert h.hooks.check_health(devices) == {kit.LONE: Health.UNHEALTHY}


# --- hot-plug -----------------------------------------------------------------------------


def test_hot_plugged_devices_are_pushed(model: PciSysfsModel, make_harness: Any, kit: ModuleType) -> None:
    h = make_harness(model, vendors=["1234"]).start()
    model.add_device("0000:00:07.0", 0x1234, 0x11E8, 0x00FF00, iommu_group=9)
    h.driver.refresh()
    assert [d.id for d in h.sink.pushes[-1]] == [kit.LONE, *kit.PAIR, "0000:00:07.0"]
    pushes = len(h.sink.pushes)
    h.driver.refresh()  # nothing changed: nothing pushed
    assert len(h.sink.pushes) == pushes


def test_the_rescan_thread_notices_hot_plug(model: PciSysfsModel, make_harness: Any, kit: ModuleType) -> None:
    import threading

    h = make_harness(model, addresses=["0000:00:07.0"], rescan_interval=0.01)
    pushed = threading.Event()
    original = h.sink.replace_devices

    def record(devices: list[Any]) -> None:
        original(devices)
        pushed.set()

    h.sink.replace_devices = record
    h.start()
    model.add_device("0000:00:07.0", 0x1234, 0x11E8, 0x00FF00, iommu_group=9)
    assert pushed.wait(10.0), "the rescan thread never pushed the new device"
    assert [d.id for d in h.sink.pushes[-1]] == ["0000:00:07.0"]
