"""devplug.testing.recording: any driver's hook calls recorded, no code in the driver, the engine calling it as it
calls the driver; and DriverConformance watching a driver that records nothing itself."""

from __future__ import annotations

import re
import subprocess
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from devplug import ContainerAllocation, Device, DriverContext, DriverError, Replicas, hookimpl
from devplug.drivers import DriverHooks, driver_hook_names
from devplug.testing.recorder import read_hook_calls
from devplug.testing.recording import RecordingDriver, recording_driver
from devplug.testing.sink import RecordingSink


class Plain:
    """A driver as a vendor writes it: no recorder; deallocate written before ``replicas`` existed."""

    hook_contract = "1.0"
    nonblocking_hooks = False

    @dataclass(frozen=True)
    class Options:
        count: int = 2

    checked: ClassVar[list[Mapping[str, Any]]] = []

    @classmethod
    def check_resources(cls, options: Mapping[str, Any]) -> None:
        cls.checked.append(dict(options))
        if len(options) > 1:
            raise ValueError("one resource only")

    def __init__(self, options: Options, *, prefix: str = "dev") -> None:
        self.options = options
        self.prefix = prefix
        self.seen: list[tuple[str, Any]] = []

    @hookimpl
    def list_devices(self) -> list[Device]:
        return [Device(f"{self.prefix}{i}") for i in range(self.options.count)]

    @hookimpl
    def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        return None

    @hookimpl
    def allocate(self, device_ids: Sequence[str], replicas: Replicas) -> ContainerAllocation:
        self.seen.append(("allocate", replicas))
        return ContainerAllocation(envs={"DEVS": ",".join(device_ids)})

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool) -> None:
        self.seen.append(("deallocate", retry))
        if "dev1" in device_ids:
            raise DriverError("dev1: erase failed")


def test_every_hook_call_is_recorded_and_the_driver_called_as_the_engine_calls_it(tmp_path: Path) -> None:
    Recorded = recording_driver(Plain, tmp_path / "calls")
    driver = Recorded(Plain.Options(count=2), prefix="dev")
    assert isinstance(driver, RecordingDriver)
    assert isinstance(driver.wrapped, Plain)
    hooks = DriverHooks("example.com/x", driver)
    assert hooks.implemented() == ["list_devices", "preferred_allocation", "allocate", "deallocate"]

    devices = hooks.list_devices()
    assert hooks.preferred_allocation(devices, ["dev1"], 1) == ["dev1"]  # the core's default after the driver's None
    shared = Replicas(by_device={"dev0": ("dev0::0", "dev0::1")}, tenants={"dev0": 1})
    assert hooks.allocate(["dev0"], shared) == ContainerAllocation(envs={"DEVS": "dev0"})
    hooks.deallocate(["dev0"], retry=True)
    with pytest.raises(DriverError, match="dev1: erase failed"):
        hooks.deallocate(["dev1"])

    assert driver.wrapped.seen == [("allocate", shared), ("deallocate", True), ("deallocate", False)]
    calls = read_hook_calls(tmp_path / "calls")
    assert [(c.hook, c.device_ids, c.retry, c.error) for c in calls] == [
        ("list_devices", (), False, None),
        ("preferred_allocation", ("dev0", "dev1"), False, None),
        ("allocate", ("dev0",), False, None),
        ("deallocate", ("dev0",), True, None),
        ("deallocate", ("dev1",), False, "dev1: erase failed"),
    ]
    assert calls[1].extra == {"must_include": ["dev1"], "size": 1}
    assert calls[2].extra == {"replicas": {"dev0": ["dev0::0", "dev0::1"]}, "tenants": {"dev0": 1}}
    started = read_hook_calls(tmp_path / "calls", started=True)
    assert [c.hook for c in started] == [c.hook for c in calls]


def test_retry_is_recorded_for_a_driver_that_does_not_declare_it_and_not_passed_to_it(tmp_path: Path) -> None:
    class Terse(Plain):
        @hookimpl
        def deallocate(self, device_ids: Sequence[str]) -> None:  # type: ignore[override]
            self.seen.append(("deallocate", tuple(device_ids)))

    driver = recording_driver(Terse, tmp_path)(Plain.Options())
    hooks = DriverHooks("example.com/x", driver)
    hooks.deallocate(["dev0"], retry=True)
    hooks.deallocate(["dev0"])
    assert driver.wrapped.seen == [("deallocate", ("dev0",)), ("deallocate", ("dev0",))]
    assert [(c.hook, c.retry) for c in read_hook_calls(tmp_path)] == [("deallocate", True), ("deallocate", False)]
    driver.deallocate(["dev1"])  # called directly, the optional arguments may be left out
    assert read_hook_calls(tmp_path)[-1].device_ids == ("dev1",)


def test_the_stand_in_is_the_driver_for_the_config_and_the_engine(tmp_path: Path) -> None:
    Recorded = recording_driver(Plain, tmp_path)
    assert Recorded.Options is Plain.Options  # type: ignore[attr-defined]
    assert Recorded.hook_contract == "1.0"  # type: ignore[attr-defined]
    assert driver_hook_names(Recorded) == driver_hook_names(Plain)
    Recorded.check_resources({"a": Plain.Options()})  # type: ignore[attr-defined]
    assert Plain.checked[-1] == {"a": Plain.Options()}
    with pytest.raises(ValueError, match="one resource only"):
        Recorded.check_resources({"a": Plain.Options(), "b": Plain.Options()})  # type: ignore[attr-defined]
    driver = Recorded(Plain.Options())
    assert driver.nonblocking_hooks is False  # the engine reads the driver's attributes through the stand-in
    assert driver.prefix == "dev"
    assert "Plain" in repr(driver)


def test_start_and_stop_reach_the_driver_with_its_context(tmp_path: Path) -> None:
    class Started(Plain):
        @hookimpl
        def start(self, ctx: DriverContext) -> None:
            self.ctx = ctx

        @hookimpl
        def stop(self) -> None:
            self.stopped = True

    driver = recording_driver(Started, tmp_path)(Plain.Options())
    ctx = DriverContext("example.com/x", tmp_path, RecordingSink())
    hooks = DriverHooks("example.com/x", driver)
    hooks.start(ctx)
    hooks.stop()
    assert driver.wrapped.ctx is ctx
    assert driver.wrapped.stopped
    assert [c.hook for c in read_hook_calls(tmp_path)] == ["start", "stop"]


PLAIN_DRIVER = '''
from dataclasses import dataclass

from devplug import ContainerAllocation, Device, hookimpl


class Plain:
    """Records nothing itself."""

    hook_contract = "1.0"

    @dataclass(frozen=True)
    class Options:
        count: int = 2

        def __post_init__(self):
            if self.count < 1:
                raise ValueError(f"count: must be at least 1, got {self.count}")

    def __init__(self, options):
        self.options = options

    @hookimpl
    def list_devices(self):
        return [Device(f"plain{i}") for i in range(self.options.count)]

    @hookimpl
    def allocate(self, device_ids):
        return ContainerAllocation(envs={"PLAIN": ",".join(device_ids)})

    @hookimpl
    def deallocate(self, device_ids, retry):
        pass
'''

SUITE = """
from pathlib import Path

from devplug.testing.conformance import DriverConformance


class TestPlain(DriverConformance):
    driver = "plain"
    test_drivers = {"plain": "plain_driver:Plain"}
    python_path = (Path(__file__).parent,)
    records_itself = False
    device_count = 2
    release_hooks = ("deallocate",)
    bad_option_key = "count"

    def options(self, folder):
        return {"count": 2}

    def bad_options(self, folder):
        return {"count": 0}

    def check_allocation(self, device_ids, allocation, folder):
        assert dict(allocation.envs) == {"PLAIN": ",".join(device_ids)}
"""


def test_the_conformance_class_watches_a_driver_that_records_nothing_itself(
    tmp_path: Path, run_pytest: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    (tmp_path / "plain_driver.py").write_text(textwrap.dedent(PLAIN_DRIVER))
    (tmp_path / "test_plain.py").write_text(textwrap.dedent(SUITE))
    done = run_pytest(tmp_path, timeout=600)
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped|failed|error)", out)}
    # advertises, allocates, releases x2, check-config x3; the two slow-release checks need slow_release, the DRA
    # check an apis listing "dra"
    assert counts == {"passed": 7, "skipped": 3}, out[-4000:]
