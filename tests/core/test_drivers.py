"""Driver discovery through entry points, and the typed facade over a resource's plugin manager."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from devplug import ContainerAllocation, Device, DriverError, Topology, hookimpl
from devplug.drivers import DriverHooks, driver_hook_names, entry_point_group, installed_drivers, load_driver_class
from devplug.errors import DriverLoadError, DriverNotFoundError

Make = Callable[[str, str, str], Path]


class Minimal:
    @hookimpl
    def list_devices(self) -> list[Device]:
        return [Device("a"), Device("b", topology=Topology((1,)))]


class Contributor:
    def __init__(self, envs: dict[str, str]) -> None:
        self.envs = envs

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        return ContainerAllocation(envs=self.envs)


def test_mock_is_found_through_its_entry_point() -> None:
    drivers = installed_drivers()
    assert drivers["mock"].distribution == "devplug-mock"
    assert load_driver_class("mock").__name__ == "MockDriver"


def test_unknown_driver_lists_installed_ones_and_a_hint() -> None:
    with pytest.raises(DriverNotFoundError) as info:
        load_driver_class("fgpa", where="c.toml: resources.x.driver")
    message = str(info.value)
    assert "no driver named 'fgpa'" in message and "mock" in message and "pip install devplug-fgpa" in message


def test_disabled_drivers_are_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVPLUG_DISABLE_DRIVERS", "mock, other")
    assert "mock" not in installed_drivers()
    with pytest.raises(DriverNotFoundError):
        load_driver_class("mock")


def test_broken_driver_names_its_distribution(fake_distribution: Make) -> None:
    fake_distribution(
        "devplug-test-broken",
        "import not_a_module_anywhere\n",
        "[devplug.drivers]\nbroken = devplug_test_broken:Driver\n",
    )
    with pytest.raises(DriverLoadError) as info:
        load_driver_class("broken")
    assert "devplug-test-broken 1.2.3" in str(info.value) and "not_a_module_anywhere" in str(info.value)


def test_driver_without_list_devices_is_refused(fake_distribution: Make) -> None:
    fake_distribution(
        "devplug-test-empty",
        'class Driver:\n    hook_contract = "1.0"\n',
        "[devplug.drivers]\nempty = devplug_test_empty:Driver\n",
    )
    with pytest.raises(DriverLoadError, match="does not implement the required hook list_devices"):
        load_driver_class("empty")


def test_misspelt_hook_fails_loudly() -> None:
    class Typo(Minimal):
        @hookimpl
        def alocate(self, device_ids: Sequence[str]) -> None:
            return None

    with pytest.raises(DriverLoadError, match="alocate"):
        DriverHooks("example.com/x", Typo())


def test_implements_ignores_core_defaults() -> None:
    hooks = DriverHooks("example.com/x", Minimal())
    assert hooks.implemented() == ["list_devices"]
    assert not hooks.implements("preferred_allocation")
    # ...yet the core default answers preferred allocation (NUMA packing).
    devices = hooks.list_devices()
    assert hooks.preferred_allocation(devices, ["b"], 1) == ["b"]
    assert driver_hook_names(Minimal) == ["list_devices"]


def test_allocate_merges_every_contribution_and_refuses_conflicts() -> None:
    hooks = DriverHooks("example.com/x", Minimal(), [Contributor({"A": "1"}), Contributor({"B": "2"})])
    assert dict(hooks.allocate(["a"]).envs) == {"A": "1", "B": "2"}
    clash = DriverHooks("example.com/x", Minimal(), [Contributor({"A": "1"}), Contributor({"A": "2"})])
    with pytest.raises(DriverError, match="conflict"):
        clash.allocate(["a"])


def test_list_devices_results_are_checked() -> None:
    class Duplicate:
        @hookimpl
        def list_devices(self) -> list[Device]:
            return [Device("a"), Device("a")]

    class Wrong:
        @hookimpl
        def list_devices(self) -> list[str]:
            return ["a"]

    with pytest.raises(DriverError, match="device ID 'a' twice"):
        DriverHooks("example.com/x", Duplicate()).list_devices()
    with pytest.raises(DriverError, match=r"not a devplug\.Device"):
        DriverHooks("example.com/x", Wrong()).list_devices()


def test_each_resource_has_its_own_plugin_manager() -> None:
    calls: list[str] = []

    class Recorder(Minimal):
        def __init__(self, name: str) -> None:
            self.name = name

        @hookimpl
        def pre_start(self, device_ids: Sequence[str]) -> None:
            calls.append(self.name)

    one = DriverHooks("example.com/one", Recorder("one"))
    DriverHooks("example.com/two", Recorder("two"))
    one.pre_start(["a"])
    assert calls == ["one"]


class ReplicaAware(Minimal):
    """An allocate naming both arguments, recording what it got."""

    def __init__(self) -> None:
        self.got: list[tuple[tuple[str, ...], object]] = []

    @hookimpl
    def allocate(self, device_ids: Sequence[str], replicas: object) -> ContainerAllocation | None:
        self.got.append((tuple(device_ids), replicas))
        if "none" in device_ids:
            return None
        if "bad" in device_ids:
            raise ValueError("bad device")
        return ContainerAllocation(envs={"IDS": ",".join(device_ids)})


@pytest.mark.parametrize("tracing", [False, True], ids=["plain", "traced"])
def test_allocate_answers_alike_traced_or_not(tracing: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver's allocate gets the same arguments and gives the same answers, empty answers, refusals and
    exceptions with DEVPLUG_TRACE_HOOKS as without; plugins registered later are called too."""
    if tracing:
        monkeypatch.setenv("DEVPLUG_TRACE_HOOKS", "1")
    driver = ReplicaAware()
    hooks = DriverHooks("example.com/x", driver)
    assert dict(hooks.allocate(["a", "b"]).envs) == {"IDS": "a,b"}
    ids, replicas = driver.got[-1]
    assert ids == ("a", "b") and dict(replicas.by_device) == {"a": ("a",), "b": ("b",)}  # type: ignore[attr-defined]
    assert hooks.allocate(["none"]) == ContainerAllocation()
    with pytest.raises(ValueError, match="bad device"):
        hooks.allocate(["bad"])
    only_ids = DriverHooks("example.com/x", Minimal(), [Contributor({"A": "1"})])  # names device_ids alone
    assert dict(only_ids.allocate(["a"]).envs) == {"A": "1"}
    only_ids.pm.register(Contributor({"LATE": "1"}))  # a plugin registered later is called too
    assert dict(only_ids.allocate(["a"]).envs) == {"A": "1", "LATE": "1"}

    class Wrong(Minimal):
        @hookimpl
        def allocate(self, device_ids: Sequence[str]) -> str:
            return "not an allocation"

    with pytest.raises(DriverError, match="must return a ContainerAllocation"):
        DriverHooks("example.com/x", Wrong()).allocate(["a"])


def test_entry_point_groups_read_as_importlib_metadata_reads_them() -> None:
    """Every installed distribution's entry_points.txt, every group: the same (name, value) pairs as the standard
    library's reader, which discovery avoids importing."""
    import importlib.metadata

    compared = 0
    for dist in importlib.metadata.distributions():
        text = dist.read_text("entry_points.txt")
        if not text:
            continue
        for group in {ep.group for ep in dist.entry_points}:
            expected = [(ep.name, ep.value) for ep in dist.entry_points if ep.group == group]
            assert entry_point_group(text, group) == expected, f"{dist.metadata['Name']} [{group}]"
            compared += 1
    assert compared >= 6  # the core's console script and the five drivers' groups at least


def test_entry_point_group_reads_comments_and_spacing_and_names_a_bad_line() -> None:
    text = "# a comment\n\n[other]\nx = a:b\n[devplug.drivers]\n; another\n  acme  =  acme_dp.driver:Driver  \n"
    assert entry_point_group(text, "devplug.drivers") == [("acme", "acme_dp.driver:Driver")]
    assert entry_point_group(text, "missing") == []
    with pytest.raises(ValueError, match=r"line 2 .*'acme_dp\.driver:Driver'"):
        entry_point_group("[devplug.drivers]\nacme_dp.driver:Driver\n", "devplug.drivers")
    with pytest.raises(ValueError, match="line 1 "):
        entry_point_group("acme = x:y\n", "devplug.drivers")  # before any section


def test_a_malformed_entry_points_file_is_skipped_with_a_warning(
    fake_distribution: Make, caplog: pytest.LogCaptureFixture
) -> None:
    site = fake_distribution("devplug-test-garbled", "", "[devplug.drivers]\nthis is not an entry point\n")
    assert "mock" in installed_drivers()  # the others are still found
    assert "devplug-test-garbled" not in {d.distribution for d in installed_drivers().values()}
    assert any("entry_points.txt" in r.getMessage() and "line 2" in r.getMessage() for r in caplog.records), site


def test_devplug_drivers_keeps_every_name_it_exported() -> None:
    """Drivers and their tests import these from ``devplug.drivers``: its split into discovery, construction and
    the facade must not break them (a core upgrade never breaks an installed driver)."""
    import devplug.drivers

    before = {  # the public names of devplug/drivers.py before the split, its __all__ first
        "ENTRY_POINT_GROUP", "DriverCapabilities", "DriverHooks", "DriverInfo", "HOOK_NAMES", "driver_hook_names",
        "check_driver_resources", "construct_driver", "driver_names", "installed_drivers", "load_driver_class",
        "DISABLE_ENV", "TRACE_ENV", "EntryPoint", "entry_points", "entry_point_group", "check_device_list",
    }  # fmt: skip
    assert before <= set(devplug.drivers.__all__)
    missing = [name for name in sorted(before) if not hasattr(devplug.drivers, name)]
    assert missing == []
