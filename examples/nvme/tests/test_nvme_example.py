"""The NVMe-like example driver, tested with the kit only: its machine is the sysfs class-tree model, its erase
tool a FakeCommand, its hooks called as the engine calls them (driver_harness), waits by poll_until."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from devplug import (
    ConfigError,
    ContainerAllocation,
    Device,
    DeviceSpec,
    DriverError,
    Health,
    HealthReport,
    ResourceSettings,
)
from devplug.options import parse_options
from devplug.testing.classsysfs import SysfsClassModel
from devplug.testing.fakecommand import FakeCommand
from devplug.testing.harness import DriverHarness
from devplug.testing.waiting import poll_until
from nvme_example import NvmeDriver

Harness = Callable[..., DriverHarness]
Serve = Callable[..., DriverHarness]


def add_drive(machine: SysfsClassModel, name: str, state: str = "live") -> None:
    """An NVMe controller as the kernel shows it (drivers/nvme/host/sysfs.c: state, model, serial; node 240:N)."""
    number = int(name.removeprefix("nvme"))
    machine.add_device(
        "nvme", name, {"state": state, "model": "Example SSD", "serial": f"SN{number:04}"}, number=(240, number)
    )


def _unhealthy(harness: DriverHarness, device_id: str) -> Device | None:
    """The device as last pushed, when it is unhealthy."""
    device = harness.sink.table.get(device_id)
    return device if device is not None and device.health is Health.UNHEALTHY else None


@pytest.fixture
def erase_tool(tmp_path: Path) -> FakeCommand:
    return FakeCommand(tmp_path / "tool", name="nvme")


def driver_on(machine: SysfsClassModel, tool: FakeCommand, **options: object) -> NvmeDriver:
    opts = NvmeDriver.Options(
        sysfs_root=machine.sysfs_root,
        dev_root=machine.dev_root,
        erase_command=(str(tool.path), "format", "{device}", "--ses=1"),
        **options,  # type: ignore[arg-type]
    )
    return NvmeDriver(opts, sysfs=machine)


@pytest.fixture
def serve(sysfs_class_tree: SysfsClassModel, erase_tool: FakeCommand, driver_harness: Harness) -> Serve:
    """``serve("nvme0", "nvme1", **options)``: those drives in the model, the driver started on them behind the
    engine's hook calls, its devices listed (the engine's table loaded into the sink)."""

    def start(*drives: str, **options: object) -> DriverHarness:
        for name in drives:
            add_drive(sysfs_class_tree, name)
        harness = driver_harness(driver_on(sysfs_class_tree, erase_tool, **options)).start()
        harness.list_devices()
        return harness

    return start


def test_drives_are_found_in_sys_class_nvme_with_their_health(
    sysfs_class_tree: SysfsClassModel, erase_tool: FakeCommand, driver_harness: Harness
) -> None:
    add_drive(sysfs_class_tree, "nvme0")
    add_drive(sysfs_class_tree, "nvme1", state="resetting")
    harness = driver_harness(driver_on(sysfs_class_tree, erase_tool)).start()
    devices = {d.id: d for d in harness.list_devices()}
    assert sorted(devices) == ["nvme0", "nvme1"]
    assert devices["nvme0"].health is Health.HEALTHY
    assert devices["nvme1"].health is Health.UNHEALTHY
    assert devices["nvme1"].reason == "controller state is 'resetting', not 'live'"


def test_health_comes_with_a_reason_per_drive(sysfs_class_tree: SysfsClassModel, serve: Serve) -> None:
    harness = serve("nvme0", "nvme1", "nvme2")
    devices = harness.list_devices()
    sysfs_class_tree.set_attribute("nvme", "nvme1", "state", "dead")
    sysfs_class_tree.fail_reads("nvme", "nvme2", "state", "EIO")
    assert harness.hooks.check_health(devices) == {
        "nvme0": HealthReport(Health.HEALTHY),
        "nvme1": HealthReport(Health.UNHEALTHY, "controller state is 'dead', not 'live'"),
        "nvme2": HealthReport(Health.UNHEALTHY, "state unreadable: read: Input/output error"),
    }


def test_a_hot_plugged_drive_is_pushed_by_the_rescan(sysfs_class_tree: SysfsClassModel, serve: Serve) -> None:
    harness = serve("nvme0", rescan_interval=0.05)
    add_drive(sysfs_class_tree, "nvme1")
    poll_until(lambda: "nvme1" in harness.sink.table, "nvme1 pushed after it appeared")
    sysfs_class_tree.remove_device("nvme", "nvme0")
    poll_until(lambda: "nvme0" not in harness.sink.table, "nvme0 gone after its removal")


def test_a_container_gets_the_drives_node(serve: Serve) -> None:
    harness = serve("nvme0", "nvme1")
    assert harness.hooks.allocate(["nvme0", "nvme1"]) == ContainerAllocation(
        devices=(DeviceSpec("/dev/nvme0", "/dev/nvme0", "rw"), DeviceSpec("/dev/nvme1", "/dev/nvme1", "rw")),
        envs={"NVME_DEVICES": "nvme0,nvme1"},
    )


def test_a_release_erases_the_drive_through_the_tool(
    sysfs_class_tree: SysfsClassModel, erase_tool: FakeCommand, serve: Serve
) -> None:
    harness = serve("nvme0")
    harness.release(["nvme0"])
    node = str(sysfs_class_tree.node("nvme0"))
    assert [c["argv"] for c in erase_tool.calls("format", "done")] == [["format", node, "--ses=1"]]


def test_a_failed_erase_keeps_the_drive_out_of_service_until_an_erase_succeeds(
    erase_tool: FakeCommand, serve: Serve
) -> None:
    harness = serve("nvme0", "nvme1")
    erase_tool.behave(format={"exit": 5, "stderr": "NVMe status: ACCESS_DENIED"})
    with pytest.raises(DriverError, match="nvme0: erase failed, the drive stays out of service"):
        harness.release(["nvme0"])
    # pushed by the rescan loop soon after (trigger), with the reason; only the failed drive is out
    pushed = poll_until(lambda: _unhealthy(harness, "nvme0"), "nvme0 pushed unhealthy after its failed erase")
    assert pushed.reason == "erase failed: stderr: NVMe status: ACCESS_DENIED"
    assert harness.sink.table["nvme1"].health is Health.HEALTHY
    assert harness.hooks.check_health([pushed]) == {"nvme0": HealthReport(Health.UNHEALTHY, pushed.reason)}

    erase_tool.behave()  # the tool works again: the engine's retry (retry=True) erases it
    harness.release(["nvme0"], retry=True)
    poll_until(lambda: harness.sink.table["nvme0"].health is Health.HEALTHY, "nvme0 healthy after an erase")
    assert len(erase_tool.calls("format", "done")) == 1


def test_a_hung_erase_is_killed_at_erase_timeout(erase_tool: FakeCommand, serve: Serve) -> None:
    harness = serve("nvme0", erase_timeout=0.5)
    erase_tool.behave(format={"hang": True})
    with pytest.raises(DriverError, match="nvme0: erase failed"):
        harness.release(["nvme0"])
    assert erase_tool.running() == []  # its process group was killed
    pushed = poll_until(lambda: _unhealthy(harness, "nvme0"), "nvme0 pushed unhealthy after its erase timed out")
    assert pushed.reason == "erase failed: timed out after 0.5 s"


def test_a_hot_removed_drive_needs_no_erase(
    sysfs_class_tree: SysfsClassModel, erase_tool: FakeCommand, serve: Serve
) -> None:
    harness = serve("nvme0")
    sysfs_class_tree.remove_device("nvme", "nvme0")
    harness.release(["nvme0"], retry=True)
    assert erase_tool.calls() == []


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"erase_command": ["nvme", "format"]}, "erase_command"),
        ({"erase_timeout": 0}, "erase_timeout"),
        ({"sysfs_root": "/proc/sys"}, "sysfs_root"),
        ({"dev_root": "/sys/dev"}, "dev_root"),
        ({"erase_timeout": "soon"}, "erase_timeout"),
    ],
)
def test_bad_options_are_refused_naming_the_key(options: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_options(NvmeDriver.Options, options, "resources.nvme.options")


def test_a_shared_resource_is_refused() -> None:
    settings = {"example.com/nvme": ResourceSettings(hook_timeout=30.0, health_interval=10.0, replicas=2)}
    with pytest.raises(ValueError, match=r"example\.com/nvme: replicas must be 1"):
        NvmeDriver.check_resources({"example.com/nvme": NvmeDriver.Options()}, settings)
