"""The idxd-like example driver, tested with the kit only: its machine is the /sys/bus/dsa model (sysfs_bus), its
hooks called as the engine calls them (driver_harness), waits by poll_until."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from devplug import ConfigError, ContainerAllocation, DeviceSpec, DriverError, Health, HealthReport
from devplug.options import parse_options
from devplug.testing.bussysfs import SysBusModel
from devplug.testing.harness import DriverHarness
from devplug.testing.waiting import poll_until
from idxd_example import IdxdDriver

Harness = Callable[..., DriverHarness]


@pytest.fixture
def dsa(sysfs_bus: Callable[..., SysBusModel]) -> SysBusModel:
    """A DSA device with two user queues, one kernel queue (held by dmaengine), and the user driver loaded;
    the queues are not bound yet (the admin's accel-config left them disabled)."""
    model = sysfs_bus("dsa")
    model.set_autoprobe(False)
    model.add_device("dsa0", {"state": "enabled"})
    for name, kind in (("wq0.0", "user"), ("wq0.1", "user"), ("wq0.2", "kernel")):
        model.add_device(name, {"type": kind, "mode": "dedicated"}, parent="pci0000:00/0000:6a:01.0/dsa0")
    model.load_driver("idxd", ["dsa*"])
    model.load_driver("dmaengine", ["wq*"])
    model.load_driver("user", ["wq*"], node="dsa/{name}")
    model.write_text(model.sysfs_root / "bus/dsa/drivers/dmaengine/bind", "wq0.2")
    return model


def serve(dsa: SysBusModel, driver_harness: Harness, **options: object) -> DriverHarness:
    opts = IdxdDriver.Options(sysfs_root=dsa.sysfs_root, dev_root=dsa.dev_root, **options)  # type: ignore[arg-type]
    harness = driver_harness(IdxdDriver(opts, access=dsa)).start()
    harness.list_devices()
    return harness


def test_user_queues_are_bound_to_the_user_driver_and_advertised(dsa: SysBusModel, driver_harness: Harness) -> None:
    harness = serve(dsa, driver_harness)
    assert harness.ids() == ["wq0.0", "wq0.1"]  # the kernel queue is not ours
    assert [dsa.driver_of(q) for q in ("wq0.0", "wq0.1", "wq0.2")] == ["user", "user", "dmaengine"]
    assert all(d.health is Health.HEALTHY for d in harness.list_devices())


def test_a_container_gets_the_queues_node(dsa: SysBusModel, driver_harness: Harness) -> None:
    harness = serve(dsa, driver_harness)
    assert harness.hooks.allocate(["wq0.1"]) == ContainerAllocation(
        devices=(DeviceSpec("/dev/dsa/wq0.1", "/dev/dsa/wq0.1", "rw"),), envs={"DSA_WQS": "wq0.1"}
    )


def test_a_release_rebinds_the_queue(dsa: SysBusModel, driver_harness: Harness) -> None:
    harness = serve(dsa, driver_harness)
    before = len(dsa.writes())
    harness.release(["wq0.0"])
    assert dsa.writes()[before:] == [("bus/dsa/drivers/user/unbind", "wq0.0"), ("bus/dsa/drivers/user/bind", "wq0.0")]
    assert dsa.driver_of("wq0.0") == "user"


def test_a_refused_reset_keeps_the_queue_out_until_one_succeeds(dsa: SysBusModel, driver_harness: Harness) -> None:
    harness = serve(dsa, driver_harness, rescan_interval=0.05)
    dsa.set_busy("wq0.0")
    with pytest.raises(DriverError, match=r"wq0\.0: the queue was not reset, it stays out of service"):
        harness.release(["wq0.0"])
    poll_until(lambda: harness.sink.table["wq0.0"].health is Health.UNHEALTHY, "wq0.0 pushed unhealthy")
    assert "cannot unbind it from user" in (harness.sink.table["wq0.0"].reason or "")
    assert harness.sink.table["wq0.1"].health is Health.HEALTHY
    dsa.set_busy("wq0.0", False)
    harness.release(["wq0.0"], retry=True)
    poll_until(lambda: harness.sink.table["wq0.0"].health is Health.HEALTHY, "wq0.0 healthy after its reset")


def test_a_queue_the_user_driver_refuses_is_unhealthy_with_the_kernels_reason(
    dsa: SysBusModel, driver_harness: Harness
) -> None:
    dsa.fail_probe("user", "wq0.1", "ENXIO")
    harness = serve(dsa, driver_harness)
    reports = harness.hooks.check_health(harness.list_devices())
    assert reports["wq0.0"] == HealthReport(Health.HEALTHY)
    assert isinstance(reports["wq0.1"], HealthReport) and reports["wq0.1"].health is Health.UNHEALTHY
    assert "wq0.1: cannot bind it to user" in (reports["wq0.1"].reason or "")
    dsa.fail_probe("user", "wq0.1", None)
    assert {d.id: d.health for d in harness.list_devices()}["wq0.1"] is Health.HEALTHY  # tried again


def test_a_removed_queue_goes_and_needs_no_reset(dsa: SysBusModel, driver_harness: Harness) -> None:
    harness = serve(dsa, driver_harness)
    dsa.remove_device("wq0.0")
    harness.release(["wq0.0"], retry=True)
    assert harness.ids() == ["wq0.1"]


@pytest.mark.parametrize(("options", "key"), [({"sysfs_root": "/proc/sys"}, "sysfs_root"), ({"bus": "a/b"}, "bus")])
def test_bad_options_are_refused_naming_the_key(options: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_options(IdxdDriver.Options, options, "resources.idxd.options")
