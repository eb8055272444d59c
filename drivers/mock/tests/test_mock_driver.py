"""The mock driver behind the core's real facade (DriverHooks), with the kit's recording DeviceSink.

Devices and health, hot-plug pushes, allocation and the call log, the test directives.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devplug import ContainerAllocation, Device, DeviceSpec, DriverError, Health, Mount, Topology
from devplug.drivers import HOOK_NAMES, DriverHooks
from devplug.testing.harness import DriverHarness, make_harness
from devplug_mock import CALLS_FILE, DIRECTIVE_HOOKS, MockDriver, MockOptions, read_calls

WAIT = 5.0  # seconds: a generous bound on "soon"; tests wait on conditions, never assert on timing


@dataclass
class Running(DriverHarness):
    """A started mock driver behind the core facade (the kit's harness), with its folder."""

    directory: Path = Path()


def make_running(tmp_path: Path, count: int | None = None) -> Running:
    directory = tmp_path / "devices"
    harness = make_harness(
        MockDriver(MockOptions(directory=directory, count=count)), "example.com/mock", tmp_path / "state"
    )
    running = Running(harness.driver, harness.hooks, harness.ctx, harness.sink, directory)
    running.start()
    return running


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    """The mock driver, started on ``tmp_path/devices`` with ``count = 4``."""
    run = make_running(tmp_path, count=4)
    yield run
    run.hooks.stop()


@pytest.fixture(params=["inotify", "poll"])
def watch_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Hot-plug tests run with inotify and with the watcher's polling fallback."""
    if request.param == "poll":
        monkeypatch.setenv("DEVPLUG_WATCH_POLL", "1")
    else:
        monkeypatch.delenv("DEVPLUG_WATCH_POLL", raising=False)
    return str(request.param)


def ids(devices: list[Device]) -> list[str]:
    return [d.id for d in devices]


def _is_null_node(path: Path) -> bool:
    """A character device numbered as /dev/null (1:3), not a symlink: what the mock makes when it may."""
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)


def test_start_creates_the_folder_and_count_files(tmp_path: Path) -> None:
    run = make_running(tmp_path, count=3)
    try:
        assert sorted(os.listdir(run.directory)) == ["mock0", "mock1", "mock2"]
        assert all((run.directory / n).read_text() == "" for n in ("mock0", "mock1", "mock2"))
        assert ids(run.list_devices()) == ["mock0", "mock1", "mock2"]
        # describing the devices made their nodes, in a hidden folder that is no device
        assert sorted(os.listdir(run.directory)) == [".dev", "mock0", "mock1", "mock2"]
        assert ids(run.list_devices()) == ["mock0", "mock1", "mock2"]
        assert sorted(os.listdir(run.directory / ".dev")) == ["mock0", "mock1", "mock2"]
        assert all(_is_null_node(run.directory / ".dev" / n) for n in ("mock0", "mock1", "mock2"))
    finally:
        run.hooks.stop()


def test_count_keeps_existing_files(tmp_path: Path) -> None:
    directory = tmp_path / "devices"
    directory.mkdir()
    (directory / "mock1").write_text("unhealthy\n")
    (directory / "extra").write_text("")
    run = make_running(tmp_path, count=2)
    try:
        assert (directory / "mock1").read_text() == "unhealthy\n"
        devices = {d.id: d for d in run.list_devices()}
        assert set(devices) == {"mock0", "mock1", "extra"}
        assert devices["mock1"].health is Health.UNHEALTHY
    finally:
        run.hooks.stop()


def test_without_count_no_file_is_created(tmp_path: Path) -> None:
    run = make_running(tmp_path)
    try:
        assert run.directory.is_dir()
        assert run.list_devices() == []
        assert os.listdir(run.directory) == []
    finally:
        run.hooks.stop()


def test_dotfiles_and_non_files_are_not_devices(running: Running) -> None:
    (running.directory / ".hidden").write_text("")
    (running.directory / "subdir").mkdir()
    (running.directory / "link").symlink_to(running.directory / "mock0")
    (running.directory / "has space").write_text("")
    assert ids(running.list_devices()) == ["mock0", "mock1", "mock2", "mock3"]


def test_natural_order(running: Running) -> None:
    for name in ("mock10", "mock2b", "gpu1"):
        (running.directory / name).write_text("")
    assert ids(running.list_devices()) == ["gpu1", "mock0", "mock1", "mock2", "mock2b", "mock3", "mock10"]


def test_unhealthy_and_numa_lines(running: Running) -> None:
    (running.directory / "mock0").write_text("unhealthy\n")
    (running.directory / "mock1").write_text("  numa=1  \n")
    (running.directory / "mock2").write_text("numa=0,1\nunhealthy\n")
    devices = {d.id: d for d in running.list_devices()}
    described = running.driver.describe
    assert devices["mock0"] == Device("mock0", Health.UNHEALTHY, allocation=described("mock0"))
    assert devices["mock1"] == Device("mock1", Health.HEALTHY, Topology((1,)), allocation=described("mock1"))
    assert devices["mock2"] == Device("mock2", Health.UNHEALTHY, Topology((0, 1)), allocation=described("mock2"))
    assert devices["mock3"] == Device("mock3", allocation=described("mock3"))


def test_unknown_lines_are_logged_with_the_file_name(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    (running.directory / "mock2").write_text("sparkly\n")
    caplog.set_level(logging.WARNING)
    running.list_devices()
    messages = [r.getMessage() for r in caplog.records]
    assert any(str(running.directory / "mock2") in m and "sparkly" in m for m in messages), messages
    # The resource name comes from the context's logger.
    assert any("example.com/mock" in m for m in messages)


def test_check_health_reports_only_differences(running: Running) -> None:
    devices = running.list_devices()
    assert running.hooks.check_health(devices) == {}
    (running.directory / "mock1").write_text("unhealthy\n")
    assert running.hooks.check_health(devices) == {"mock1": Health.UNHEALTHY}
    # The engine now knows mock1 is unhealthy; the file heals.
    known = [d.with_health(Health.UNHEALTHY) if d.id == "mock1" else d for d in devices]
    assert running.hooks.check_health(known) == {}
    (running.directory / "mock1").write_text("")
    assert running.hooks.check_health(known) == {"mock1": Health.HEALTHY}


def test_check_health_of_a_vanished_file(running: Running) -> None:
    devices = running.list_devices()
    (running.directory / "mock3").unlink()
    assert running.hooks.check_health(devices) == {"mock3": Health.UNHEALTHY}


def test_list_devices_of_a_deleted_folder_is_empty(running: Running) -> None:
    shutil.rmtree(running.directory)
    assert running.list_devices() == []


# --- hot-plug -----------------------------------------------------------------


@pytest.fixture
def hot(tmp_path: Path, watch_mode: str) -> Iterator[Running]:
    """A started driver with two devices, listed once, on inotify and on the polling fallback."""
    run = make_running(tmp_path, count=2)
    run.list_devices()
    yield run
    run.hooks.stop()


def test_hotplug_add_is_pushed(hot: Running) -> None:
    (hot.directory / "mock7").write_text("numa=1\n")
    expected = Device("mock7", topology=Topology((1,)), allocation=hot.driver.describe("mock7"))
    assert hot.sink.wait_for(lambda t: t.get("mock7") == expected)
    pushes = [p for p in hot.sink.pushes if p.kind == "update"]
    assert pushes
    # Only the new device is sent, never the whole list.
    assert all(d.id == "mock7" for p in pushes for d in p.devices)


def test_hotplug_remove_is_pushed(hot: Running) -> None:
    (hot.directory / "mock1").unlink()
    assert hot.sink.wait_for(lambda t: set(t) == {"mock0"})
    assert any(p.kind == "update" and p.removed == ("mock1",) for p in hot.sink.pushes)


def test_hotplug_edit_is_pushed(hot: Running) -> None:
    (hot.directory / "mock0").write_text("unhealthy\n")
    assert hot.sink.wait_for(lambda t: t["mock0"].health is Health.UNHEALTHY)
    (hot.directory / "mock0").write_text("")
    assert hot.sink.wait_for(lambda t: t["mock0"].health is Health.HEALTHY)


def test_hotplug_rename_removes_and_adds(hot: Running) -> None:
    (hot.directory / "mock1").rename(hot.directory / "mock9")
    assert hot.sink.wait_for(lambda t: set(t) == {"mock0", "mock9"})


def test_dotfiles_and_directive_only_edits_push_nothing(hot: Running) -> None:
    (hot.directory / ".scratch").write_text("")
    (hot.directory / "mock0").write_text("fail=allocate\n")  # the device itself is unchanged
    (hot.directory / "mock5").write_text("")  # a marker: pushed after the edits above were handled
    assert hot.sink.wait_for(lambda t: "mock5" in t)
    assert [d.id for p in hot.sink.pushes for d in p.devices] == ["mock5"]
    assert not any(p.removed for p in hot.sink.pushes)


def _ignore_vanished(function: object, path: str, exc_info: object) -> None:
    """rmtree's error handler: a file the driver removed meanwhile (a device's node, as its file went) is fine."""
    error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if not isinstance(error, FileNotFoundError):
        raise error  # type: ignore[misc]


def test_folder_recreated_pushes_the_whole_list(hot: Running, watch_mode: str) -> None:
    shutil.rmtree(hot.directory, onerror=_ignore_vanished)  # the driver drops nodes of the files it sees go
    hot.directory.mkdir()
    (hot.directory / "gpu0").write_text("")
    assert hot.sink.wait_for(lambda t: set(t) == {"gpu0"})
    if watch_mode == "inotify":  # polling may see only the files that changed between two looks
        assert any(p.kind == "replace" for p in hot.sink.pushes)
    assert _is_null_node(hot.directory / ".dev" / "gpu0")  # the new folder got the new device's node


def test_stop_ends_hot_plug(hot: Running) -> None:
    watcher = hot.driver._watcher
    assert watcher is not None
    thread = watcher._thread
    hot.hooks.stop()
    assert thread is not None
    assert not thread.is_alive()
    assert hot.driver._watcher is None


# --- allocation and the call log -------------------------------------------------


def test_every_hook_is_implemented(running: Running) -> None:
    assert running.hooks.implemented() == list(HOOK_NAMES)  # every hook of the contract, in order


def test_allocate(running: Running) -> None:
    result = running.hooks.allocate(["mock1", "mock3"])
    assert result == ContainerAllocation(envs={"MOCK_DEVICES": "mock1,mock3"})  # nodes and mounts: described


def test_devices_describe_their_node_and_mount(running: Running) -> None:
    d = running.directory
    described = {dev.id: dev.allocation for dev in running.list_devices()}
    assert described["mock1"] == ContainerAllocation(
        devices=(DeviceSpec("/dev/mock/mock1", str(d / ".dev" / "mock1"), "rw"),),
        mounts=(Mount("/var/run/mock/mock1", str(d / "mock1"), read_only=True),),
    )
    assert described["mock3"] == ContainerAllocation(
        devices=(DeviceSpec("/dev/mock/mock3", str(d / ".dev" / "mock3"), "rw"),),
        mounts=(Mount("/var/run/mock/mock3", str(d / "mock3"), read_only=True),),
    )
    assert _is_null_node(d / ".dev" / "mock1")
    assert _is_null_node(d / ".dev" / "mock3")


def test_relative_directory_gives_absolute_host_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "state").mkdir()
    hooks = (
        make_harness(MockDriver(MockOptions(directory=Path("rel"), count=1)), "example.com/mock", tmp_path / "state")
        .start()
        .hooks
    )
    try:
        (device,) = hooks.list_devices()
    finally:
        hooks.stop()
    assert device.allocation is not None
    assert device.allocation.devices[0].host_path == str(tmp_path / "rel" / ".dev" / "mock0")
    assert device.allocation.mounts[0].host_path == str(tmp_path / "rel" / "mock0")


def test_preferred_allocation_defers_to_numa_packing(running: Running) -> None:
    (running.directory / "mock0").write_text("numa=0\n")
    (running.directory / "mock1").write_text("numa=1\n")
    (running.directory / "mock2").write_text("numa=0\n")
    (running.directory / "mock3").write_text("numa=1\n")
    available = running.list_devices()
    assert running.driver.preferred_allocation(available, [], 2) is None
    # The core default then packs on one NUMA node, following the must-include device.
    assert sorted(running.hooks.preferred_allocation(available, ["mock1"], 2)) == ["mock1", "mock3"]


def test_calls_log_records_every_hook(running: Running) -> None:
    available = running.list_devices()
    before = time.time()
    running.hooks.preferred_allocation(available, ["mock0"], 2)
    running.hooks.allocate(["mock0", "mock1"])
    running.hooks.pre_start(["mock0", "mock1"])
    running.hooks.post_stop(["mock0", "mock1"])
    running.hooks.deallocate(["mock0", "mock1"])
    running.list_devices()
    running.hooks.check_health(available)
    calls = read_calls(running.directory)
    assert [c["hook"] for c in calls] == [
        "preferred_allocation",
        "allocate",
        "pre_start",
        "post_stop",
        "deallocate",
    ]
    assert calls[0]["device_ids"] == ["mock0", "mock1", "mock2", "mock3"]
    assert calls[0]["must_include"] == ["mock0"]
    assert calls[0]["size"] == 2
    assert all(c["device_ids"] == ["mock0", "mock1"] for c in calls[1:])
    assert all(before <= c["time"] <= time.time() for c in calls)
    assert [c["time"] for c in calls] == sorted(c["time"] for c in calls)
    assert not any("error" in c for c in calls)
    # The log is a dotfile in the folder: never a device.
    assert (running.directory / CALLS_FILE).is_file()
    assert ids(running.list_devices()) == ["mock0", "mock1", "mock2", "mock3"]


def test_read_calls_without_a_log(tmp_path: Path) -> None:
    assert read_calls(tmp_path) == []


def test_calls_log_is_whole_lines_under_concurrency(running: Running) -> None:
    def many() -> None:
        for i in range(50):
            running.hooks.pre_start([f"mock{i % 4}"])

    threads = [threading.Thread(target=many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    raw = (running.directory / CALLS_FILE).read_text().splitlines()
    assert len(raw) == 400
    assert all(json.loads(line)["hook"] == "pre_start" for line in raw)


def call_hook(hooks: DriverHooks, hook: str, device_ids: list[str]) -> object:
    """Call one of the hooks that take device IDs through the facade."""
    if hook == "preferred_allocation":
        return hooks.preferred_allocation([Device(i) for i in device_ids], [], 1)
    return getattr(hooks, hook)(device_ids)


@pytest.mark.parametrize("hook", DIRECTIVE_HOOKS)
def test_fail_directive(running: Running, hook: str) -> None:
    (running.directory / "mock2").write_text(f"fail=post_stop,{hook}\n")
    with pytest.raises(DriverError, match=rf"{hook} failed for device mock2"):
        call_hook(running.hooks, hook, ["mock1", "mock2"])
    [entry] = read_calls(running.directory)
    assert entry["hook"] == hook
    assert entry["device_ids"] == ["mock1", "mock2"]
    assert f"{hook} failed for device mock2" in entry["error"]
    # Devices without the directive are unaffected.
    call_hook(running.hooks, hook, ["mock1", "mock3"])
    last = read_calls(running.directory)[-1]
    assert last["hook"] == hook
    assert "error" not in last


def test_fail_directive_of_another_hook_does_nothing(running: Running) -> None:
    (running.directory / "mock0").write_text("fail=deallocate\n")
    running.hooks.allocate(["mock0"])
    with pytest.raises(DriverError):
        running.hooks.deallocate(["mock0"])


def test_delay_directive_holds_the_hook(running: Running) -> None:
    (running.directory / "mock1").write_text("delay=pre_start:30\n")
    worker = threading.Thread(target=running.hooks.pre_start, args=(["mock1"],))
    worker.start()
    worker.join(0.5)  # a bounded look, not a synchronisation: the hook must still be waiting after it
    assert worker.is_alive()
    assert read_calls(running.directory) == []  # the call is recorded only once it is done
    # stop() cuts the delay short, so a hung hook never holds the daemon's shutdown.
    running.hooks.stop()
    worker.join(WAIT)
    assert not worker.is_alive()
    assert [c["hook"] for c in read_calls(running.directory)] == ["pre_start"]


def test_delay_directive_waits_at_least_its_seconds(running: Running) -> None:
    (running.directory / "mock0").write_text("delay=allocate:0.2\n")
    (running.directory / "mock1").write_text("delay=allocate:0.3\n")
    began = time.monotonic()
    running.hooks.allocate(["mock0", "mock1"])
    # A lower bound only (a wait never returns early): the longest delay of the devices applies.
    assert time.monotonic() - began >= 0.3


def test_delay_directive_applies_to_its_hook_only(running: Running) -> None:
    (running.directory / "mock1").write_text("delay=deallocate:30\n")
    running.hooks.allocate(["mock1"])  # would hang for 30 s if the delay applied
    assert read_calls(running.directory)[-1]["hook"] == "allocate"


def test_inline_hooks_declare_nonblocking_and_ignore_delays(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "devices"
    driver = MockDriver(MockOptions(directory=directory, count=2, inline_hooks=True))
    assert driver.nonblocking_hooks  # what the engine reads to run the hooks on its event loop
    assert not MockDriver(MockOptions(directory=directory)).nonblocking_hooks
    hooks = make_harness(driver, "example.com/mock", tmp_path / "state").start().hooks
    try:
        (directory / "mock1").write_text("delay=allocate:30\n")
        with caplog.at_level(logging.WARNING):
            hooks.allocate(["mock1"])  # would stall the event loop for 30 s if the delay applied
        assert read_calls(directory)[-1]["hook"] == "allocate"
        assert "delay=allocate:30 ignored" in caplog.text
    finally:
        hooks.stop()
